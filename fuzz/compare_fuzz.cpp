// Fuzzes the comparison engine (docs/spec.md §8, compare/compare.hpp) with special
// values: NaN, ±Inf, ±0, denormals, DBL_MAX, tiny and huge magnitudes, raw
// 8-byte doubles, and values a few ULPs from the reference's.
//
// The input bytes decode (fuzz/byte_reader.hpp) to a shape, a reference r, a
// tensor t (each element a special value, a raw double, or r's element
// nudged), atol / rtol, a dtype, and two [P, k] selections. Checked:
//  - no metric is NaN where compare.hpp defines a number: rel_l2, nmse,
//    cosine, max_abs_err, max_rel_err, min_passing_atol; KL, top-1, top-5
//    overlap; Jaccard and near-tie gaps; ranges ([0, 1], [-1, 1], >= 0);
//  - symmetry under swapping t and r: max_abs_err, max_ulp, cosine, the NaN
//    and Inf counts (swapped), the mismatch count with rtol = 0, top-1 and
//    top-5 agreement, Jaccard and the differing entries;
//  - min_passing_atol is exact: recomparing with atol = min_passing_atol
//    leaves only the NaN pairs and Inf mismatches failing, and its
//    predecessor fails one more;
//  - a tensor against itself: no error, no mismatch but its NaNs; KL 0 on
//    every row without NaN or +Inf that is not all -Inf; Jaccard 1.
// A violation prints the inputs and traps.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "fuzz/byte_reader.hpp"
#include "model/error.hpp"
#include "compare/compare.hpp"

namespace {

using namespace ced;
using ced::fuzz::ByteReader;

constexpr double kInf = std::numeric_limits<double>::infinity();

// A special value, or an ordinary one, with a random sign.
double special(ByteReader& in) {
  const int64_t which = in.range(0, 17);
  double v = 0;
  switch (which) {
    case 0: v = std::numeric_limits<double>::quiet_NaN(); break;
    case 1: v = kInf; break;
    case 2: v = 0.0; break;
    case 3: v = std::numeric_limits<double>::denorm_min(); break;
    case 4: v = DBL_MIN * (1 - DBL_EPSILON); break;  // the largest denormal
    case 5: v = DBL_MAX; break;
    case 6: v = DBL_MIN; break;
    case 7: v = 1e-300; break;
    case 8: v = 1e300; break;
    case 9: v = 1.0; break;
    case 10: v = 1.0 + DBL_EPSILON; break;
    case 11: v = 0.5; break;
    case 12: v = double(float(0.1)); break;  // an f32 value
    case 13: v = std::ldexp(double(in.range(1, 255)), int(in.range(-1074, 1023))); break;  // any magnitude
    case 14: v = double(in.range(-128, 127)); break;
    case 15: v = std::bit_cast<double>(uint64_t(0x7FF0000000000001ull) | in.u64(2));  break;  // a signalling-ish NaN payload
    default: return in.raw_double();  // 16, 17: any bits
  }
  return in.flag() ? -v : v;
}

// t's element: mostly near r's, so the metrics see realistic errors too.
double near(ByteReader& in, double r) {
  switch (in.range(0, 5)) {
    case 0: return r;
    case 1: {  // a few ULPs away
      double v = r;
      for (int64_t k = in.range(-3, 3); k != 0; k += k > 0 ? -1 : 1) v = std::nextafter(v, k > 0 ? kInf : -kInf);
      return v;
    }
    case 2: return r * (1 + std::ldexp(1.0, int(in.range(-60, 0))));
    case 3: return -r;
    default: return special(in);
  }
}

std::optional<double> tolerance(ByteReader& in) {
  switch (in.range(0, 9)) {
    case 0: return std::nullopt;
    case 1: return 0.0;
    case 2: return 1e-300;
    case 3: return 1e-12;
    case 4: return 1e-6;
    case 5: return 1.0;
    case 6: return DBL_MAX;
    case 7: return kInf;
    case 8: return std::numeric_limits<double>::denorm_min();
    default: return in.raw_double();  // may be NaN or negative: an InputError
  }
}

int64_t entry(ByteReader& in) {
  switch (in.range(0, 7)) {
    case 0: return -1;
    case 1: return -2 - in.range(0, 3);
    case 2: return std::numeric_limits<int64_t>::max();
    case 3: return std::numeric_limits<int64_t>::min();
    default: return in.range(0, 9);
  }
}

struct Inputs {
  std::vector<int64_t> shape;
  std::vector<double> t, r;
  Thresholds th;
  TensorDtype dtype = TensorDtype::F64;
  std::vector<int64_t> sel_shape;
  std::vector<int64_t> st, sr;
  std::vector<double> score_table;  // 8 scores, indexed by (row, entry)
  std::optional<double> kth;        // the kth score of every row, if given
};

std::string describe(const Inputs& x) {
  auto doubles = [](const std::vector<double>& v) {
    std::string s;
    for (double d : v) s += fmt::format("{}{} ({:016x})", s.empty() ? "" : ", ", d, std::bit_cast<uint64_t>(d));
    return s;
  };
  auto opt = [](const std::optional<double>& v) { return v ? fmt::format("{}", *v) : std::string("absent"); };
  return fmt::format(
      "shape [{}] dtype {} atol {} rtol {} near_tie {}\n t = [{}]\n r = [{}]\nselections [{}]\n t = [{}]\n r = [{}]\n"
      "scores [{}] kth {}",
      fmt::join(x.shape, ", "), dtype_name(x.dtype), opt(x.th.atol), opt(x.th.rtol), opt(x.th.near_tie),
      doubles(x.t), doubles(x.r), fmt::join(x.sel_shape, ", "), fmt::join(x.st, ", "), fmt::join(x.sr, ", "),
      doubles(x.score_table), opt(x.kth));
}

[[noreturn]] void violated(const Inputs& x, const std::string& what) {
  std::fprintf(stderr, "compare_fuzz: PROPERTY VIOLATED: %s\n%s\n", what.c_str(), describe(x).c_str());
  std::fflush(stderr);
  __builtin_trap();
}

// Bitwise, so that a NaN never compares equal by accident and -0 != +0.
bool same(double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); }

void check_metrics(const Inputs& x, const TensorCompare& c, const char* which) {
  auto need = [&](bool ok, const char* what, double v) {
    if (!ok) violated(x, fmt::format("{}: {} ({})", which, what, v));
  };
  need(!std::isnan(c.rel_l2) && c.rel_l2 >= 0, "rel_l2 is NaN or negative", c.rel_l2);
  need(!std::isnan(c.nmse) && c.nmse >= 0, "nmse is NaN or negative", c.nmse);
  need(c.cosine >= -1 && c.cosine <= 1, "cosine is NaN or outside [-1, 1]", c.cosine);
  need(!std::isnan(c.max_abs_err) && c.max_abs_err >= 0, "max_abs_err is NaN or negative", c.max_abs_err);
  need(!std::isnan(c.max_rel_err) && c.max_rel_err >= 0, "max_rel_err is NaN or negative", c.max_rel_err);
  need(!std::isnan(c.min_passing_atol) && c.min_passing_atol >= 0, "min_passing_atol is NaN or negative",
       c.min_passing_atol);
  need(c.mismatches >= c.nan_pairs + c.inf_mismatches, "fewer mismatches than NaN pairs and Inf mismatches",
       double(c.mismatches));
  need(c.finite_pairs + c.nan_pairs + c.inf_mismatches <= c.n, "pair classes exceed the element count",
       double(c.finite_pairs));
  (void)summary(c);
  (void)to_json(c);
}

TensorCompare compare(const Inputs& x, const std::vector<double>& t, const std::vector<double>& r,
                      const Thresholds& th) {
  return compare_tensors(t, r, x.shape, th, x.dtype);
}

void check_tensors(const Inputs& x) {
  const TensorCompare c = compare(x, x.t, x.r, x.th), s = compare(x, x.r, x.t, x.th);
  check_metrics(x, c, "t vs r");
  check_metrics(x, s, "r vs t");

  // Symmetric metrics.
  auto sym = [&](bool ok, const std::string& what) {
    if (!ok) violated(x, "not symmetric under swapping t and r: " + what);
  };
  sym(same(c.max_abs_err, s.max_abs_err), fmt::format("max_abs_err {} vs {}", c.max_abs_err, s.max_abs_err));
  sym(c.max_ulp == s.max_ulp, fmt::format("max_ulp {} vs {}", c.max_ulp, s.max_ulp));
  sym(same(c.cosine, s.cosine), fmt::format("cosine {} vs {}", c.cosine, s.cosine));
  sym(c.t_nonfinite.nan == s.r_nonfinite.nan && c.r_nonfinite.nan == s.t_nonfinite.nan &&
          c.t_nonfinite.inf == s.r_nonfinite.inf && c.r_nonfinite.inf == s.t_nonfinite.inf &&
          c.t_nonfinite.first_nan == s.r_nonfinite.first_nan && c.t_nonfinite.first_inf == s.r_nonfinite.first_inf,
      "NaN / Inf counts");
  sym(c.nan_pairs == s.nan_pairs && c.inf_mismatches == s.inf_mismatches && c.finite_pairs == s.finite_pairs,
      fmt::format("pair classes (NaN {} vs {}, Inf {} vs {}, finite {} vs {})", c.nan_pairs, s.nan_pairs,
                  c.inf_mismatches, s.inf_mismatches, c.finite_pairs, s.finite_pairs));
  Thresholds no_rtol = x.th;
  no_rtol.rtol = 0.0;
  const TensorCompare c0 = compare(x, x.t, x.r, no_rtol), s0 = compare(x, x.r, x.t, no_rtol);
  sym(c0.mismatches == s0.mismatches, fmt::format("mismatches with rtol = 0: {} vs {}", c0.mismatches, s0.mismatches));
  sym(same(c0.min_passing_atol, s0.min_passing_atol),
      fmt::format("min_passing_atol with rtol = 0: {} vs {}", c0.min_passing_atol, s0.min_passing_atol));

  // min_passing_atol passes, its predecessor fails (compare.hpp).
  const int64_t always = c.nan_pairs + c.inf_mismatches;  // fail at any atol
  Thresholds at = x.th;
  at.atol = c.min_passing_atol;
  const TensorCompare pass = compare(x, x.t, x.r, at);
  if (pass.mismatches != always)
    violated(x, fmt::format("atol = min_passing_atol = {} leaves {} mismatches, {} NaN pairs / Inf mismatches expected",
                            c.min_passing_atol, pass.mismatches, always));
  if (c.min_passing_atol > 0 && std::isfinite(c.min_passing_atol)) {
    at.atol = std::nextafter(c.min_passing_atol, 0.0);
    const TensorCompare fail = compare(x, x.t, x.r, at);
    if (fail.mismatches <= always)
      violated(x, fmt::format("atol just below min_passing_atol = {} still passes every non-NaN pair",
                              c.min_passing_atol));
  }

  // Against itself: no error.
  const TensorCompare self = compare(x, x.r, x.r, x.th);
  if (self.max_abs_err != 0 || self.max_rel_err != 0 || self.rel_l2 != 0 || self.nmse != 0 || self.max_ulp != 0 ||
      self.min_passing_atol != 0 || self.mismatches != self.nan_pairs || self.inf_mismatches != 0)
    violated(x, fmt::format("r against itself: max_abs_err {} max_rel_err {} rel_l2 {} nmse {} max_ulp {} "
                            "min_passing_atol {} mismatches {} (NaN pairs {})",
                            self.max_abs_err, self.max_rel_err, self.rel_l2, self.nmse, self.max_ulp,
                            self.min_passing_atol, self.mismatches, self.nan_pairs));
}

void check_logits(const Inputs& x) {
  // [P, V]: the tensor's shape when it has rank 2, else one row.
  const std::vector<int64_t> shape =
      x.shape.size() == 2 ? x.shape : std::vector<int64_t>{1, static_cast<int64_t>(x.t.size())};
  const LogitsCompare c = compare_logits(x.t, x.r, shape), s = compare_logits(x.r, x.t, shape);
  for (const LogitsCompare* l : {&c, &s}) {
    for (double kl : l->kl)
      if (!(kl >= 0)) violated(x, fmt::format("logits: a row's KL is {}", kl));
    if (!(l->mean_kl >= 0) || !(l->max_kl >= 0)) violated(x, fmt::format("logits: mean_kl {} max_kl {}", l->mean_kl, l->max_kl));
    for (double f : {l->top1_fraction, l->topk_overlap, l->min_topk_overlap})
      if (!(f >= 0 && f <= 1)) violated(x, fmt::format("logits: an agreement fraction is {}", f));
    (void)summary(*l);
    (void)to_json(*l);
  }
  if (c.top1_agree != s.top1_agree || !same(c.topk_overlap, s.topk_overlap) ||
      !same(c.min_topk_overlap, s.min_topk_overlap))
    violated(x, fmt::format("logits: top-1 / top-5 agreement not symmetric ({} vs {}, {} vs {})", c.top1_agree,
                            s.top1_agree, c.topk_overlap, s.topk_overlap));
  const LogitsCompare self = compare_logits(x.r, x.r, shape);
  if (self.top1_agree != self.rows || self.topk_overlap != 1)
    violated(x, "logits: r against itself disagrees on top-1 or top-5");
  const size_t V = size_t(shape[1]);
  for (size_t p = 0; p < size_t(shape[0]); ++p) {
    bool defined = false, bad = false;
    for (size_t j = 0; j < V; ++j) {
      const double v = x.r[p * V + j];
      bad |= std::isnan(v) || v == kInf;
      defined |= v != -kInf;
    }
    if (defined && !bad && V > 0 && self.kl[p] != 0)
      violated(x, fmt::format("logits: KL of row {} against itself is {}", p, self.kl[p]));
  }
}

void check_selections(const Inputs& x) {
  SelectionScores scores;
  scores.score = [&](int64_t row, int64_t e) {
    return x.score_table[(static_cast<uint64_t>(row) * 31 + static_cast<uint64_t>(e)) % x.score_table.size()];
  };
  if (x.kth) scores.kth_score = [&](int64_t) { return *x.kth; };
  Thresholds th;
  th.near_tie = x.th.atol;  // any tolerance value; invalid ones are InputErrors
  const SelectionCompare c = compare_selections(x.st, x.sr, x.sel_shape, th, &scores);
  const SelectionCompare s = compare_selections(x.sr, x.st, x.sel_shape, th, nullptr);
  for (const SelectionCompare* l : {&c, &s}) {
    for (double j : l->jaccard)
      if (!(j >= 0 && j <= 1)) violated(x, fmt::format("selections: a Jaccard index is {}", j));
    if (!(l->mean_jaccard >= 0 && l->mean_jaccard <= 1) || !(l->min_jaccard >= 0 && l->min_jaccard <= 1))
      violated(x, fmt::format("selections: mean / min Jaccard {} / {}", l->mean_jaccard, l->min_jaccard));
    (void)summary(*l);
    (void)to_json(*l);
  }
  if (c.jaccard != s.jaccard || c.differing != s.differing || c.differing_rows != s.differing_rows ||
      c.invalid_t != s.invalid_r || c.invalid_r != s.invalid_t)
    violated(x, "selections: Jaccard, differing entries or invalid counts not symmetric");
  if (c.near_ties + c.real_disagreements != c.differing)
    violated(x, fmt::format("selections: {} near-ties + {} real disagreements != {} differing", c.near_ties,
                            c.real_disagreements, c.differing));
  if (std::isnan(c.worst_gap) || c.worst_gap < 0) violated(x, fmt::format("selections: worst_gap {}", c.worst_gap));
  for (const DifferingEntry& d : c.listed)
    if (std::isnan(d.gap) || d.gap < 0) violated(x, fmt::format("selections: entry {} has gap {}", d.entry, d.gap));
  const SelectionCompare self = compare_selections(x.sr, x.sr, x.sel_shape, th, &scores);
  if (self.differing != 0 || self.min_jaccard != 1) violated(x, "selections: r against itself differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  Inputs x;
  const int64_t rank = in.range(0, 3);
  for (int64_t k = 0; k < rank; ++k) x.shape.push_back(in.range(0, 5));
  size_t n = 1;
  for (int64_t d : x.shape) n *= size_t(d);
  for (size_t i = 0; i < n; ++i) x.r.push_back(special(in));
  for (size_t i = 0; i < n; ++i) x.t.push_back(near(in, x.r[i]));
  x.th.atol = tolerance(in);
  x.th.rtol = tolerance(in);
  x.dtype = in.pick({TensorDtype::F64, TensorDtype::F32, TensorDtype::BF16});
  x.sel_shape = {in.range(0, 4), in.range(0, 4)};
  const size_t m = size_t(x.sel_shape[0] * x.sel_shape[1]);
  for (size_t i = 0; i < m; ++i) x.sr.push_back(entry(in));
  for (size_t i = 0; i < m; ++i) x.st.push_back(in.range(0, 1) ? x.sr[i] : entry(in));
  for (int i = 0; i < 8; ++i) x.score_table.push_back(special(in));
  if (in.flag()) x.kth = special(in);

  try {
    check_tensors(x);
  } catch (const InputError&) {
    // a NaN or negative atol / rtol: a clean rejection (the rest still runs)
  }
  check_logits(x);
  try {
    check_selections(x);
  } catch (const InputError&) {
  }
  return 0;
}
