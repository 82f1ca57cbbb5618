// docs/sound-bounds.md §5-§7: admissible results of a linear layer and an RMSNorm; see op_bounds.hpp.
#include "compare/op_bounds.hpp"

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cmath>
#include <limits>

#include "model/error.hpp"

namespace ced::bounds {

namespace {

constexpr double kU32 = 0x1p-24;  // fp32's unit roundoff
constexpr double kU64 = 0x1p-53;  // f64's, for the reference's own arithmetic

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const Matrix>;

// The output columns in chunks of a fixed width, in parallel: each chunk's products are Eigen's on the same
// shapes whatever the thread count, so the bounds are the same bits on every run and thread count.
template <typename F>
void for_column_chunks(int64_t n_out, int64_t work, F f) {
  constexpr int64_t kChunk = 64;
  const int64_t chunks = (n_out + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(dynamic) if (work > (int64_t{1} << 20))
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(kChunk, n_out - c * kChunk));
}

int max_bits(std::span<const double> v) {
  int b = 0;
  for (double x : v) b = std::max(b, significant_bits(x));
  return b;
}

}  // namespace

BoundedValue bounded_result(double value, double lo, double hi, double scale, int out_bits) {
  const Interval f32 = rounded_inward(value - scale * (value - lo), value + scale * (hi - value), 24);
  return {value, out_bits >= 24 ? f32 : rounded_nearest(f32.lo, f32.hi, out_bits),
          rounded_nearest(value, value, out_bits).lo};
}

std::string BoundModel::name() const {
  return fmt::format("{}, functions within {} ulps{}", accumulation.name(), function_ulps,
                     scale == 1 ? "" : fmt::format(", bounds scaled by {}", scale));
}

BoundModel parse_bound_model(const std::string& accumulation, double function_ulps) {
  BoundModel m;
  if (!(function_ulps >= 0.5 && function_ulps <= 1e6))
    throw InputError(fmt::format("bound model: functions within {} ulps: at least 0.5 (correctly rounded)", function_ulps));
  m.function_ulps = function_ulps;
  if (accumulation == "fp32") return m;
  int bits = 0;
  long long interval = 0;
  char tail = 0;
  if (std::sscanf(accumulation.c_str(), "tensor-core:%d:%lld%c", &bits, &interval, &tail) != 2)
    throw InputError(fmt::format("bound model: accumulation '{}' is neither fp32 nor tensor-core:BITS:INTERVAL", accumulation));
  m.accumulation = AccumulationModel::tensor_core(bits, interval);
  return m;
}

int significant_bits(double x) {
  if (!std::isfinite(x)) return 64;
  if (x == 0) return 0;
  // The significand as an integer (the implicit bit set for a normal double): the bits it uses run from
  // its highest set bit to its lowest.
  const auto bits = std::bit_cast<uint64_t>(x);
  const uint64_t field = bits & ((uint64_t{1} << 52) - 1), exponent = (bits >> 52) & 0x7ff;
  const uint64_t q = exponent != 0 ? field | (uint64_t{1} << 52) : field;
  return (63 - std::countl_zero(q)) - std::countr_zero(q) + 1;
}

std::vector<BoundedValue> linear_bounds(std::span<const double> x, int64_t M, int64_t K, std::span<const double> w,
                                        int64_t Nout, const BoundModel& model, int out_bits) {
  if (M < 0 || K < 1 || Nout < 0 || x.size() != static_cast<size_t>(M * K) || w.size() != static_cast<size_t>(Nout * K))
    throw InputError(fmt::format("linear bounds: x has {} values for [{}, {}], w {} for [{}, {}]", x.size(), M, K,
                                 w.size(), Nout, K));
  // fp32 products of significands that fit 24 bits together are exact (bf16 × bf16: 8 + 8).
  const bool exact = max_bits(x) + max_bits(w) <= 24;
  const ConstMap X(x.data(), M, K), W(w.data(), Nout, K);
  const double ref_rel = gamma(K, kU64);
  std::vector<BoundedValue> out(static_cast<size_t>(M * Nout));
  for_column_chunks(Nout, M * K * Nout, [&](int64_t j0, int64_t n) {
    // The value and Σ|x·w| in f64, in Eigen's blocked order: any order is within γ_K(2^-53)·Σ|x·w| (§2).
    const auto Wc = W.middleRows(j0, n);
    const Matrix value = X * Wc.transpose();
    const Matrix abs_sum = X.cwiseAbs() * Wc.cwiseAbs().transpose();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < n; ++j) {
        const double v = value(m, j), a = abs_sum(m, j);
        const double e = sum_error_bound(K, a, model.accumulation, exact) + ref_rel * a;
        out[static_cast<size_t>(m * Nout + j0 + j)] = bounded_result(v, v - e, v + e, model.scale, out_bits);
      }
  });
  return out;
}

std::vector<BoundedValue> linear_bounds(std::span<const double> x_lo, std::span<const double> x_hi, int64_t M, int64_t K,
                                        std::span<const double> w, int64_t Nout, const BoundModel& model, int out_bits) {
  if (M < 0 || K < 1 || Nout < 0 || x_lo.size() != static_cast<size_t>(M * K) || x_hi.size() != x_lo.size() ||
      w.size() != static_cast<size_t>(Nout * K))
    throw InputError(fmt::format("linear bounds: x has {} and {} values for [{}, {}], w {} for [{}, {}]", x_lo.size(),
                                 x_hi.size(), M, K, w.size(), Nout, K));
  const bool exact = std::max(max_bits(x_lo), max_bits(x_hi)) + max_bits(w) <= 24;
  // Points: the point form's two products instead of five.
  if (std::equal(x_lo.begin(), x_lo.end(), x_hi.begin())) return linear_bounds(x_lo, M, K, w, Nout, model, out_bits);
  // Each input as its centre and a radius rounded outward, so [c − r, c + r] holds [lo, hi]: a term's
  // least and largest values are c·w ∓ r·|w|, and the sums C·W ∓ R·|W| (three products, not five).
  const ConstMap L(x_lo.data(), M, K), H(x_hi.data(), M, K), W(w.data(), Nout, K);
  const Matrix C = (L + H) * 0.5;
  const Matrix R = (H - C).cwiseMax(C - L) * (1 + 0x1p-51);
  const Matrix Ca = C.cwiseAbs();
  const double ref_rel = gamma(K + 2, kU64);  // the products' sums, then mid − r and − e
  std::vector<BoundedValue> out(static_cast<size_t>(M * Nout));
  for_column_chunks(Nout, M * K * Nout, [&](int64_t j0, int64_t n) {
    const auto Wc = W.middleRows(j0, n);
    const Matrix Wa = Wc.cwiseAbs().transpose();
    const Matrix centre = C * Wc.transpose(), radius = R * Wa, centre_abs = Ca * Wa;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < n; ++j) {
        // Σ(|c| + r)·|w| ≥ Σ max(|lo|, |hi|)·|w|: the fp32 sum's bound and the reference's own rounding.
        const double r = radius(m, j), a = centre_abs(m, j) + r;
        const double e = sum_error_bound(K, a, model.accumulation, exact) + ref_rel * a;
        const double mid = centre(m, j);
        out[static_cast<size_t>(m * Nout + j0 + j)] = bounded_result(mid, mid - r - e, mid + r + e, model.scale, out_bits);
      }
  });
  return out;
}

std::vector<BoundedValue> rmsnorm_bounds(std::span<const double> x, int64_t n, std::span<const double> w, double eps,
                                         const BoundModel& model, int out_bits) {
  return rmsnorm_bounds(x, x, n, w, eps, model, out_bits);
}

std::vector<BoundedValue> rmsnorm_bounds(std::span<const double> x_lo, std::span<const double> x_hi, int64_t n,
                                         std::span<const double> w, double eps, const BoundModel& model, int out_bits) {
  if (n < 1 || x_lo.size() % static_cast<size_t>(n) != 0 || x_hi.size() != x_lo.size() ||
      w.size() != static_cast<size_t>(n) || !(eps >= 0))
    throw InputError(fmt::format("rmsnorm bounds: {} and {} values in rows of {}, {} weights, eps {}", x_lo.size(),
                                 x_hi.size(), n, w.size(), eps));
  const int64_t rows = static_cast<int64_t>(x_lo.size()) / n;
  const bool squares_exact = 2 * std::max(max_bits(x_lo), max_bits(x_hi)) <= 24;
  // eps as the implementation may add it: the python float, or rounded to fp32 first (torch).
  const double eps32 = static_cast<double>(static_cast<float>(eps));
  const double eps_lo = std::min(eps, eps32), eps_hi = std::max(eps, eps32);
  // The reference's own f64 arithmetic (a sum of n squares, then five operations) errs by less than
  // (n + 16)·2^-53 relative; widened by that, the interval holds the exact result (§6).
  const double ref = static_cast<double>(n + 16) * kU64;
  const double fn = model.function_ulps * 0x1p-23;  // k ulps of a normal fp32 result, relative
  std::vector<BoundedValue> out(x_lo.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double *lo = x_lo.data() + r * n, *hi = x_hi.data() + r * n;
    // The sum of squares over the intervals: each square's least (0 where an interval holds 0) and largest.
    double s_lo = 0, s_hi = 0, s_mid = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double least = lo[i] <= 0 && 0 <= hi[i] ? 0 : std::min(lo[i] * lo[i], hi[i] * hi[i]);
      const double mid = (lo[i] + hi[i]) / 2;
      s_lo += least;
      s_hi += std::max(lo[i] * lo[i], hi[i] * hi[i]);
      s_mid += mid * mid;
    }
    // All terms positive, so the sum's error is within its bound over the largest squares (§2); the mean
    // one or two roundings (a division, or a product by 1/n rounded); eps added with one rounding.
    const double e_s = s_hi > 0 ? sum_error_bound(n, s_hi, model.accumulation, squares_exact) : 0;
    const double dn = static_cast<double>(n);
    const double t_lo = ((s_lo - e_s) / dn * (1 - kU32) * (1 - kU32) + eps_lo) * (1 - kU32) * (1 - ref);
    const double t_hi = ((s_hi + e_s) / dn * (1 + kU32) * (1 + kU32) + eps_hi) * (1 + kU32) * (1 + ref);
    // rsqrt within its ulps (1/sqrt: two roundings, under one ulp), then x·r and w·(x·r), one rounding each.
    const double r_lo = (1 - fn) * (1 - kU32) * (1 - kU32) / std::sqrt(t_hi) * (1 - ref);
    const double r_hi = (1 + fn) * (1 + kU32) * (1 + kU32) / std::sqrt(std::max(t_lo, 0.0)) * (1 + ref);
    const double centre = 1 / std::sqrt(s_mid / dn + eps);
    for (int64_t i = 0; i < n; ++i) {
      const double wi = w[static_cast<size_t>(i)];
      const double c[4] = {wi * lo[i] * r_lo, wi * lo[i] * r_hi, wi * hi[i] * r_lo, wi * hi[i] * r_hi};
      out[static_cast<size_t>(r * n + i)] = bounded_result(wi * (lo[i] + hi[i]) / 2 * centre, *std::min_element(c, c + 4),
                                                           *std::max_element(c, c + 4), model.scale, out_bits);
    }
  }
  return out;
}

BoundJudgement judge_within(std::span<const double> results, std::span<const BoundedValue> bounds) {
  if (results.size() != bounds.size())
    throw InputError(fmt::format("bounds: {} results for {} intervals", results.size(), bounds.size()));
  BoundJudgement j;
  j.n = static_cast<int64_t>(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    const double r = results[i];
    const BoundedValue& b = bounds[i];
    if (b.admissible.lo < b.admissible.hi) ++j.straddled;
    if (!b.admissible.contains(r)) {
      if (j.outside++ == 0) {
        j.first_outside = static_cast<int64_t>(i);
        j.outside_by = std::isnan(r) ? r : r < b.admissible.lo ? b.admissible.lo - r : r - b.admissible.hi;
      }
      continue;
    }
    const double half = r >= b.value ? b.admissible.hi - b.value : b.value - b.admissible.lo;
    const double use = r == b.nearest ? 0 : half > 0 ? std::min(1.0, std::fabs(r - b.value) / half) : 1;
    if (use > j.max_use || j.max_use_at < 0) {
      j.max_use = use;
      j.max_use_at = static_cast<int64_t>(i);
    }
  }
  return j;
}

TopkJudgement judge_topk(std::span<const Interval> row, std::span<const int64_t> chosen) {
  TopkJudgement j;
  const auto n = static_cast<int64_t>(row.size());
  std::vector<char> picked(row.size(), 0);
  for (int64_t c : chosen) {
    if (c < 0 || c >= n || picked[static_cast<size_t>(c)]) return j;  // out of range or repeated: no top-k
    picked[static_cast<size_t>(c)] = 1;
  }
  // The chosen entry with the lowest upper end and the lowest lower end; the left-out entry with the
  // highest lower end and the highest upper end.
  int64_t low_hi = -1, low_lo = -1, high_lo = -1, high_hi = -1;
  for (int64_t i = 0; i < n; ++i) {
    const Interval& v = row[static_cast<size_t>(i)];
    if (picked[static_cast<size_t>(i)]) {
      if (low_hi < 0 || v.hi < row[static_cast<size_t>(low_hi)].hi) low_hi = i;
      if (low_lo < 0 || v.lo < row[static_cast<size_t>(low_lo)].lo) low_lo = i;
    } else {
      if (high_lo < 0 || v.lo > row[static_cast<size_t>(high_lo)].lo) high_lo = i;
      if (high_hi < 0 || v.hi > row[static_cast<size_t>(high_hi)].hi) high_hi = i;
    }
  }
  if (low_hi < 0 || high_lo < 0) {  // everything or nothing chosen: the only selection there is
    j.admissible = true;
    return j;
  }
  // A NaN end compares false both ways: such a row is never admissible.
  j.admissible = row[static_cast<size_t>(high_lo)].lo <= row[static_cast<size_t>(low_hi)].hi;
  if (!j.admissible) {
    j.in = low_hi;
    j.out = high_lo;
    return j;
  }
  j.contested = row[static_cast<size_t>(high_hi)].hi >= row[static_cast<size_t>(low_lo)].lo;
  if (j.contested) {
    j.in = low_lo;
    j.out = high_hi;
  }
  return j;
}

}  // namespace ced::bounds
