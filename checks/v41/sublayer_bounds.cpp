// docs/sound-bounds.md §12-§14: the v41 sublayers' ops bounded under op-level forcing; see sublayer_bounds.hpp.
#include "checks/v41/sublayer_bounds.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "compare/attention_bounds.hpp"
#include "model/error.hpp"
#include "reference/v41/forward_ops.hpp"
#include "reference/v41/forward_weights.hpp"
#include "models/v41/numerics.hpp"
#include "models/v41/router_bounds.hpp"

namespace ced::v41 {

using bounds::BoundedValue;
using bounds::Interval;

namespace {

constexpr double kU32 = 0x1p-24;   // fp32's unit roundoff
constexpr double kBf16 = 0x1p-8;   // a bf16 rounding, relative: its unit roundoff (8 significant bits)
constexpr double kTiny = 0x1p-140; // an fp32 result that underflows: absolute

std::vector<Interval> points(std::span<const double> x) {
  std::vector<Interval> v(x.size());
  for (size_t i = 0; i < x.size(); ++i) v[i] = {x[i], x[i]};
  return v;
}
// A tensor the release holds in bf16 that an implementation may keep in fp32 instead (a fused kernel):
// both the value and its bf16 rounding, within 2^-8 of it.
Interval either_rounded(Interval v) {
  return {v.lo - kBf16 * std::fabs(v.lo), v.hi + kBf16 * std::fabs(v.hi)};
}
// The product's exact range, then one fp32 rounding of any result in it.
Interval times(Interval a, Interval b) {
  const double p[4] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
  const double lo = *std::min_element(p, p + 4), hi = *std::max_element(p, p + 4);
  return {lo - kU32 * std::fabs(lo) - kTiny, hi + kU32 * std::fabs(hi) + kTiny};
}
// silu(x) = x / (1 + e^-x) over [a, b]: falling to its minimum at x* (silu'(x*) = 0), rising after; then
// the implementation's exp within its ulps and three roundings (a sum, a division or a reciprocal and a
// product; 4u is taken), relative to the largest magnitude (docs/sound-bounds.md §14.1).
Interval silu(Interval x, double fn) {
  constexpr double xs = -1.2784645427610738, ys = -0.27846454276107380;  // the minimum
  auto f = [](double v) { return v / (1 + std::exp(-v)); };
  double lo = std::min(f(x.lo), f(x.hi)), hi = std::max(f(x.lo), f(x.hi));
  if (x.lo < xs && xs < x.hi) lo = ys;
  const double e = (fn + 4 * kU32) * std::max(std::fabs(lo), std::fabs(hi)) + kTiny;
  return {lo - e, hi + e};
}

// RoPE on intervals, row t at position t: each head's last 2·half values as pairs (x0 + i x1) times
// (c + i s), or its conjugate when inverse; each table entry within the functions' ulps of ours, two
// products and a sum rounded in fp32 (docs/sound-bounds.md §13.1), then bf16 (the tensor is bf16).
// Row t at position first + t, or at positions[t] where given.
void rope_bounds(std::vector<Interval>& x, int64_t rows, int64_t heads, int64_t d, const fwd::RopeTable& rope,
                 bool inverse, double fn, int64_t first = 0, std::span<const int64_t> positions = {}) {
  const int64_t half = rope.half, rotated = d - 2 * half;
  auto combine = [](Interval p, Interval q, bool plus) {
    const double lo = plus ? p.lo + q.lo : p.lo - q.hi, hi = plus ? p.hi + q.hi : p.hi - q.lo;
    const double mag = std::max(std::fabs(p.lo), std::fabs(p.hi)) + std::max(std::fabs(q.lo), std::fabs(q.hi));
    const double e = 3 * kU32 * mag * (1 + kU32);
    return bounds::rounded_nearest(lo - e, hi + e, 8);
  };
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      Interval* v = x.data() + (t * heads + h) * d + rotated;
      for (int64_t i = 0; i < half; ++i) {
        const size_t at = static_cast<size_t>((positions.empty() ? first + t : positions[static_cast<size_t>(t)]) * half + i);
        const double cs = rope.cos[at], sn = rope.sin[at];
        const Interval ci{cs - fn * std::fabs(cs) - kTiny, cs + fn * std::fabs(cs) + kTiny};
        const Interval si{sn - fn * std::fabs(sn) - kTiny, sn + fn * std::fabs(sn) + kTiny};
        const Interval x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = combine(times(x0, ci), times(x1, si), inverse);
        v[2 * i + 1] = inverse ? combine(times(x1, ci), times(x0, si), false) : combine(times(x0, si), times(x1, ci), true);
      }
    }
}

std::vector<Interval> admissible_of(std::span<const BoundedValue> b) {
  std::vector<Interval> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = b[i].admissible;
  return v;
}

// An RMSNorm over rows of n on intervals, bf16 out.
std::vector<Interval> rmsnorm_intervals(std::span<const Interval> x, int64_t n, std::span<const double> w, double eps,
                                        const bounds::BoundModel& model) {
  std::vector<double> lo(x.size()), hi(x.size());
  for (size_t i = 0; i < x.size(); ++i) lo[i] = x[i].lo, hi[i] = x[i].hi;
  return admissible_of(bounds::rmsnorm_bounds(lo, hi, n, w, eps, model, 8));
}

// A block quantizer's rule (docs/v41.md §3): act_quant's FP8 e4m3 per 32, the indexer's FP4 e2m1 per 32,
// each with a ue8m0 scale 2^ceil(log2(amax / max)) from the block's amax floored.
struct QdqRule {
  int64_t block;
  float amax_floor, max_inv;  // the kernel's fp32 reciprocal of the format's largest value
  double max_inv_exact;
  bool fp4;
  const char* format;
};
constexpr QdqRule kActQuant{kFp8Block, kFp8AmaxFloor, kFp8MaxInv, 1.0 / 448, false, "e4m3"};
constexpr QdqRule kIndexFp4{kFp4Block, kFp4AmaxFloor, kFp4MaxInv, 1.0 / 6, true, "e2m1"};

// x's QDQ value under the scale s: monotone in x (round to nearest, saturating or clamped).
double qdq_at(double x, float s, bool fp4) {
  const float v = static_cast<float>(x) / s;
  if (!fp4) return static_cast<double>(f32_from_e4m3(e4m3_from_f32(v))) * static_cast<double>(s);
  const float c = v < -kE2m1Max ? -kE2m1Max : (v > kE2m1Max ? kE2m1Max : v);
  return static_cast<double>(round_bf16(f32_from_e2m1(e2m1_from_f32(c)) * s));
}

void qdq_bounds(std::span<Interval> x, int64_t K, const QdqRule& rule, V41Straddles* straddles, const std::string& what) {
  if (K < rule.block || K % rule.block != 0 || x.size() % static_cast<size_t>(K) != 0)
    throw InputError(fmt::format("{} bounds: {} values in rows of {} (a multiple of {})", what, x.size(), K, rule.block));
  const size_t blocks = x.size() / static_cast<size_t>(rule.block);
  for (size_t b = 0; b < blocks; ++b) {
    Interval* v = x.data() + b * static_cast<size_t>(rule.block);
    // The block's amax ranges from the largest least magnitude to the largest magnitude.
    double amax_lo = 0, amax_hi = 0;
    for (int64_t i = 0; i < rule.block; ++i) {
      const double least = v[i].lo <= 0 && 0 <= v[i].hi ? 0 : std::min(std::fabs(v[i].lo), std::fabs(v[i].hi));
      amax_lo = std::max(amax_lo, least);
      amax_hi = std::max({amax_hi, std::fabs(v[i].lo), std::fabs(v[i].hi)});
    }
    // Its scale: the kernel's 2^ceil(log2(fp32(amax · fp32(1/max)))) or the same of the exact amax / max,
    // at either end; every power of two between them is some amax's in the interval.
    float s_lo = INFINITY, s_hi = 0;
    for (double a : {amax_lo, amax_hi}) {
      const float f = std::max(static_cast<float>(a), rule.amax_floor);
      for (float sc : {ue8m0_scale(f, rule.max_inv), static_cast<float>(ue8m0_scale_f64(static_cast<double>(f), rule.max_inv_exact))})
        s_lo = std::min(s_lo, sc), s_hi = std::max(s_hi, sc);
    }
    int64_t scales = 0, reached = 0;
    if (!(s_lo > 0) || !std::isfinite(s_hi)) {
      // An interval without a finite end (a bound that cannot keep a denominator from 0, or a non-finite
      // input) reaches every value of the format under some scale: admit them all, never loop over them.
      for (int64_t i = 0; i < rule.block; ++i) v[i] = {-INFINITY, INFINITY};
      if (straddles)
        straddles->add(rule.block, 1, fmt::format("{}, block {}: an input interval without finite ends", what, b));
      continue;
    }
    for (float sc = s_lo; sc <= s_hi; sc *= 2) ++scales;
    for (int64_t i = 0; i < rule.block; ++i) {
      double lo = INFINITY, hi = -INFINITY;
      for (float sc = s_lo; sc <= s_hi; sc *= 2) {
        lo = std::min(lo, qdq_at(v[i].lo, sc, rule.fp4));
        hi = std::max(hi, qdq_at(v[i].hi, sc, rule.fp4));
      }
      reached += lo != hi;
      v[i] = {lo, hi};
    }
    if (straddles && (reached > 0 || scales > 1)) {
      const size_t row = b * static_cast<size_t>(rule.block) / static_cast<size_t>(K);
      const size_t blk = b % (static_cast<size_t>(K) / static_cast<size_t>(rule.block));
      straddles->add(reached, scales > 1 ? 1 : 0,
                     fmt::format("{}, row {}, block {}: {} {} values{}", what, row, blk, reached, rule.format,
                                 scales > 1 ? fmt::format(" and {} scales", scales) : ""));
    }
  }
}

// The compressed latent's FP4 QDQ (e2m1 per 16, an e4m3 scale e4m3(amax / 6), x / s an inexact fp32
// division, the result cast to bf16) on intervals: every e4m3 scale between those of the amax interval's ends
// (the kernel's fp32 amax / 6, or the exact quotient), each value between its ends' least and largest results.
void fp4_e4m3_qdq_bounds(std::span<Interval> x, int64_t K, V41Straddles* straddles, const std::string& what) {
  if (K < kFp4KvBlock || K % kFp4KvBlock != 0 || x.size() % static_cast<size_t>(K) != 0)
    throw InputError(fmt::format("{} bounds: {} values in rows of {}", what, x.size(), K));
  auto scale = [](double amax, bool exact) {
    const float a = std::max(static_cast<float>(amax), kFp4KvAmaxFloor);
    return f32_from_e4m3(e4m3_from_f32(exact ? static_cast<float>(static_cast<double>(a) / 6) : a / kE2m1Max));
  };
  auto qdq = [](double v, float s) {
    const float q = static_cast<float>(v) / s, c = q < -kE2m1Max ? -kE2m1Max : (q > kE2m1Max ? kE2m1Max : q);
    return static_cast<double>(round_bf16(f32_from_e2m1(e2m1_from_f32(c)) * s));
  };
  for (size_t b = 0; b < x.size() / static_cast<size_t>(kFp4KvBlock); ++b) {
    Interval* v = x.data() + b * static_cast<size_t>(kFp4KvBlock);
    double amax_lo = 0, amax_hi = 0;
    for (int64_t i = 0; i < kFp4KvBlock; ++i) {
      amax_lo = std::max(amax_lo, v[i].lo <= 0 && 0 <= v[i].hi ? 0 : std::min(std::fabs(v[i].lo), std::fabs(v[i].hi)));
      amax_hi = std::max({amax_hi, std::fabs(v[i].lo), std::fabs(v[i].hi)});
    }
    if (!std::isfinite(amax_hi)) {  // as in qdq_bounds: every value admissible, no scale to enumerate
      for (int64_t i = 0; i < kFp4KvBlock; ++i) v[i] = {-INFINITY, INFINITY};
      if (straddles)
        straddles->add(kFp4KvBlock, 1, fmt::format("{}, block {}: an input interval without finite ends", what, b));
      continue;
    }
    const float s_lo = std::min(scale(amax_lo, false), scale(amax_lo, true)), s_hi = std::max(scale(amax_hi, false), scale(amax_hi, true));
    // The e4m3 values from s_lo to s_hi, in code order (positive codes rise with their values).
    std::vector<float> scales;
    for (uint8_t code = e4m3_from_f32(s_lo); f32_from_e4m3(code) <= s_hi && code < 0x7F; ++code) scales.push_back(f32_from_e4m3(code));
    int64_t reached = 0;
    for (int64_t i = 0; i < kFp4KvBlock; ++i) {
      double lo = INFINITY, hi = -INFINITY;
      for (float sc : scales) lo = std::min(lo, qdq(v[i].lo, sc)), hi = std::max(hi, qdq(v[i].hi, sc));
      reached += lo != hi;
      v[i] = {lo, hi};
    }
    if (straddles && (reached > 0 || scales.size() > 1))
      straddles->add(reached, scales.size() > 1 ? 1 : 0,
                     fmt::format("{}, row {}, block {}: {} e2m1 values{}", what, b * kFp4KvBlock / static_cast<size_t>(K),
                                 b % (static_cast<size_t>(K) / kFp4KvBlock), reached,
                                 scales.size() > 1 ? fmt::format(" and {} scales", scales.size()) : ""));
  }
}

}  // namespace

void V41Straddles::add(int64_t v, int64_t s, const std::string& where) {
  if ((v > 0 || s > 0) && first.empty()) first = where;
  values += v;
  scales += s;
}

void v41_act_qdq_bounds(std::span<Interval> x, int64_t K, V41Straddles* straddles, const std::string& what) {
  qdq_bounds(x, K, kActQuant, straddles, what);
}

void v41_fp4_qdq_bounds(std::span<Interval> x, int64_t K, V41Straddles* straddles, const std::string& what) {
  qdq_bounds(x, K, kIndexFp4, straddles, what);
}

std::vector<BoundedValue> v41_linear_w_bounds(const V41Model& m, std::span<const Interval> x, int64_t M, const V41Linear& w,
                                              const bounds::BoundModel& model, int out_bits, V41Straddles* straddles,
                                              const std::string& what) {
  if (x.size() != static_cast<size_t>(M * w.in))
    throw InputError(fmt::format("linear bounds{}: {} inputs for [{}, {}]", what.empty() ? "" : " of " + what, x.size(), M, w.in));
  std::vector<Interval> q(x.begin(), x.end());
  if (m.regime() == V41Regime::release && w.kind != V41Linear::Kind::Plain)
    v41_act_qdq_bounds(q, w.in, straddles, "act_quant of " + what + "'s input");
  std::vector<double> lo(q.size()), hi(q.size());
  for (size_t i = 0; i < q.size(); ++i) lo[i] = q[i].lo, hi[i] = q[i].hi;
  return bounds::linear_bounds(lo, hi, M, w.in, w.w, w.out, model, out_bits);
}

std::vector<BoundedValue> v41_attn_x_bounds(const V41Model& m, int64_t layer, std::span<const double> streams,
                                            std::span<const double> pre_mix, int64_t N, const bounds::BoundModel& model) {
  const V41Config& c = m.config();
  const int64_t hc = c.hc_mult, D = c.dim;
  if (streams.size() != static_cast<size_t>(N * hc * D) || pre_mix.size() != static_cast<size_t>(N * hc))
    throw InputError(fmt::format("attn_x bounds: streams {} values, pre_mix {} for [{}, {}, {}]", streams.size(),
                                 pre_mix.size(), N, hc, D));
  // The collapse: hc fp32 products (inexact: fp32 weights times bf16 streams) summed in any order, bf16.
  std::vector<Interval> y(static_cast<size_t>(N * D));
#pragma omp parallel for schedule(static) if (N * D > (int64_t{1} << 16))
  for (int64_t t = 0; t < N; ++t)
    for (int64_t d = 0; d < D; ++d) {
      double v = 0, abs = 0;
      for (int64_t i = 0; i < hc; ++i) {
        const double p = pre_mix[static_cast<size_t>(t * hc + i)] * streams[static_cast<size_t>((t * hc + i) * D + d)];
        v += p;
        abs += std::fabs(p);
      }
      const double e = bounds::sum_error_bound(hc, abs, bounds::AccumulationModel::fp32(), false) + 0x1p-50 * abs;
      y[static_cast<size_t>(t * D + d)] = bounds::bounded_result(v, v - e, v + e, model.scale, 8).admissible;
    }
  std::vector<double> lo(y.size()), hi(y.size());
  for (size_t i = 0; i < y.size(); ++i) lo[i] = y[i].lo, hi[i] = y[i].hi;
  return bounds::rmsnorm_bounds(lo, hi, D, m.layer_weights(layer).attn_norm, c.norm_eps, model, 8);
}

namespace {
// The low-rank query both the attention and the indexer read: wq_a, then q_norm, each bf16.
std::vector<Interval> q_lora_intervals(const V41Model& m, int64_t layer, std::span<const Interval> x, int64_t N,
                                       const bounds::BoundModel& model, V41Straddles* straddles) {
  const V41LayerWeights& w = m.layer_weights(layer);
  const std::vector<Interval> qr = admissible_of(v41_linear_w_bounds(m, x, N, w.wq_a, model, 8, straddles, "wq_a"));
  return rmsnorm_intervals(qr, m.config().q_lora_rank, w.q_norm, m.config().norm_eps, model);
}
// A cast to bf16 where the regime keeps it (`rounded`), else the fp32 interval as it is.
Interval cast_if(Interval v, bool rounded) { return rounded ? bounds::rounded_nearest(v.lo, v.hi, 8) : v; }
}  // namespace

namespace {

// out[t, j, d] = post[t, j]·y[t, d] + Σ_i comb[t, i, j]·R[t, i, d]: hc + 1 fp32 products (inexact) summed in
// any order, bf16 (docs/sound-bounds.md §14.2). post [N, hc], comb [N, hc, hc] points; y [N, D], R [N, hc, D].
std::vector<BoundedValue> hc_post_bounds(std::span<const Interval> y, std::span<const Interval> R,
                                         std::span<const double> post, std::span<const double> comb, int64_t N,
                                         int64_t hc, int64_t D, const bounds::BoundModel& model) {
  std::vector<BoundedValue> out(static_cast<size_t>(N * hc * D));
  auto term = [](double w, Interval v, double& lo, double& hi, double& abs) {
    const double a = w * v.lo, b = w * v.hi;
    lo += std::min(a, b);
    hi += std::max(a, b);
    abs += std::max(std::fabs(a), std::fabs(b));
  };
#pragma omp parallel for schedule(static) if (N * D > (int64_t{1} << 16))
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < hc; ++j)
      for (int64_t d = 0; d < D; ++d) {
        double lo = 0, hi = 0, abs = 0;
        term(post[static_cast<size_t>(t * hc + j)], y[static_cast<size_t>(t * D + d)], lo, hi, abs);
        for (int64_t i = 0; i < hc; ++i)
          term(comb[static_cast<size_t>((t * hc + i) * hc + j)], R[static_cast<size_t>((t * hc + i) * D + d)], lo, hi, abs);
        const double e = bounds::sum_error_bound(hc + 1, abs, bounds::AccumulationModel::fp32(), false) + 0x1p-50 * abs;
        out[static_cast<size_t>((t * hc + j) * D + d)] = bounds::bounded_result((lo + hi) / 2, lo - e, hi + e, model.scale, 8);
      }
  return out;
}

// y[t, d] = Σ_i pre[t, i]·X[t, i, d], hc fp32 products summed in any order, bf16.
std::vector<Interval> hc_pre_intervals(std::span<const Interval> X, std::span<const double> pre, int64_t N, int64_t hc,
                                       int64_t D, const bounds::BoundModel& model) {
  if (X.size() != static_cast<size_t>(N * hc * D) || pre.size() != static_cast<size_t>(N * hc))
    throw InputError(fmt::format("hc collapse bounds: streams {} values, pre {} for [{}, {}, {}]", X.size(), pre.size(), N,
                                 hc, D));
  std::vector<Interval> y(static_cast<size_t>(N * D));
#pragma omp parallel for schedule(static) if (N * D > (int64_t{1} << 16))
  for (int64_t t = 0; t < N; ++t)
    for (int64_t d = 0; d < D; ++d) {
      double lo = 0, hi = 0, abs = 0;
      for (int64_t i = 0; i < hc; ++i) {
        const double w = pre[static_cast<size_t>(t * hc + i)];
        const Interval v = X[static_cast<size_t>((t * hc + i) * D + d)];
        lo += std::min(w * v.lo, w * v.hi);
        hi += std::max(w * v.lo, w * v.hi);
        abs += std::max(std::fabs(w * v.lo), std::fabs(w * v.hi));
      }
      const double e = bounds::sum_error_bound(hc, abs, bounds::AccumulationModel::fp32(), false) + 0x1p-50 * abs;
      y[static_cast<size_t>(t * D + d)] = bounds::bounded_result((lo + hi) / 2, lo - e, hi + e, model.scale, 8).admissible;
    }
  return y;
}

// σ(z) over an interval (it rises), with exp within the functions' ulps and a sum and a division rounded.
Interval sigmoid(Interval z, double fn) {
  auto f = [](double v) { return 1 / (1 + std::exp(-v)); };
  const double lo = f(z.lo), hi = f(z.hi);
  return {lo * (1 - fn - 3 * kU32) - kTiny, hi * (1 + fn + 3 * kU32) + kTiny};
}

}  // namespace

V41MixBounds v41_mix_bounds(const V41Model& m, int64_t layer, std::span<const Interval> X, int64_t N, bool ffn,
                            const bounds::BoundModel& model) {
  const V41Config& c = m.config();
  const int64_t hc = c.hc_mult, K = hc * c.dim;
  if (X.size() != static_cast<size_t>(N * K))
    throw InputError(fmt::format("hc mix bounds: {} values for [{}, {}, {}]", X.size(), N, hc, c.dim));
  const V41LayerWeights& w = m.layer_weights(layer);
  const std::vector<double>& fn = ffn ? w.hc_ffn_fn : w.hc_attn_fn;
  const std::vector<double>& scale = ffn ? w.hc_ffn_scale : w.hc_attn_scale;
  const std::vector<double>& base = ffn ? w.hc_ffn_base : w.hc_attn_base;
  const double fu = model.function_ulps * 0x1p-23;
  std::vector<double> lo(X.size()), hi(X.size());
  for (size_t i = 0; i < X.size(); ++i) lo[i] = X[i].lo, hi[i] = X[i].hi;
  // The first 2·hc rows of the projection (pre's and post's), fp32 (§5 on intervals).
  const auto lin = bounds::linear_bounds(lo, hi, N, K, std::span<const double>(fn).first(static_cast<size_t>(2 * hc * K)),
                                         2 * hc, model, 24);
  // rsqrt(mean(X²) + norm_eps) over the flattened row, as the RMSNorm's factor (§6 on intervals).
  const std::vector<double> ones(static_cast<size_t>(K), 1.0);
  const double e32 = static_cast<double>(static_cast<float>(c.hc_eps));
  const Interval eps{std::min(c.hc_eps, e32) * (1 - kU32), std::max(c.hc_eps, e32) * (1 + kU32)};
  V41MixBounds out;
  out.pre.resize(static_cast<size_t>(N * hc));
  out.post.resize(static_cast<size_t>(N * hc));
#pragma omp parallel for schedule(static) if (N * K > (int64_t{1} << 16))
  for (int64_t t = 0; t < N; ++t) {
    double s_lo = 0, s_hi = 0;
    for (int64_t i = 0; i < K; ++i) {
      const Interval v = X[static_cast<size_t>(t * K + i)];
      s_lo += v.lo <= 0 && 0 <= v.hi ? 0 : std::min(v.lo * v.lo, v.hi * v.hi);
      s_hi += std::max(v.lo * v.lo, v.hi * v.hi);
    }
    const double e_s = bounds::sum_error_bound(K, s_hi, model.accumulation, false) + 0x1p-50 * s_hi;
    const double n32 = static_cast<double>(static_cast<float>(c.norm_eps));
    const double t_lo = ((s_lo - e_s) / static_cast<double>(K) * (1 - 2 * kU32) + std::min(c.norm_eps, n32)) * (1 - kU32);
    const double t_hi = ((s_hi + e_s) / static_cast<double>(K) * (1 + 2 * kU32) + std::max(c.norm_eps, n32)) * (1 + kU32);
    const Interval rs{(1 - fu) * (1 - 2 * kU32) / std::sqrt(t_hi), (1 + fu) * (1 + 2 * kU32) / std::sqrt(std::max(t_lo, 0x1p-149))};
    for (int64_t i = 0; i < hc; ++i) {
      // z = mix · scale + base, each step one rounding; pre = σ(z) + eps, post = 2σ(z).
      auto z_of = [&](int64_t row, double sc, double b) {
        const Interval mix = times(lin[static_cast<size_t>(t * 2 * hc + row)].admissible, rs);
        const Interval p = times(mix, {sc, sc});
        return Interval{p.lo + b - kU32 * std::fabs(p.lo + b) - kTiny, p.hi + b + kU32 * std::fabs(p.hi + b) + kTiny};
      };
      const Interval sp = sigmoid(z_of(i, scale[0], base[static_cast<size_t>(i)]), fu);
      out.pre[static_cast<size_t>(t * hc + i)] = {(sp.lo + eps.lo) * (1 - kU32), (sp.hi + eps.hi) * (1 + kU32)};
      const Interval so = sigmoid(z_of(hc + i, scale[1], base[static_cast<size_t>(hc + i)]), fu);
      out.post[static_cast<size_t>(t * hc + i)] = {2 * so.lo, 2 * so.hi};
    }
  }
  return out;
}

bool v41_block_captured(const V41Config& c, const V41LayerCapture& o, int64_t N) {
  const int64_t hc = c.hc_mult, D = c.dim;
  const size_t streams = static_cast<size_t>(N * hc * D), rows = static_cast<size_t>(N * D);
  const size_t mixes = static_cast<size_t>(N * hc), combs = static_cast<size_t>(N * hc * hc);
  return o.in.size() == streams && o.attn_out.size() == rows && o.ffn_out.size() == rows && o.attn_post.size() == mixes &&
         o.attn_pre.size() == mixes && o.attn_comb.size() == combs && o.ffn_post.size() == mixes && o.ffn_comb.size() == combs;
}

V41BlockBounds v41_block_bounds(const V41Model& m, int64_t layer, const V41LayerCapture& o, int64_t N,
                                const bounds::BoundModel& model) {
  const V41Config& c = m.config();
  const int64_t hc = c.hc_mult, D = c.dim;
  if (!v41_block_captured(c, o, N))
    throw InputError(fmt::format("block bounds of layer {}: the run lacks a sublayer output or an hc mix for N {}", layer, N));
  V41BlockBounds b;
  const std::vector<Interval> in = points(o.in);
  b.attn_mixes = v41_mix_bounds(m, layer, in, N, false, model);
  // The attention's hc_post on its output, then the FFN's collapse (with the attention's pre), norm, mixes.
  b.streams = admissible_of(hc_post_bounds(points(o.attn_out), in, o.attn_post, o.attn_comb, N, hc, D, model));
  const std::vector<Interval> y = hc_pre_intervals(b.streams, o.attn_pre, N, hc, D, model);
  std::vector<double> lo(y.size()), hi(y.size());
  for (size_t i = 0; i < y.size(); ++i) lo[i] = y[i].lo, hi[i] = y[i].hi;
  b.ffn_x = bounds::rmsnorm_bounds(lo, hi, D, m.layer_weights(layer).ffn_norm, c.norm_eps, model, 8);
  b.ffn_mixes = v41_mix_bounds(m, layer, b.streams, N, true, model);
  b.out = hc_post_bounds(points(o.ffn_out), b.streams, o.ffn_post, o.ffn_comb, N, hc, D, model);
  return b;
}

std::vector<BoundedValue> v41_final_collapse_bounds(const V41Model& m, std::span<const BoundedValue> out,
                                                    std::span<const double> pre, int64_t N,
                                                    const bounds::BoundModel& model) {
  const V41Config& c = m.config();
  const std::vector<Interval> y = hc_pre_intervals(admissible_of(out), pre, N, c.hc_mult, c.dim, model);
  std::vector<BoundedValue> b(y.size());
  for (size_t i = 0; i < y.size(); ++i) b[i] = {(y[i].lo + y[i].hi) / 2, y[i], (y[i].lo + y[i].hi) / 2};
  return b;
}

V41CompressorBounds v41_compressor_bounds(const V41Model& m, int64_t layer, std::span<const double> x, int64_t N,
                                          const bounds::BoundModel& model) {
  const V41Config& c = m.config();
  const LayerPlan& lp = m.plan()[layer];
  const int64_t r = lp.ratio, hd = c.head_dim, ID = c.index_head_dim, T = r > 0 ? N / r : 0;
  if (r <= 0 || x.size() != static_cast<size_t>(N * c.dim))
    throw InputError(fmt::format("compressor bounds of layer {}: ratio {}, {} values for N {}", layer, r, x.size(), N));
  V41CompressorBounds out;
  if (T == 0) return out;
  const V41LayerWeights& w = m.layer_weights(layer);
  const fwd::Arith a(m.regime());
  const double fu = model.function_ulps * 0x1p-23;
  const std::vector<Interval> xi = points(x);
  std::vector<Interval> latent;
  if (r == 1) {  // wkv (bf16), no pooling
    latent = admissible_of(v41_linear_w_bounds(m, xi, N, w.compressor_wkv, model, 8, &out.latent_straddles, "the compressor's wkv"));
  } else {
    // The fp32 projections, then per group and channel the softmax of the scores over its r tokens and the
    // weighted sum (docs/sound-bounds.md §14.4): each weight e^{s - max} / Σ within e^{±Δ} of the exact (Δ
    // the score's half-width, the exp's ulps, the subtraction, the division, the product), the sums by the
    // any-order bound (docs/sound-bounds.md §2), the quotient's corners.
    const auto kv = v41_linear_w_bounds(m, xi, N, w.compressor_wkv, model, 24, &out.latent_straddles, "the compressor's wkv");
    const auto sc = v41_linear_w_bounds(m, xi, N, w.compressor_wgate, model, 24, &out.latent_straddles, "the compressor's wgate");
    latent.resize(static_cast<size_t>(T * hd));
    std::vector<double> p(static_cast<size_t>(r)), dl(static_cast<size_t>(r));
    for (int64_t g = 0; g < T; ++g)
      for (int64_t ch = 0; ch < hd; ++ch) {
        auto at = [&](int64_t i) { return static_cast<size_t>((g * r + i) * hd + ch); };
        double mx = -INFINITY, smag = 0;
        for (int64_t i = 0; i < r; ++i) mx = std::max(mx, sc[at(i)].value), smag = std::max(smag, std::fabs(sc[at(i)].value));
        double den_lo = 0, den_hi = 0, num_lo = 0, num_hi = 0, abs = 0, num = 0, den = 0;
        for (int64_t i = 0; i < r; ++i) {
          const Interval s = sc[at(i)].admissible;
          const double delta = std::max(s.hi - sc[at(i)].value, sc[at(i)].value - s.lo) + fu * (1 + fu) + 2 * kU32 * (smag + 1) + 3 * kU32;
          const double e = std::exp(sc[at(i)].value - mx), lo = e * std::exp(-delta), hi = e * std::exp(delta) + 0x1p-125;
          const Interval v = kv[at(i)].admissible;
          den += e, num += e * kv[at(i)].value;
          den_lo += lo, den_hi += hi;
          num_lo += std::min({lo * v.lo, lo * v.hi, hi * v.lo, hi * v.hi});
          num_hi += std::max({lo * v.lo, lo * v.hi, hi * v.lo, hi * v.hi});
          abs += hi * std::max(std::fabs(v.lo), std::fabs(v.hi));
        }
        const double e_num = bounds::sum_error_bound(r, abs, bounds::AccumulationModel::fp32(), false);
        const double e_den = bounds::sum_error_bound(r, den_hi, bounds::AccumulationModel::fp32(), true);
        num_lo -= e_num, num_hi += e_num, den_lo -= e_den, den_hi += e_den;
        const double q_lo = num_lo >= 0 ? num_lo / den_hi : num_lo / den_lo, q_hi = num_hi >= 0 ? num_hi / den_lo : num_hi / den_hi;
        latent[static_cast<size_t>(g * hd + ch)] =
            bounds::bounded_result(num / den, q_lo - kU32 * std::fabs(q_lo), q_hi + kU32 * std::fabs(q_hi), model.scale, 8).admissible;
      }
  }
  latent = rmsnorm_intervals(latent, hd, w.compressor_norm, c.norm_eps, model);
  const fwd::RopeTable rope = fwd::layer_rope(a, c, lp, N);
  auto as_bounded = [](const std::vector<Interval>& v) {
    std::vector<BoundedValue> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = {(v[i].lo + v[i].hi) / 2, v[i], (v[i].lo + v[i].hi) / 2};
    return b;
  };
  out.latent = as_bounded(latent);
  // Each group's rows at its first token's position j·r: a table whose row j is the table's row j·r.
  fwd::RopeTable grouped;
  grouped.half = rope.half;
  for (int64_t j = 0; j < T; ++j) {
    grouped.cos.insert(grouped.cos.end(), rope.cos.begin() + j * r * rope.half, rope.cos.begin() + (j * r + 1) * rope.half);
    grouped.sin.insert(grouped.sin.end(), rope.sin.begin() + j * r * rope.half, rope.sin.begin() + (j * r + 1) * rope.half);
  }
  if (lp.owns_index_k) {  // wk (bf16), k_norm, the RoPE, FP4 per 32
    std::vector<Interval> k = admissible_of(v41_linear_w_bounds(m, latent, T, w.indexer_wk, model, 8, &out.k_straddles, "wk"));
    k = rmsnorm_intervals(k, ID, w.indexer_k_norm, c.norm_eps, model);
    rope_bounds(k, T, 1, ID, grouped, false, fu);
    v41_fp4_qdq_bounds(k, ID, &out.k_straddles, "the index keys' FP4 QDQ");
    out.index_k = as_bounded(k);
  }
  std::vector<Interval> kv = latent;  // the RoPE, then FP4 per 16 with e4m3 scales
  rope_bounds(kv, T, 1, hd, grouped, false, fu);
  fp4_e4m3_qdq_bounds(kv, hd, &out.kv_straddles, "the compressed KV's FP4 QDQ");
  out.compress_kv = as_bounded(kv);
  return out;
}

std::vector<BoundedValue> v41_engram_bounds(const V41Model& m, int64_t layer, std::span<const double> streams,
                                            std::span<const int64_t> hash_ids, int64_t N, const bounds::BoundModel& model) {
  const V41Config& c = m.config();
  const V41LayerWeights& w = m.layer_weights(layer);
  const int64_t hc = c.hc_mult, D = c.dim, ed = c.engram_head_dim, cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  if (streams.size() != static_cast<size_t>(N * hc * D) || hash_ids.size() != static_cast<size_t>(N * cols))
    throw InputError(fmt::format("engram bounds of layer {}: streams {} values, hash ids {} for N {}", layer, streams.size(),
                                 hash_ids.size(), N));
  std::vector<Interval> emb(static_cast<size_t>(N * cols * ed));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t row = hash_ids[static_cast<size_t>(t * cols + j)];
      if (row < 0 || row >= w.engram_rows)
        throw InputError(fmt::format("engram bounds of layer {}: hash id {} outside the table", layer, row));
      for (int64_t e = 0; e < ed; ++e) {
        const double v = w.engram_table[static_cast<size_t>(row * ed + e)];
        emb[static_cast<size_t>((t * cols + j) * ed + e)] = {v, v};
      }
    }
  // Keys and the value: wkv of the looked-up rows, bf16 (§5).
  const std::vector<Interval> kv = admissible_of(v41_linear_w_bounds(m, emb, N, w.engram_wkv, model, 8, nullptr, "engram wkv"));
  const double fu = model.function_ulps * 0x1p-23, dd = static_cast<double>(D);
  const double e32 = static_cast<double>(static_cast<float>(c.norm_eps));
  const double eps_lo = std::min(c.norm_eps, e32), eps_hi = std::max(c.norm_eps, e32);
  // rsqrt(Σ/D + eps) over a sum's interval: the division, the sum with eps and 1/sqrt rounded (§6).
  auto rsqrt_of = [&](double s_lo, double s_hi) {
    const double t_lo = (s_lo / dd * (1 - kU32) + eps_lo) * (1 - kU32), t_hi = (s_hi / dd * (1 + kU32) + eps_hi) * (1 + kU32);
    return Interval{(1 - fu) * (1 - 2 * kU32) / std::sqrt(t_hi), (1 + fu) * (1 + 2 * kU32) / std::sqrt(std::max(t_lo, 0x1p-149))};
  };
  const double isd = std::pow(dd, -0.5);
  const Interval inv_sqrt_d{isd * (1 - kU32), isd * (1 + kU32)};
  std::vector<BoundedValue> out(streams.size());
#pragma omp parallel for schedule(static) if (N * D > (int64_t{1} << 16))
  for (int64_t t = 0; t < N; ++t) {
    const Interval* value = kv.data() + t * (hc + 1) * D + hc * D;
    for (int64_t ch = 0; ch < hc; ++ch) {
      const double* h = streams.data() + (t * hc + ch) * D;
      const Interval* key = kv.data() + t * (hc + 1) * D + ch * D;
      double hh = 0, kk_lo = 0, kk_hi = 0, d_lo = 0, d_hi = 0, d_abs = 0;
      for (int64_t d = 0; d < D; ++d) {
        hh += h[d] * h[d];
        const Interval k = key[d];
        kk_lo += k.lo <= 0 && 0 <= k.hi ? 0 : std::min(k.lo * k.lo, k.hi * k.hi);
        kk_hi += std::max(k.lo * k.lo, k.hi * k.hi);
        const double hw = h[d] * w.engram_q[static_cast<size_t>(ch * D + d)] * w.engram_k[static_cast<size_t>(ch * D + d)];
        d_lo += std::min(hw * k.lo, hw * k.hi);
        d_hi += std::max(hw * k.lo, hw * k.hi);
        d_abs += std::max(std::fabs(hw * k.lo), std::fabs(hw * k.hi));
      }
      // Three sums of D terms in any order; the dot's terms carry two more product roundings each.
      const double e_hh = bounds::sum_error_bound(D, hh, model.accumulation, true);
      const double e_kk = bounds::sum_error_bound(D, kk_hi, model.accumulation, false);
      const double e_d = bounds::sum_error_bound(D, d_abs, model.accumulation, false) + 3 * kU32 * d_abs + 0x1p-50 * d_abs;
      const Interval rstd = times(rsqrt_of(hh - e_hh, hh + e_hh), rsqrt_of(kk_lo - e_kk, kk_hi + e_kk));
      const Interval g = times(times({d_lo - e_d, d_hi + e_d}, rstd), inv_sqrt_d);
      // The gate σ(sign(g)·sqrt(max(|g|, 1e-6))): a rising function of g (with a step at 0), so its ends
      // are those of g's; the sqrt and the sigmoid within the functions' ulps and their roundings.
      auto signed_root = [&](double v) { return std::copysign(std::sqrt(std::max(std::fabs(v), 1e-6)), v); };
      const double r_lo = signed_root(g.lo), r_hi = signed_root(g.hi);
      const Interval root{r_lo - (fu + kU32) * std::fabs(r_lo), r_hi + (fu + kU32) * std::fabs(r_hi)};
      const Interval gate = sigmoid(root, fu);
      for (int64_t d = 0; d < D; ++d) {
        const Interval p = times(gate, value[d]);
        const double lo = h[d] + p.lo, hi = h[d] + p.hi;
        const size_t at = static_cast<size_t>((t * hc + ch) * D + d);
        out[at] = bounds::bounded_result(h[d] + (p.lo + p.hi) / 2, lo - kU32 * std::fabs(lo), hi + kU32 * std::fabs(hi),
                                         model.scale, 8);
      }
    }
  }
  return out;
}

std::vector<Interval> v41_index_score_bounds(const V41Model& m, int64_t layer, std::span<const double> x, int64_t N,
                                             std::span<const double> index_k, std::span<const uint8_t> candidates,
                                             const bounds::BoundModel& model, V41Straddles* straddles) {
  const V41Config& c = m.config();
  const LayerPlan& lp = m.plan()[layer];
  const int64_t r = lp.ratio, IH = c.index_n_heads, ID = c.index_head_dim, T = r > 0 ? N / r : 0;
  if (r <= 0 || x.size() != static_cast<size_t>(N * c.dim) || index_k.size() < static_cast<size_t>(T * ID) ||
      (!candidates.empty() && candidates.size() != static_cast<size_t>(N * T)))
    throw InputError(fmt::format("index score bounds of layer {}: x {} values for N {}, {} index keys of {}, {} candidates",
                                 layer, x.size(), N, index_k.size(), ID, candidates.size()));
  const fwd::Arith a(m.regime());
  const bool rounded = a.emulate && m.options().index_scores == V41IndexScores::bf16;
  const V41LayerWeights& w = m.layer_weights(layer);
  const std::vector<Interval> xi = points(x);
  // The indexer's query: wq_b of the low-rank query (bf16), RoPE, FP4 per 32.
  std::vector<Interval> q = admissible_of(
      v41_linear_w_bounds(m, q_lora_intervals(m, layer, xi, N, model, straddles), N, w.indexer_wq_b, model, 8, straddles,
                          "the indexer's wq_b"));
  rope_bounds(q, N, IH, ID, fwd::layer_rope(a, c, lp, N), false, model.function_ulps * 0x1p-23);
  v41_fp4_qdq_bounds(q, ID, straddles, "the index query's FP4 QDQ");
  // Each head's weight: weights_proj (bf16) times the constant index_head_dim^-0.5 · index_n_heads^-0.5 (in
  // fp32, from one product or two: within two fp32 ulps), bf16.
  const double ws = std::pow(static_cast<double>(ID), -0.5) * std::pow(static_cast<double>(IH), -0.5);
  const Interval wsi{ws * (1 - 4 * kU32), ws * (1 + 4 * kU32)};
  std::vector<Interval> wts = admissible_of(v41_linear_w_bounds(m, xi, N, w.indexer_weights_proj, model, 8, straddles,
                                                                "weights_proj"));
  for (Interval& v : wts) v = cast_if(times(v, wsi), a.emulate);
  // The dot products of each query head with every key (§5 on intervals, fp32), then per key the score.
  std::vector<double> lo(q.size()), hi(q.size());
  for (size_t i = 0; i < q.size(); ++i) lo[i] = q[i].lo, hi[i] = q[i].hi;
  std::vector<Interval> score(static_cast<size_t>(N * T), Interval{-INFINITY, -INFINITY});
  if (T == 0) return score;
  const auto dots = bounds::linear_bounds(lo, hi, N * IH, ID, index_k.first(static_cast<size_t>(T * ID)), T, model, 24);
  for (int64_t t = 0; t < N; ++t) {
    const int64_t visible = (t + 1) / r;
    for (int64_t j = 0; j < visible; ++j) {
      if (!candidates.empty() && !candidates[static_cast<size_t>(t * T + j)]) continue;
      double s_lo = 0, s_hi = 0, abs = 0;
      for (int64_t h = 0; h < IH; ++h) {
        const Interval d = cast_if(dots[static_cast<size_t>((t * IH + h) * T + j)].admissible, rounded);
        const Interval relu{std::max(0.0, d.lo), std::max(0.0, d.hi)};
        const Interval p = cast_if(times(relu, wts[static_cast<size_t>(t * IH + h)]), rounded);
        s_lo += p.lo;
        s_hi += p.hi;
        abs += std::max(std::fabs(p.lo), std::fabs(p.hi));
      }
      // The head sum in fp32 in any order, then bf16.
      const double e = bounds::sum_error_bound(IH, abs, bounds::AccumulationModel::fp32(), true);
      score[static_cast<size_t>(t * T + j)] =
          bounds::bounded_result((s_lo + s_hi) / 2, s_lo - e, s_hi + e, model.scale, rounded ? 8 : 24).admissible;
    }
  }
  return score;
}

V41QkvBounds v41_attention_qkv_bounds(const V41Model& m, int64_t layer, std::span<const double> x, int64_t N,
                                      const bounds::BoundModel& model, std::span<const int64_t> positions) {
  V41QkvBounds out;
  V41Straddles *sq = &out.q_straddles, *skv = &out.kv_straddles;
  const V41Config& c = m.config();
  const int64_t H = c.n_heads, hd = c.head_dim;
  if (x.size() != static_cast<size_t>(N * c.dim))
    throw InputError(fmt::format("attention q/kv bounds: {} values for [{}, {}]", x.size(), N, c.dim));
  const fwd::Arith a(m.regime());
  if (!positions.empty() && positions.size() != static_cast<size_t>(N))
    throw InputError(fmt::format("attention q/kv bounds: {} positions for {} rows", positions.size(), N));
  const int64_t span = positions.empty() ? N : *std::max_element(positions.begin(), positions.end()) + 1;
  const fwd::RopeTable rope = fwd::layer_rope(a, c, m.plan()[layer], span);
  const double fn = model.function_ulps * 0x1p-23;
  const V41LayerWeights& w = m.layer_weights(layer);
  const std::vector<Interval> xi = points(x);
  // q: wq_a, q_norm, wq_b (each bf16), RoPE.
  const std::vector<Interval> qr = q_lora_intervals(m, layer, xi, N, model, sq);
  std::vector<Interval> q = admissible_of(v41_linear_w_bounds(m, qr, N, w.wq_b, model, 8, sq, "wq_b"));
  rope_bounds(q, N, H, hd, rope, false, fn, 0, positions);
  // The window KV: wkv, kv_norm, RoPE, then the FP8 QDQ of the whole vector.
  std::vector<Interval> kv = admissible_of(v41_linear_w_bounds(m, xi, N, w.wkv, model, 8, skv, "wkv"));
  kv = rmsnorm_intervals(kv, hd, w.kv_norm, c.norm_eps, model);
  rope_bounds(kv, N, 1, hd, rope, false, fn, 0, positions);
  v41_act_qdq_bounds(kv, hd, skv, "the window KV's QDQ");
  auto bounded = [](const std::vector<Interval>& v) {
    std::vector<BoundedValue> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = {(v[i].lo + v[i].hi) / 2, v[i], (v[i].lo + v[i].hi) / 2};
    return b;
  };
  out.q = bounded(q);
  out.kv = bounded(kv);
  return out;
}

std::vector<BoundedValue> v41_attention_core_bounds(const V41Model& m, int64_t layer, std::span<const double> q,
                                                    std::span<const double> kv, std::span<const int32_t> idx, int64_t N,
                                                    const bounds::BoundModel& model, std::span<const uint8_t> needed) {
  const V41Config& c = m.config();
  const int64_t k = N > 0 ? static_cast<int64_t>(idx.size()) / N : 0;
  return bounds::sparse_attention_bounds(q, N, c.n_heads, c.head_dim, kv, m.layer_weights(layer).attn_sink, idx, k,
                                         std::pow(static_cast<double>(c.head_dim), -0.5), model, 8, 1, needed);
}

std::vector<BoundedValue> v41_attention_output_bounds(const V41Model& m, int64_t layer, std::span<const double> o,
                                                      int64_t N, const bounds::BoundModel& model, V41Straddles* straddles,
                                                      int64_t first, std::span<const int64_t> positions) {
  const V41Config& c = m.config();
  const int64_t H = c.n_heads, hd = c.head_dim, G = c.o_groups, R = c.o_lora_rank, gd = H * hd / G;
  if (o.size() != static_cast<size_t>(N * H * hd))
    throw InputError(fmt::format("attention output bounds: {} values for N {} of [{}, {}]", o.size(), N, H, hd));
  const fwd::Arith a(m.regime());
  if (!positions.empty() && positions.size() != static_cast<size_t>(N))
    throw InputError(fmt::format("attention output bounds: {} positions for {} rows", positions.size(), N));
  const int64_t span = positions.empty() ? first + N : *std::max_element(positions.begin(), positions.end()) + 1;
  const fwd::RopeTable rope = fwd::layer_rope(a, c, m.plan()[layer], span);
  std::vector<Interval> x = points(o);
  rope_bounds(x, N, H, hd, rope, true, model.function_ulps * 0x1p-23, first, positions);
  // wo_a by groups, a bf16 einsum on the dequantized weight.
  std::vector<Interval> og(static_cast<size_t>(N * G * R));
  const V41LayerWeights& w = m.layer_weights(layer);
  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> lo(static_cast<size_t>(N * gd)), hi(lo.size());
    for (int64_t t = 0; t < N; ++t)
      for (int64_t i = 0; i < gd; ++i) {
        const Interval& v = x[static_cast<size_t>((t * G + g) * gd + i)];
        lo[static_cast<size_t>(t * gd + i)] = v.lo, hi[static_cast<size_t>(t * gd + i)] = v.hi;
      }
    const auto y = bounds::linear_bounds(lo, hi, N, gd, std::span<const double>(w.wo_a.w).subspan(static_cast<size_t>(g * R * gd),
                                                                                                   static_cast<size_t>(R * gd)),
                                         R, model, 8);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t r = 0; r < R; ++r) og[static_cast<size_t>((t * G + g) * R + r)] = y[static_cast<size_t>(t * R + r)].admissible;
  }
  return v41_linear_w_bounds(m, og, N, w.wo_b, model, 8, straddles, "wo_b");
}

std::vector<BoundedValue> v41_moe_bounds(const V41Model& m, int64_t layer, std::span<const double> x, int64_t N,
                                         std::span<const int64_t> experts, const bounds::BoundModel& model,
                                         V41Straddles* straddles) {
  const V41Config& c = m.config();
  const int64_t D = c.dim, E = c.n_routed_experts, K = c.n_activated_experts;
  if (x.size() != static_cast<size_t>(N * D) || experts.size() != static_cast<size_t>(N * K))
    throw InputError(fmt::format("moe bounds: x {} values for [{}, {}], experts {} for [{}, {}]", x.size(), N, D,
                                 experts.size(), N, K));
  for (int64_t e : experts)
    if (e < 0 || e >= E) throw InputError(fmt::format("moe bounds: expert {} outside [0, {})", e, E));
  const auto router = v41_router_bounds(c, x, N, m.gate_weight(layer), m.gate_bias(layer), model);
  if (!router) return {};  // a router the derivation does not cover
  const V41LayerWeights& w = m.layer_weights(layer);
  const double fn = model.function_ulps * 0x1p-23, limit = c.swiglu_limit;
  std::vector<double> acc_lo(x.size(), 0), acc_hi(x.size(), 0), abs(x.size(), 0);
  // One expert on the rows `rows` (each with its route weight's interval, or none: the shared expert);
  // its result, bf16 or kept in fp32, added to the rows' sums.
  auto expert = [&](const V41ExpertWeights& ew, const std::vector<int64_t>& rows, const std::vector<Interval>* route,
                    const std::string& name) {
    const int64_t M = static_cast<int64_t>(rows.size()), I = ew.w1.out;
    std::vector<Interval> xe;
    for (int64_t t : rows)
      for (int64_t d = 0; d < D; ++d) xe.push_back({x[static_cast<size_t>(t * D + d)], x[static_cast<size_t>(t * D + d)]});
    const auto g = v41_linear_w_bounds(m, xe, M, ew.w1, model, 24, straddles, name + " w1");
    const auto u = v41_linear_w_bounds(m, xe, M, ew.w3, model, 24, straddles, name + " w3");
    std::vector<Interval> h(static_cast<size_t>(M * I));
    for (int64_t r = 0; r < M; ++r)
      for (int64_t i = 0; i < I; ++i) {
        const size_t at = static_cast<size_t>(r * I + i);
        Interval gi = either_rounded(g[at].admissible), ui = either_rounded(u[at].admissible);
        if (limit > 0) {
          gi = {std::min(gi.lo, limit), std::min(gi.hi, limit)};
          ui = {std::clamp(ui.lo, -limit, limit), std::clamp(ui.hi, -limit, limit)};
        }
        Interval hv = times(silu(gi, fn), ui);
        if (route) hv = times((*route)[static_cast<size_t>(r)], hv);
        h[at] = either_rounded(hv);
      }
    const auto y = v41_linear_w_bounds(m, h, M, ew.w2, model, 24, straddles, name + " w2");
    for (int64_t r = 0; r < M; ++r)
      for (int64_t d = 0; d < D; ++d) {
        const Interval v = either_rounded(y[static_cast<size_t>(r * D + d)].admissible);
        const size_t at = static_cast<size_t>(rows[static_cast<size_t>(r)] * D + d);
        acc_lo[at] += v.lo;
        acc_hi[at] += v.hi;
        abs[at] += std::max(std::fabs(v.lo), std::fabs(v.hi));
      }
  };
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> rows;
    std::vector<Interval> route;
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < K; ++j)
        if (experts[static_cast<size_t>(t * K + j)] == e) {
          rows.push_back(t);
          route.push_back(v41_route_weight_bounds(c, *router, t, experts.subspan(static_cast<size_t>(t * K), static_cast<size_t>(K)),
                                                  model)[static_cast<size_t>(j)]);
        }
    if (!rows.empty()) expert(w.experts[static_cast<size_t>(e)], rows, &route, fmt::format("expert {}", e));
  }
  std::vector<int64_t> all(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) all[static_cast<size_t>(t)] = t;
  expert(w.shared, all, nullptr, "the shared expert");
  // The K + 1 results summed in fp32 in any order (§2), then bf16.
  std::vector<BoundedValue> out(x.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const double e = bounds::sum_error_bound(K + 1, abs[i], bounds::AccumulationModel::fp32(), true);
    out[i] = bounds::bounded_result((acc_lo[i] + acc_hi[i]) / 2, acc_lo[i] - e, acc_hi[i] + e, model.scale, 8);
  }
  return out;
}

}  // namespace ced::v41
