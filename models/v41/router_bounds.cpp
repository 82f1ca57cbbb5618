// docs/sound-bounds.md §9: the router's admissible results; see router_bounds.hpp.
#include "models/v41/router_bounds.hpp"

#include <algorithm>
#include <cmath>

namespace ced::v41 {

namespace {

constexpr double kU32 = 0x1p-24;
// The reference's own f64 arithmetic (log1p, exp, sqrt, a few sums) and torch's softplus threshold (the
// input itself above 20, which differs from log1p(exp(x)) by under exp(-20), 2^-33 of the value there).
constexpr double kSlack = 0x1p-30;

double softplus(double v) { return v > 0 ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v)); }

// A value and a python float constant rounded to fp32 or not: both ends.
std::pair<double, double> either_precision(double c) {
  const double f = static_cast<double>(static_cast<float>(c));
  return {std::min(c, f), std::max(c, f)};
}

}  // namespace

std::optional<V41RouterBounds> v41_router_bounds(const V41Config& c, std::span<const double> x, int64_t N,
                                                 std::span<const double> gate_weight,
                                                 std::span<const double> gate_bias, const bounds::BoundModel& model) {
  if (c.score_func != "sqrtsoftplus" || !(c.gate_temp > 0)) return std::nullopt;
  const int64_t E = c.n_routed_experts, D = c.dim;
  const auto logits = bounds::linear_bounds(x, N, D, gate_weight, E, model, 24);
  const auto [t_lo, t_hi] = either_precision(c.gate_temp);
  const bool divides = c.gate_temp != 1;
  // exp, log1p and sqrt each within function_ulps of their result (relative 2^-23 per ulp): sqrt halves
  // the relative error of its input (docs/sound-bounds.md §9).
  const double f = model.function_ulps * 0x1p-23;
  const double below = std::sqrt(1 - 2 * f) * (1 - f) * (1 - kSlack), above = std::sqrt(1 + 2 * f) * (1 + f) * (1 + kSlack);
  V41RouterBounds b;
  b.N = N;
  b.E = E;
  b.K = c.n_activated_experts;
  b.score.resize(static_cast<size_t>(N * E));
  b.biased.resize(b.score.size());
  for (int64_t t = 0; t < N; ++t)
    for (int64_t e = 0; e < E; ++e) {
      const size_t i = static_cast<size_t>(t * E + e);
      double lo = logits[i].admissible.lo, hi = logits[i].admissible.hi;
      if (divides) {  // logits / gate_temp, one rounding, the constant in either precision
        lo = std::min(lo / t_lo, lo / t_hi), hi = std::max(hi / t_lo, hi / t_hi);
        lo -= kU32 * std::fabs(lo), hi += kU32 * std::fabs(hi);
      }
      // sqrt(softplus(v)) rises with v. Below -80, exp(v) may underflow fp32 to 0 (or a subnormal whose
      // relative error is unbounded): the score's lower end is then 0.
      const double s_lo = lo < -80 ? 0.0 : std::sqrt(softplus(lo)) * below, s_hi = std::sqrt(softplus(hi)) * above;
      b.score[i] = {s_lo, s_hi};
      const double bias = gate_bias[static_cast<size_t>(e)];
      const double b_lo = s_lo + bias, b_hi = s_hi + bias;  // one fp32 rounding
      b.biased[i] = {b_lo - kU32 * std::fabs(b_lo) - 0x1p-149, b_hi + kU32 * std::fabs(b_hi) + 0x1p-149};
    }
  return b;
}

std::vector<bounds::Interval> v41_route_weight_bounds(const V41Config& c, const V41RouterBounds& b, int64_t t,
                                                      std::span<const int64_t> experts, const bounds::BoundModel& model) {
  const auto score = [&](int64_t e) { return b.score[static_cast<size_t>(t * b.E + e)]; };
  const auto [rs_lo, rs_hi] = either_precision(c.route_scale);
  const auto K = static_cast<int64_t>(experts.size());
  std::vector<bounds::Interval> out;
  const bool renormalise = c.norm_topk_prob && K > 1;
  // The sum of K positive scores in any order (§2), relative; then + 1e-20, a division and route_scale,
  // one rounding each.
  const double rel = renormalise ? bounds::sum_error_bound(K, 1.0, model.accumulation, true) : 0.0;
  for (int64_t j = 0; j < K; ++j) {
    const bounds::Interval s = score(experts[static_cast<size_t>(j)]);
    double lo = s.lo, hi = s.hi;
    if (renormalise) {
      // s_j / (s_j + rest) rises with s_j and falls with the rest: the ends take opposite ends of the two.
      double rest_lo = 0, rest_hi = 0;
      for (int64_t i = 0; i < K; ++i)
        if (i != j) rest_lo += score(experts[static_cast<size_t>(i)]).lo, rest_hi += score(experts[static_cast<size_t>(i)]).hi;
      lo = s.lo / (((s.lo + rest_hi) * (1 + rel) + 1e-20) * (1 + kU32)) * (1 - kU32);
      hi = s.hi / (((s.hi + rest_lo) * (1 - rel) + 1e-20) * (1 - kU32)) * (1 + kU32);
    }
    lo = lo * rs_lo * (1 - kU32) * (1 - kSlack);
    hi = hi * rs_hi * (1 + kU32) * (1 + kSlack);
    out.push_back(bounds::rounded_outward(lo, hi, 24));
  }
  return out;
}

}  // namespace ced::v41
