#pragma once
// The bisection both families' span searches run (checks/ced_checks.cpp, checks/v41/spans.cpp).
#include <cstdint>

namespace ced {

// The smallest K in [1, n] with pred(K), for a predicate false below some K0 and true from it; -1 when
// pred(n) is false (nothing in range holds). About log2(n) + 1 calls.
template <class Pred>
int64_t fewest_true(int64_t n, Pred pred) {
  if (!pred(n)) return -1;
  int64_t lo = 1, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

}  // namespace ced
