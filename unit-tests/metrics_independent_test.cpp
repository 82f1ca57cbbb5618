// docs/spec.md §8 metrics recomputed the plain way and compared with oracle/compare:
// every metric here is written from its definition in long double (norms as
// plain sums of squares, which long double's range holds for 1e±300 values),
// with no helper shared with compare/compare.cpp, on random tensors with ties,
// ±0, NaN, ±Inf, subnormals and huge ranges. The tie rule of every "worst"
// and "first" location is the first in index order (tested exactly: the
// element errors are compared as the doubles the documented rule defines).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "compare/compare.hpp"

using namespace ced;
using LD = long double;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Values from every class the metrics treat specially.
rc::Gen<double> gen_value(bool huge) {
  std::vector<double> special = {0.0, -0.0, 1.0, -1.0, 5e-324, -2.5e-320, 1e-300, kInf, -kInf, kNaN};
  if (huge) special.insert(special.end(), {1e300, -1e300, 1.7e308, -1.7e308});
  return rc::gen::weightedOneOf<double>(
      {{6, rc::gen::map(rc::gen::inRange(-1000000, 1000000), [](int v) { return v / 1000.0; })},
       {2, rc::gen::elementOf(special)},
       {1, rc::gen::map(rc::gen::inRange(-300, 300), [](int e) { return std::ldexp(1.5, e * 3); })}});
}

// t and r: r random, t mostly r with some elements changed (and ties: repeated errors).
struct Pair {
  std::vector<double> t, r;
  int64_t rows = 0, cols = 0;
};
rc::Gen<Pair> gen_pair(bool huge, bool specials = true) {
  return rc::gen::exec([=] {
    Pair p;
    p.rows = *rc::gen::inRange<int64_t>(1, 6);
    p.cols = *rc::gen::inRange<int64_t>(1, 9);
    const size_t n = size_t(p.rows * p.cols);
    for (size_t i = 0; i < n; ++i) {
      double v = specials ? *gen_value(huge) : *rc::gen::map(rc::gen::inRange(-20000, 20000), [](int x) { return x / 1000.0; });
      if (i > 0 && *rc::gen::inRange(0, 5) == 0) v = p.r[i - 1];  // ties
      p.r.push_back(v);
      const int how = *rc::gen::inRange(0, 6);
      double t = v;
      if (how == 1) t = v + 0.5;                                   // equal errors at several places
      else if (how == 2) t = specials ? *gen_value(huge) : v * 1.01;
      else if (how == 3) t = v * (1 + 1e-12);
      p.t.push_back(t);
    }
    return p;
  });
}

uint64_t ulp_plain(double a, double b, TensorDtype dt) {
  if (dt == TensorDtype::F32) {
    auto rank = [](float x) -> LD {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      const LD m = LD(u & 0x7FFFFFFFu);
      return (u >> 31) ? -m : m;
    };
    return uint64_t(std::fabs(rank(float(a)) - rank(float(b))));
  }
  auto rank = [](double x) -> LD {
    uint64_t u;
    std::memcpy(&u, &x, 8);
    const LD m = LD(u & 0x7FFFFFFFFFFFFFFFull);
    return (u >> 63) ? -m : m;
  };
  return uint64_t(std::fabs(rank(a) - rank(b)));
}

void expect_close(LD want, double got, LD rel, const char* what) {
  // beyond DBL_MAX the double metric is +Inf (documented overflow)
  if (std::isinf(double(want)) || std::isnan(want)) {
    RC_ASSERT(double(want) == got || (std::isnan(want) && std::isnan(got)));
    return;
  }
  const LD err = std::fabs(LD(got) - want);
  if (!(err <= rel * std::fabs(want) + 1e-300L)) RC_FAIL(std::string(what) + ": " + std::to_string(double(want)) + " vs " + std::to_string(got));
}

}  // namespace

RC_GTEST_PROP(MetricsIndependent, TensorMetricsMatchAPlainLongDoubleComputation, ()) {
  const Pair p = *gen_pair(*rc::gen::arbitrary<bool>());
  const TensorDtype dt = *rc::gen::elementOf(std::vector<TensorDtype>{TensorDtype::F64, TensorDtype::F32});
  Thresholds th;
  th.atol = *rc::gen::elementOf(std::vector<double>{0, 1e-9, 0.5});
  th.rtol = *rc::gen::elementOf(std::vector<double>{0, 1e-6, 0.01});
  const TensorCompare c = compare_tensors(p.t, p.r, {p.rows, p.cols}, th, dt);
  for (size_t i = 0; i < p.t.size(); ++i) RC_LOG() << i << ": t " << p.t[i] << " r " << p.r[i] << "\n";

  int64_t nan_t = 0, nan_r = 0, inf_t = 0, inf_r = 0, first_nan_t = -1, first_inf_r = -1, nan_pairs = 0;
  int64_t inf_mism = 0, zero_ref = 0, mismatches = 0, first_mismatch = -1, abs_at = -1, ulp_at = -1;
  double max_abs = 0, max_excess = 0;
  LD max_abs_ld = 0, max_rel = 0, st = 0, sr = 0, str = 0, sd = 0;
  uint64_t max_ulp = 0;
  for (size_t i = 0; i < p.t.size(); ++i) {
    const double a = p.t[i], b = p.r[i];
    if (std::isnan(a)) { if (nan_t++ == 0) first_nan_t = int64_t(i); }
    else if (std::isinf(a)) ++inf_t;
    if (std::isnan(b)) ++nan_r;
    else if (std::isinf(b)) { if (inf_r++ == 0) first_inf_r = int64_t(i); }
    if (std::isnan(a) || std::isnan(b)) {
      ++nan_pairs;
      if (mismatches++ == 0) first_mismatch = int64_t(i);
      continue;
    }
    const bool inf_m = a != b && (std::isinf(a) || std::isinf(b));
    inf_m && ++inf_mism;
    // the element error as the double the rule defines: 0, +Inf, or |a - b| rounded once
    const double err = a == b ? 0.0 : inf_m ? kInf : double(std::fabs(LD(a) - LD(b)));
    if (abs_at < 0 || err > max_abs) max_abs = err, abs_at = int64_t(i);
    max_abs_ld = std::max(max_abs_ld, a == b ? 0.0L : inf_m ? LD(kInf) : std::fabs(LD(a) - LD(b)));
    if (b == 0) zero_ref += a != b;
    else max_rel = std::max(max_rel, a == b ? 0.0L : inf_m ? LD(kInf) : std::fabs(LD(a) - LD(b)) / std::fabs(LD(b)));
    const uint64_t u = ulp_plain(a, b, dt);
    if (ulp_at < 0 || u > max_ulp) max_ulp = u, ulp_at = int64_t(i);
    // documented: excess = |t-r| - rtol*|r| in double, fails iff excess > atol
    // (identical infinities are equal values: error 0)
    double excess = inf_m ? kInf : (a == b ? 0.0 : std::fabs(a - b)) - (*th.rtol == 0 || b == 0 ? 0.0 : *th.rtol * std::fabs(b));
    if (std::isnan(excess)) excess = kInf;
    if (!(excess <= *th.atol) && mismatches++ == 0) first_mismatch = int64_t(i);
    max_excess = std::max(max_excess, excess);
    if (std::isfinite(a) && std::isfinite(b)) {
      st += LD(a) * a, sr += LD(b) * b, str += LD(a) * b, sd += (LD(a) - b) * (LD(a) - b);
    }
  }
  RC_ASSERT(c.t_nonfinite.nan == nan_t);
  RC_ASSERT(c.r_nonfinite.nan == nan_r);
  RC_ASSERT(c.t_nonfinite.inf == inf_t);
  RC_ASSERT(c.r_nonfinite.inf == inf_r);
  RC_ASSERT(c.t_nonfinite.first_nan == first_nan_t);
  RC_ASSERT(c.r_nonfinite.first_inf == first_inf_r);
  RC_ASSERT(c.nan_pairs == nan_pairs);
  RC_ASSERT(c.inf_mismatches == inf_mism);
  RC_ASSERT(c.zero_ref_nonzero == zero_ref);
  RC_ASSERT(c.mismatches == mismatches);
  RC_ASSERT(c.first_mismatch.flat == first_mismatch);
  RC_ASSERT(c.max_abs.flat == abs_at);  // first in index order among ties
  RC_ASSERT(c.max_abs_err == max_abs);
  expect_close(max_abs_ld, c.max_abs_err, 1.2e-16L, "max_abs_err");
  expect_close(max_rel, c.max_rel_err, 4e-16L, "max_rel_err");
  RC_ASSERT(c.max_ulp == max_ulp);
  RC_ASSERT(c.max_ulp_at.flat == ulp_at);
  RC_ASSERT(c.min_passing_atol == max_excess);
  // norms over finite pairs, with the documented zero rules
  const LD rel_l2 = sr == 0 ? (sd == 0 ? 0.0L : LD(kInf)) : std::sqrt(sd / sr);
  const LD nmse = sr == 0 ? (sd == 0 ? 0.0L : LD(kInf)) : sd / sr;
  const LD cosine = st == 0 && sr == 0 ? 1.0L : (st == 0 || sr == 0) ? 0.0L
                                               : std::clamp(str / (std::sqrt(st) * std::sqrt(sr)), -1.0L, 1.0L);
  // scaled double sums over <= 40 terms: a few tens of ulps
  expect_close(rel_l2, c.rel_l2, 1e-13L, "rel_l2");
  expect_close(nmse, c.nmse, 1e-13L, "nmse");
  RC_ASSERT(std::fabs(LD(c.cosine) - cosine) <= 1e-13L);
}

RC_GTEST_PROP(MetricsIndependent, LogitsMetricsMatchAPlainLongDoubleComputation, ()) {
  const bool specials = *rc::gen::arbitrary<bool>();
  Pair p = *gen_pair(false, false);
  if (specials)  // a few non-finite logits, on either side
    for (int k = 0; k < 2; ++k) {
      auto& v = *rc::gen::arbitrary<bool>() ? p.t : p.r;
      v[*rc::gen::inRange<size_t>(0, v.size())] = *rc::gen::elementOf(std::vector<double>{-kInf, kInf, kNaN});
    }
  const LogitsCompare c = compare_logits(p.t, p.r, {p.rows, p.cols});
  auto at = [&](const std::vector<double>& v, int64_t i, int64_t j) { return v[size_t(i * p.cols + j)]; };
  // ranking: higher first, equal (-0 == +0) larger index first, NaN last
  auto top = [&](const std::vector<double>& v, int64_t i) {
    std::vector<int64_t> idx(size_t(p.cols));
    for (int64_t j = 0; j < p.cols; ++j) idx[size_t(j)] = j;
    std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
      const double x = at(v, i, a), y = at(v, i, b);
      if (std::isnan(x) != std::isnan(y)) return std::isnan(y);
      if (!std::isnan(x) && x != y) return x > y;
      return a > b;
    });
    idx.resize(size_t(std::min<int64_t>(5, p.cols)));
    return idx;
  };
  int64_t agree = 0, first_dis = -1, min_row = -1, kl_row = -1;
  LD min_overlap = 2, max_kl = -1;
  for (int64_t i = 0; i < p.rows; ++i) {
    // KL(softmax r || softmax t), long double; undefined rows are +Inf
    bool undefined = false;
    LD mt = -INFINITY, mr = -INFINITY;
    for (int64_t j = 0; j < p.cols; ++j) {
      const double a = at(p.t, i, j), b = at(p.r, i, j);
      if (std::isnan(a) || std::isnan(b) || a == kInf || b == kInf) undefined = true;
      mt = std::max<LD>(mt, a), mr = std::max<LD>(mr, b);
    }
    if (mt == -INFINITY || mr == -INFINITY) undefined = true;
    LD kl = INFINITY;
    if (!undefined) {
      LD zt = 0, zr = 0;
      for (int64_t j = 0; j < p.cols; ++j) zt += std::exp(at(p.t, i, j) - mt), zr += std::exp(at(p.r, i, j) - mr);
      kl = 0;
      for (int64_t j = 0; j < p.cols; ++j) {
        const double b = at(p.r, i, j), a = at(p.t, i, j);
        if (b == -kInf) continue;
        const LD lr = b - mr - std::log(zr);
        if (a == -kInf) { kl = INFINITY; break; }
        kl += std::exp(lr) * (lr - (a - mt - std::log(zt)));
      }
      kl = std::max(kl, 0.0L);
    }
    // |log terms| <= ~40 here: double cancellation error stays below 1e-13 absolute
    if (std::isinf(kl)) RC_ASSERT(std::isinf(c.kl[size_t(i)]));
    else RC_ASSERT(std::fabs(LD(c.kl[size_t(i)]) - kl) <= 1e-13L + 1e-12L * kl);
    if (kl > max_kl + 1e-12L) max_kl = kl, kl_row = i;  // first row attaining the max (ties within rounding aside)
    const auto tt = top(p.t, i), tr = top(p.r, i);
    if (tt[0] == tr[0]) ++agree;
    else if (first_dis < 0) first_dis = i;
    std::set<int64_t> s(tr.begin(), tr.end());
    int64_t common = 0;
    for (int64_t x : tt) common += s.count(x);
    const LD ov = LD(common) / LD(tt.size());
    if (ov < min_overlap) min_overlap = ov, min_row = i;
  }
  RC_ASSERT(c.top1_agree == agree);
  RC_ASSERT(c.first_top1_disagreement == first_dis);
  RC_ASSERT(std::fabs(LD(c.min_topk_overlap) - min_overlap) < 1e-15L);
  RC_ASSERT(c.min_topk_overlap_row == min_row);
  if (std::isinf(max_kl)) RC_ASSERT(c.max_kl == kInf && c.max_kl_row == kl_row);
}

RC_GTEST_PROP(MetricsIndependent, JaccardMatchesPlainSetArithmetic, ()) {
  const int64_t rows = *rc::gen::inRange<int64_t>(1, 6), k = *rc::gen::inRange<int64_t>(1, 5);
  std::vector<int64_t> t, r;
  for (int64_t i = 0; i < rows * k; ++i) {
    t.push_back(*rc::gen::inRange<int64_t>(-2, 7));  // -2 invalid, -1 padding, repeats duplicates
    r.push_back(*rc::gen::inRange<int64_t>(-1, 7));
  }
  const SelectionCompare c = compare_selections(t, r, {rows, k}, Thresholds{});
  int64_t invalid_t = 0, min_row = -1, differing = 0;
  LD min_j = 2;
  for (int64_t i = 0; i < rows; ++i) {
    std::set<int64_t> a, b;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t x = t[size_t(i * k + j)], y = r[size_t(i * k + j)];
      if (x < -1 || (x >= 0 && !a.insert(x).second)) ++invalid_t;
      if (y >= 0) b.insert(y);
    }
    int64_t inter = 0;
    for (int64_t x : a) inter += b.count(x);
    const int64_t uni = int64_t(a.size() + b.size()) - inter;
    differing += uni - inter;
    const LD j = uni == 0 ? 1.0L : LD(inter) / LD(uni);
    RC_ASSERT(std::fabs(LD(c.jaccard[size_t(i)]) - j) < 1e-15L);
    if (j < min_j) min_j = j, min_row = i;
  }
  RC_ASSERT(c.invalid_t == invalid_t);
  RC_ASSERT(c.differing == differing);
  RC_ASSERT(c.min_jaccard_row == min_row);
}
