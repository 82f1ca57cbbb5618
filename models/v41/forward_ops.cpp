// docs/v41.md §8: linear, RMSNorm, RoPE/YaRN, the quantization points and torch's top-k.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "models/v41/forward_ops.hpp"

namespace ced::v41::fwd {

void linear(const Arith& a, std::span<const double> X, int64_t M, int64_t K, std::span<const double> W,
            int64_t Nout, std::span<double> Y, bool out_bf16) {
#pragma omp parallel for schedule(static) if (M * K * Nout > kParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    const double* x = X.data() + m * K;
    for (int64_t o = 0; o < Nout; ++o) {
      const double* w = W.data() + o * K;
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc = a.add(acc, a.mul(x[k], w[k]));
      Y[static_cast<size_t>(m * Nout + o)] = out_bf16 ? a.bf(acc) : acc;
    }
  }
}

void linear_w(const Arith& a, std::span<const double> X, int64_t M, const V41Linear& w, std::span<double> Y,
              bool out_bf16) {
  if (!a.release || w.kind == V41Linear::Kind::Plain) return linear(a, X, M, w.in, w.w, w.out, Y, out_bf16);
  const int64_t K = w.in, N = w.out, nb = K / kFp8Block, tiles_in = (K + 31) / 32;
  std::vector<float> xf(X.begin(), X.end()), xs(static_cast<size_t>(M * nb));
  std::vector<uint8_t> codes(xf.size());
  act_quant(xf, K, codes, xs);
#pragma omp parallel for schedule(static) if (M * K * N > kParallelWork)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < N; ++o) {
      double acc = 0.0;
      for (int64_t b = 0; b < nb; ++b) {
        const double ws = w.kind == V41Linear::Kind::Fp8Tiles ? w.scale[static_cast<size_t>((o / 32) * tiles_in + b)]
                                                              : w.scale[static_cast<size_t>(o * nb + b)];
        double part = 0.0;
        for (int64_t k = b * kFp8Block; k < (b + 1) * kFp8Block; ++k) {
          const double ac = f32_from_e4m3(codes[static_cast<size_t>(m * K + k)]);
          const double wc = w.w[static_cast<size_t>(o * K + k)] / ws;  // the code's value: exact
          part = a.add(part, a.mul(ac, wc));
        }
        acc = a.add(acc, a.mul(a.mul(part, xs[static_cast<size_t>(m * nb + b)]), ws));
      }
      Y[static_cast<size_t>(m * N + o)] = out_bf16 ? a.bf(acc) : acc;
    }
}

void rmsnorm(const Arith& a, std::span<double> x, int64_t n, std::span<const double> w, double eps) {
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  const double e = a.c(eps);
  for (int64_t r = 0; r < rows; ++r) {
    double* p = x.data() + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss = a.add(ss, a.mul(p[i], p[i]));
    const double rs = a.rsqrt(a.add(a.div(ss, static_cast<double>(n)), e));
    for (int64_t i = 0; i < n; ++i) p[i] = a.bf(a.mul(w[static_cast<size_t>(i)], a.mul(p[i], rs)));
  }
}

RopeTable rope_table(const Arith& a, int64_t rope_head_dim, int64_t N, int64_t original_seq_len, double theta,
                     double factor, int64_t beta_fast, int64_t beta_slow) {
  const int64_t d = rope_head_dim, half = d / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const double ex = a.div(static_cast<double>(2 * i), static_cast<double>(d));
    const double p = a.emulate ? std::pow(static_cast<float>(theta), static_cast<float>(ex)) : std::pow(theta, ex);
    f[static_cast<size_t>(i)] = a.div(1.0, p);
  }
  if (original_seq_len > 0) {
    // corrected_dim, low and high in python's double arithmetic, as precompute_freqs_cis has them.
    auto corrected = [&](double rotations) {
      return static_cast<double>(d) * std::log(static_cast<double>(original_seq_len) / (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(theta));
    };
    const double low = std::max(std::floor(corrected(static_cast<double>(beta_fast))), 0.0);
    const double high = std::min(std::ceil(corrected(static_cast<double>(beta_slow))), static_cast<double>(d - 1));
    const double span = a.c(std::max(high - low, 1e-3));
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp(a.div(a.sub(static_cast<double>(i), low), span), 0.0, 1.0);
      const double smooth = a.sub(1.0, ramp);
      double& fi = f[static_cast<size_t>(i)];
      fi = a.add(a.mul(a.div(fi, a.c(factor)), a.sub(1.0, smooth)), a.mul(fi, smooth));
    }
  }
  RopeTable t;
  t.half = half;
  t.cos.resize(static_cast<size_t>(N * half));
  t.sin.resize(static_cast<size_t>(N * half));
  for (int64_t p = 0; p < N; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double ang = a.mul(static_cast<double>(p), f[static_cast<size_t>(i)]);
      t.cos[static_cast<size_t>(p * half + i)] = a.cos(ang);
      t.sin[static_cast<size_t>(p * half + i)] = a.sin(ang);
    }
  return t;
}

void apply_rope(const Arith& a, double* x, int64_t d, const RopeTable& t, int64_t pos, bool inverse) {
  double* v = x + (d - 2 * t.half);
  for (int64_t i = 0; i < t.half; ++i) {
    const double c = t.cos[static_cast<size_t>(pos * t.half + i)], s = t.sin[static_cast<size_t>(pos * t.half + i)];
    const double x0 = v[2 * i], x1 = v[2 * i + 1];
    // (x0 + i x1)(c + i s), or by the conjugate (c - i s); each product rounded, then the sum.
    const double re = inverse ? a.add(a.mul(x0, c), a.mul(x1, s)) : a.sub(a.mul(x0, c), a.mul(x1, s));
    const double im = inverse ? a.sub(a.mul(x1, c), a.mul(x0, s)) : a.add(a.mul(x0, s), a.mul(x1, c));
    v[2 * i] = a.bf(re);
    v[2 * i + 1] = a.bf(im);
  }
}

namespace {
template <typename Fn32, typename Fn64>
void qdq(const Arith& a, std::span<double> x, int64_t K, Fn32 f32, Fn64 f64) {
  if (!a.emulate) return f64(x, K);
  std::vector<float> v(x.begin(), x.end());
  f32(std::span<float>(v), K);
  std::copy(v.begin(), v.end(), x.begin());
}
}  // namespace

void qdq_fp8_32(const Arith& a, std::span<double> x, int64_t K) { qdq(a, x, K, act_qdq, act_qdq_f64); }
void qdq_fp4_32(const Arith& a, std::span<double> x, int64_t K) {
  qdq(a, x, K, fp4_qdq_ue8m0_32, fp4_qdq_ue8m0_32_f64);
}
void qdq_fp4_e4m3_16(const Arith& a, std::span<double> x, int64_t K) {
  qdq(a, x, K, fp4_qdq_e4m3_16, fp4_qdq_e4m3_16_f64);
}

namespace {
template <typename T>
std::vector<int64_t> topk_as(std::span<const double> values, int64_t k, bool sorted) {
  using Elem = std::pair<T, int64_t>;
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<Elem> q(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) q[static_cast<size_t>(j)] = {static_cast<T>(values[static_cast<size_t>(j)]), j};
  auto above = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  if (k > 0) {
    if (k * 64 <= n) {
      std::partial_sort(q.begin(), q.begin() + k, q.end(), above);
    } else {
      std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), above);
      if (sorted) std::sort(q.begin(), q.begin() + (k - 1), above);
    }
  }
  std::vector<int64_t> out(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) out[static_cast<size_t>(j)] = q[static_cast<size_t>(j)].second;
  return out;
}
}  // namespace

std::vector<int64_t> torch_topk(std::span<const double> values, int64_t k, bool sorted, bool as_fp32) {
  return as_fp32 ? topk_as<float>(values, k, sorted) : topk_as<double>(values, k, sorted);
}

}  // namespace ced::v41::fwd
