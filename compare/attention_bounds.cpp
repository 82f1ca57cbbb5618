// docs/sound-bounds.md §12: admissible results of softmax attention with a sink; see attention_bounds.hpp.
#include "compare/attention_bounds.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "model/error.hpp"

namespace ced::bounds {

namespace {

constexpr double kU32 = 0x1p-24;    // fp32's unit roundoff
constexpr double kU64 = 0x1p-53;    // the reference's own f64 arithmetic
constexpr double kBf16 = 0x1p-8;    // a probability rounded to bf16 before P·V: its unit roundoff (8 significant bits)
constexpr double kTiny = 0x1p-125;  // a probability that underflows in fp32 or bf16: absolute

}  // namespace

std::vector<BoundedValue> sparse_attention_bounds(std::span<const double> q, int64_t N, int64_t H, int64_t d,
                                                  std::span<const double> kv, std::span<const double> sink,
                                                  std::span<const int32_t> idxs, int64_t k, double scale,
                                                  const BoundModel& model, int out_bits, int64_t block,
                                                  std::span<const uint8_t> needed) {
  if (N < 0 || H < 1 || d < 1 || k < 0 || block < 1 || q.size() != static_cast<size_t>(N * H * d) ||
      (!needed.empty() && needed.size() != static_cast<size_t>(N * H)) ||
      kv.size() % static_cast<size_t>(d) != 0 || sink.size() != static_cast<size_t>(H) ||
      idxs.size() != static_cast<size_t>(N * k) || !(scale > 0))
    throw InputError(fmt::format("attention bounds: q {} values for [{}, {}, {}], kv {} (rows of {}), sink {}, idxs {} "
                                 "for [{}, {}], scale {}", q.size(), N, H, d, kv.size(), d, sink.size(), idxs.size(), N, k, scale));
  const int64_t rows = static_cast<int64_t>(kv.size()) / d;
  for (int32_t j : idxs)
    if (j < -1 || j >= rows) throw InputError(fmt::format("attention bounds: index {} outside [-1, {})", j, rows));
  // The scale as given or rounded to fp32 (docs/sound-bounds.md §12.1); every fp32 exp within the model's ulps.
  const double c32 = static_cast<double>(static_cast<float>(scale));
  const double c_lo = std::min(scale, c32), c_hi = std::max(scale, c32);
  const double fn = model.function_ulps * 0x1p-23;
  const int64_t blocks = (k + block - 1) / block;
  const double ref = gamma(d + k + 16, kU64);
  std::vector<BoundedValue> out(q.size());
  // Each query's outputs are its own: queries in parallel, each thread with its own scratch (the same
  // bits on any thread count).
#pragma omp parallel if (N * H * k * d > (int64_t{1} << 18))
  {
  std::vector<int32_t> live;
  std::vector<double> s, err, p, p_lo, p_hi, acc_num, acc_lo, acc_hi, acc_abs;
#pragma omp for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    live.clear();
    for (int64_t i = 0; i < k; ++i)
      if (idxs[static_cast<size_t>(t * k + i)] >= 0) live.push_back(idxs[static_cast<size_t>(t * k + i)]);
    const size_t n = live.size();
    for (int64_t h = 0; h < H; ++h) {
      const double* qh = q.data() + (t * H + h) * d;
      BoundedValue* o = out.data() + (t * H + h) * d;
      if (!needed.empty() && !needed[static_cast<size_t>(t * H + h)]) continue;
      if (n == 0) {  // no key: the numerator is an empty sum
        for (int64_t c = 0; c < d; ++c) o[c] = {0, {0, 0}, 0};
        continue;
      }
      // Each score in f64 with the bound of its fp32 dot product (§5) and of the scale's two values.
      s.assign(n, 0);
      err.assign(n, 0);
      double smax = -INFINITY, sabs = std::fabs(sink[static_cast<size_t>(h)]);
      for (size_t j = 0; j < n; ++j) {
        const double* kj = kv.data() + static_cast<int64_t>(live[j]) * d;
        // Four partial sums each, which the compiler may put in vector lanes (the reference's own order is
        // free: `ref` bounds its rounding in any order).
        double dot4[4] = {}, abs4[4] = {};
        int64_t c = 0;
        for (; c + 4 <= d; c += 4)
          for (int lane = 0; lane < 4; ++lane) {
            const double pr = qh[c + lane] * kj[c + lane];
            dot4[lane] += pr;
            abs4[lane] += std::fabs(pr);
          }
        for (; c < d; ++c) dot4[0] += qh[c] * kj[c], abs4[0] += std::fabs(qh[c] * kj[c]);
        const double dot = (dot4[0] + dot4[1]) + (dot4[2] + dot4[3]), abs = (abs4[0] + abs4[1]) + (abs4[2] + abs4[3]);
        s[j] = scale * dot;
        err[j] = c_hi * (sum_error_bound(d, abs, model.accumulation, false) + ref * abs) + (c_hi - c_lo) * std::fabs(dot);
        smax = std::max(smax, s[j]);
        sabs = std::max(sabs, std::fabs(s[j]) + err[j]);
      }
      // A probability's relative error as a factor e^{±Δ}: its score's error, three roundings of the score
      // (the scale's product, a folded log2(e), the subtraction of a running max, each within u of the
      // largest magnitude), and per block of the online softmax one exp and one rescale
      // (docs/sound-bounds.md §12.1, §12.2).
      const double per_exp = fn * (1 + fn) + 2 * kU32 + 2 * kU32 * sabs;
      const double common = static_cast<double>(blocks + 1) * per_exp + ref;
      p.assign(n, 0);
      p_lo.assign(n, 0);
      p_hi.assign(n, 0);
      double den = 0, den_lo = 0, den_hi = 0;
      for (size_t j = 0; j < n; ++j) {
        p[j] = std::exp(s[j] - smax);
        const double delta = err[j] + 3 * kU32 * std::fabs(s[j]) + common;
        den += p[j];
        p_lo[j] = std::max(0.0, p[j] * std::exp(-delta) * (1 - kBf16) - kTiny);
        p_hi[j] = p[j] * std::exp(delta) * (1 + kBf16) + kTiny;
        den_lo += p_lo[j];
        den_hi += p_hi[j];
      }
      const double ps = std::exp(sink[static_cast<size_t>(h)] - smax);
      den += ps;
      // The sink's probability as any other's: a port may round it to bf16 too.
      den_lo += std::max(0.0, ps * std::exp(-common) * (1 - kBf16) - kTiny);
      den_hi += ps * std::exp(common) * (1 + kBf16) + kTiny;
      // The sums' own roundings: k terms, a rescale and a block sum per block, the sink (§2).
      const int64_t terms = static_cast<int64_t>(n) + 2 * blocks + 2;
      const double e_den = sum_error_bound(terms, den_hi, model.accumulation, false);
      den_lo = (den_lo - e_den) * (1 - ref);
      den_hi = (den_hi + e_den) * (1 + ref);
      // Key by key over contiguous rows, every channel at once: each term's least and largest product.
      acc_num.assign(static_cast<size_t>(d), 0);
      acc_lo.assign(static_cast<size_t>(d), 0);
      acc_hi.assign(static_cast<size_t>(d), 0);
      acc_abs.assign(static_cast<size_t>(d), 0);
      for (size_t j = 0; j < n; ++j) {
        const double* row = kv.data() + static_cast<int64_t>(live[j]) * d;
        const double pj = p[j], lo_j = p_lo[j], hi_j = p_hi[j];
        for (int64_t c = 0; c < d; ++c) {
          const double v = row[c];
          acc_num[static_cast<size_t>(c)] += pj * v;
          const double a = lo_j * v, b = hi_j * v;
          acc_lo[static_cast<size_t>(c)] += std::min(a, b);
          acc_hi[static_cast<size_t>(c)] += std::max(a, b);
          acc_abs[static_cast<size_t>(c)] += hi_j * std::fabs(v);
        }
      }
      for (int64_t c = 0; c < d; ++c) {
        const double num = acc_num[static_cast<size_t>(c)], abs = acc_abs[static_cast<size_t>(c)];
        double lo = acc_lo[static_cast<size_t>(c)], hi = acc_hi[static_cast<size_t>(c)];
        const double e_num = sum_error_bound(terms, abs, model.accumulation, false) + ref * abs;
        lo -= e_num;
        hi += e_num;
        // num / den over the corners (den > 0), then the division's rounding, or a reciprocal's two.
        double r_lo = lo >= 0 ? lo / den_hi : lo / den_lo, r_hi = hi >= 0 ? hi / den_lo : hi / den_hi;
        if (!(den_lo > 0)) r_lo = -INFINITY, r_hi = INFINITY;  // a denominator the bound cannot keep from 0
        const double value = num / den;
        o[c] = bounded_result(value, r_lo - 2 * kU32 * std::fabs(r_lo), r_hi + 2 * kU32 * std::fabs(r_hi), model.scale,
                              out_bits);
      }
    }
  }
  }  // omp parallel
  return out;
}

}  // namespace ced::bounds
