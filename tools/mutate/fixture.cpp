// The mutation tool's self-test fixture (tools/mutate/mutate.py selftest): every operator must apply
// here, nothing may be mutated inside a comment, a literal or a preprocessor line (the lines marked
// NOT_MUTATED), and each mutant must compile (-fsyntax-only) and restore to these exact bytes.
// Expected mutants, as `operator line-after-mutation`:
// EXPECT: cmp_flip if (a != b) return 1;
// EXPECT: off_by_one for (int i = 0; i <= n; ++i) s += i;
// EXPECT: off_by_one for (int i = 0; i < n - 1; ++i) s += i;
// EXPECT: logic_swap return (a > 0 || b > 0) ? a : b;
// EXPECT: assign_drop ok = check(a);
// EXPECT: assign_drop bits = 4;
// EXPECT: drop_term return a;
// EXPECT: swap_args return pick(b, a);
// EXPECT: negate_cond while (!(a < b)) ++a;
// EXPECT: return_early return {}; int s = 0;
// EXPECT: return_early return; total(a, b);
// EXPECT: const_shift bool check(int x) { return x > 4; }
// EXPECT: const_shift bool check(int x) { return x > 2; }
// EXPECT: const_shift double scaled(double x) { return x * 0.976; }
// EXPECT: self_compare if (a == a) return 1;
// EXPECT: self_compare return x.size() < x.size();
#include <cstddef>  // a < b && c NOT_MUTATED
#define TWICE(x) ((x) + (x) == 2 * (x))  // NOT_MUTATED

namespace fixture {

template <typename T>
struct Box {
  T v[2];
  std::size_t size() const { return 2; }
};

static const char* const kText = "a < b && c || d == e";  // NOT_MUTATED

int pick(int x, int y) { return x - y > 0 ? x : y; }
bool check(int x) { return x > 3; }
double scaled(double x) { return x * 0.975; }
bool shorter(const Box<int>& x, std::size_t n) {
  return x.size() < n;
}

int compare(int a, int b) {
  if (a == b) return 1;
  return (a > 0 && b > 0) ? a : b;
}

int sum(int n) {
  int s = 0;
  for (int i = 0; i < n; ++i) s += i;
  return s;
}

int add(int a, int b) {
  return a + b;
}

int ordered(int a, int b) {
  return pick(a, b);
}

bool all(int a) {
  bool ok = true;
  ok &= check(a);
  unsigned bits = 1;
  bits |= 4;
  return ok && bits != 0;
}

int walk(int a, int b) {
  while (a < b) ++a;
  return a;
}

int total(int a, int b) {
  Box<int> v{{a, b}};
  return static_cast<int>(v.size()) + a;
}

void side(int a, int b) {
  total(a, b);
  const char* s = "x != y /* not a comment */";  // a > b NOT_MUTATED
  char c = '<';  // NOT_MUTATED
  (void)s;
  (void)c;
  (void)kText;
}

}  // namespace fixture
