#include "compare/sum_bound.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>

#include "model/error.hpp"

namespace ced::bounds {

namespace {

constexpr double kU32 = 0x1p-24;  // fp32's unit roundoff, round to nearest

// The spacing of a format of `bits` significant bits at |x| (fp32's exponent range: below 2^-126 the
// subnormal spacing), so that round_down/round_up land on the format's grid.
// Read off the exponent field (frexp's e for a normal double: |x| in [2^(e-1), 2^e)); a subnormal double or 0
// lies below 2^-126 and takes the clamp. Both the spacing and its inverse are powers of two, built exactly.
double pow2(int64_t k) { return std::bit_cast<double>(static_cast<uint64_t>(k + 1023) << 52); }
double spacing(double x, int bits) {
  const int64_t e = static_cast<int64_t>((std::bit_cast<uint64_t>(x) >> 52) & 0x7ff) - 1022;
  return pow2(std::max<int64_t>(e, -125) - bits);
}

// y rounded to an integer, to nearest with ties to even, the sign of y kept on a zero: (y + 2^52) − 2^52 in the
// default rounding mode (every |y| ≥ 2^52 is an integer already). What std::nearbyint gives, without its
// save and restore of the floating-point environment, which made the rounding of the bounds' ends the gate's
// third costliest step; the compiler may not reassociate the sum (-fno-fast-math).
double rint_exact(double y) {
  if (!(std::fabs(y) < 0x1p52)) return y;
  const double c = std::copysign(0x1p52, y);
  return std::copysign((y + c) - c, y);
}
double floor_exact(double y) {
  const double r = rint_exact(y);
  return r > y ? std::copysign(r - 1, y) : r;
}
double ceil_exact(double y) {
  const double r = rint_exact(y);
  return r < y ? std::copysign(r + 1, y) : r;
}

double round_down(double x, int bits) {
  if (!std::isfinite(x)) return x;
  const double s = spacing(x, bits);
  return floor_exact(x * (1 / s)) * s;
}

double round_up(double x, int bits) {
  if (!std::isfinite(x)) return x;
  const double s = spacing(x, bits);
  return ceil_exact(x * (1 / s)) * s;
}

}  // namespace

AccumulationModel AccumulationModel::tensor_core(int accumulator_bits, int64_t promotion_interval) {
  if (accumulator_bits < 2 || accumulator_bits > 24)
    throw InputError(fmt::format("accumulation model: accumulator bits must be in [2, 24], got {}", accumulator_bits));
  if (promotion_interval < 1)
    throw InputError(fmt::format("accumulation model: the promotion interval must be at least 1, got {}",
                                 promotion_interval));
  return {Kind::tensor_core, accumulator_bits, promotion_interval};
}

std::string AccumulationModel::name() const {
  return kind == Kind::fp32 ? std::string("fp32")
                            : fmt::format("tensor-core({} bits, {})", accumulator_bits, promotion_interval);
}

double gamma(int64_t k, double u) {
  const double ku = static_cast<double>(k) * u;
  if (k < 0 || !(ku < 1)) throw InputError(fmt::format("error bound: gamma({}, {}) does not exist (k·u ≥ 1)", k, u));
  return ku / (1 - ku);
}

double sum_error_bound(int64_t n, double abs_sum, const AccumulationModel& model, bool products_exact) {
  if (n < 0 || abs_sum < 0) throw InputError(fmt::format("error bound: n = {}, Σ|x| = {}", n, abs_sum));
  // A NaN or an infinity among the terms bounds nothing: the value it reaches is judged as not a number
  // (a special value no bound excuses), and every other value the interval holds is admissible.
  if (!std::isfinite(abs_sum)) return std::numeric_limits<double>::infinity();
  // One exact term is returned as it is by fp32; a narrow accumulator may still round it on entry.
  if (n == 0 || (n == 1 && products_exact && model.kind == AccumulationModel::Kind::fp32)) return 0;
  // Inexact products: each is fp32's product, within u·|p| of it (so their Σ|p̂| ≤ (1 + u)·Σ|p|).
  const double rounding = products_exact ? 0 : kU32 * abs_sum;
  const double abs_terms = products_exact ? abs_sum : (1 + kU32) * abs_sum;
  if (n == 1 && model.kind == AccumulationModel::Kind::fp32) return rounding;
  double rel = 0;
  if (model.kind == AccumulationModel::Kind::fp32) {
    // Any order or tree: each term passes through at most n − 1 roundings (docs/sound-bounds.md §2).
    rel = gamma(n - 1, kU32);
  } else {
    // Each chunk in the narrow accumulator, which may truncate (unit 2^(1−p)), every term of it rounded
    // on entry too (a product wider than the accumulator); the chunks' partials, converted exactly
    // (p ≤ 24), then summed in fp32 in any order (docs/sound-bounds.md §3).
    const double ua = std::ldexp(1.0, 1 - model.accumulator_bits);
    const int64_t c = std::min(n, model.promotion_interval);
    const int64_t chunks = (n + model.promotion_interval - 1) / model.promotion_interval;
    const double inner = gamma(c, ua);
    rel = inner + gamma(chunks - 1, kU32) * (1 + inner);
  }
  return rounding + rel * abs_terms;
}

Interval admissible(double v, double error, double ref_error, int out_bits) {
  // One step of f64 outward covers the rounding of v ± e itself (none is needed when e = 0).
  const double e = error + ref_error;
  const double inf = std::numeric_limits<double>::infinity();
  const double lo = e > 0 ? std::nextafter(v - e, -inf) : v, hi = e > 0 ? std::nextafter(v + e, inf) : v;
  return rounded_outward(lo, hi, out_bits);
}

Interval rounded_outward(double lo, double hi, int out_bits) { return {round_down(lo, out_bits), round_up(hi, out_bits)}; }

Interval rounded_inward(double lo, double hi, int out_bits) {
  const Interval in{round_up(lo, out_bits), round_down(hi, out_bits)};
  return in.lo <= in.hi ? in : rounded_outward(lo, hi, out_bits);
}

Interval rounded_nearest(double lo, double hi, int out_bits) {
  auto nearest = [&](double x) {
    if (!std::isfinite(x)) return x;
    const double s = spacing(x, out_bits);
    return rint_exact(x * (1 / s)) * s;  // to nearest, ties to even
  };
  return {nearest(lo), nearest(hi)};
}

}  // namespace ced::bounds
