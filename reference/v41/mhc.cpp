// docs/v41.md §8.3: the hyper-connections (model.py Block.hc_mixes / hc_pre / hc_post and the
// kernel's hc_split_sinkhorn), all fp32 in the bf16 regime.
#include <algorithm>

#include "reference/v41/forward_ops.hpp"
#include "reference/v41/lanes.hpp"

namespace ced::v41::fwd {

void hc_split_sinkhorn(const Arith& a, const double* m, int64_t hc, std::span<const double> scale,
                       std::span<const double> base, int64_t iters, double eps_in, double* pre, double* post,
                       double* comb) {
  const double eps = a.c(eps_in);
  for (int64_t i = 0; i < hc; ++i) {
    pre[i] = a.add(a.sigmoid(a.add(a.mul(m[i], scale[0]), base[static_cast<size_t>(i)])), eps);
    post[i] = a.mul(2.0, a.sigmoid(a.add(a.mul(m[hc + i], scale[1]), base[static_cast<size_t>(hc + i)])));
  }
  // comb = row-softmax(m · s2 + b) + eps (exp(x - max) / sum), one column normalisation, then
  // iters - 1 rounds of (row, column) normalisation, each divisor + eps. comb[i * hc + j]: row i.
  for (int64_t i = 0; i < hc; ++i) {
    double* row = comb + i * hc;
    for (int64_t j = 0; j < hc; ++j)
      row[j] = a.add(a.mul(m[2 * hc + i * hc + j], scale[2]), base[static_cast<size_t>(2 * hc + i * hc + j)]);
    double mx = row[0];
    for (int64_t j = 1; j < hc; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < hc; ++j) {
      row[j] = a.exp(a.sub(row[j], mx));
      sum = a.add(sum, row[j]);
    }
    for (int64_t j = 0; j < hc; ++j) row[j] = a.add(a.div(row[j], sum), eps);
  }
  // Divide each row (rows) or column (!rows) by its sum + eps, the sum in index order.
  auto normalise = [&](bool rows) {
    for (int64_t line = 0; line < hc; ++line) {
      auto at = [&](int64_t m) -> double& { return rows ? comb[line * hc + m] : comb[m * hc + line]; };
      double s = 0.0;
      for (int64_t m = 0; m < hc; ++m) s = a.add(s, at(m));
      const double d = a.add(s, eps);
      for (int64_t m = 0; m < hc; ++m) at(m) = a.div(at(m), d);
    }
  };
  normalise(false);
  for (int64_t it = 0; it + 1 < iters; ++it) {
    normalise(true);
    normalise(false);
  }
}

HcMix hc_mixes(const Arith& a, std::span<const double> X, int64_t N, int64_t hc, int64_t dim,
               std::span<const double> fn, std::span<const double> scale, std::span<const double> base,
               double norm_eps, int64_t iters, double hc_eps) {
  const int64_t K = hc * dim, nm = (2 + hc) * hc;
  std::vector<double> mixes(static_cast<size_t>(N * nm));
  linear(a, X, N, K, fn, nm, mixes, false);  // fp32 in, fp32 out
  HcMix out;
  out.pre.resize(static_cast<size_t>(N * hc));
  out.post.resize(static_cast<size_t>(N * hc));
  out.comb.resize(static_cast<size_t>(N * hc * hc));
  const double e = a.c(norm_eps);
  std::vector<double> ss(static_cast<size_t>(N));
  row_sum_squares(a, X, K, ss);
  for (int64_t t = 0; t < N; ++t) {
    const double rs = a.rsqrt(a.add(a.div(ss[static_cast<size_t>(t)], static_cast<double>(K)), e));
    double* m = mixes.data() + t * nm;
    for (int64_t j = 0; j < nm; ++j) m[j] = a.mul(m[j], rs);
    hc_split_sinkhorn(a, m, hc, scale, base, iters, hc_eps, out.pre.data() + t * hc, out.post.data() + t * hc,
                      out.comb.data() + t * hc * hc);
  }
  return out;
}

namespace {

// hc_pre and hc_post a token at a time, a lane per channel d (lanes.hpp): each output's sum in
// stream order with one rounding per op, as Arith's scalar loop; the channels past the last whole
// vector take the same ops one at a time.

// y[d] = bf16(Σ_i pre[i] · X[i, d]).
template <typename T>
[[gnu::always_inline]] inline void hc_pre_token(const double* X, const double* pre, int64_t hc, int64_t dim,
                                                double* y) {
  constexpr int64_t L = kLanes<T>;
  int64_t d = 0;
  for (; d + L <= dim; d += L) {
    Vec<T> s = {}, x;
    for (int64_t i = 0; i < hc; ++i) {
      load_lanes<T>(x, X + i * dim + d);
      s = s + static_cast<T>(pre[i]) * x;
    }
    bf_lanes<T>(s);
    store_lanes<T>(y + d, s);
  }
  for (; d < dim; ++d) {
    T s = 0;
    for (int64_t i = 0; i < hc; ++i) s = s + static_cast<T>(pre[i]) * static_cast<T>(X[i * dim + d]);
    y[d] = bf_of<T>(s);
  }
}

// out[j, d] = bf16(post[j] · y[d] + Σ_i comb[i, j] · R[i, d]): a vector of channels at a time for
// every j, so that each stream's vector is read (and converted) once for all of them.
constexpr int64_t kMaxHc = 8;
template <typename T>
[[gnu::always_inline]] inline void hc_post_token(const double* y, const double* R, const double* post,
                                                 const double* comb, int64_t hc, int64_t dim, double* out) {
  constexpr int64_t L = kLanes<T>;
  int64_t d = 0;
  if (hc <= kMaxHc)
    for (; d + L <= dim; d += L) {
      Vec<T> r[kMaxHc], x;
      for (int64_t i = 0; i < hc; ++i) load_lanes<T>(r[i], R + i * dim + d);
      load_lanes<T>(x, y + d);
      for (int64_t j = 0; j < hc; ++j) {
        Vec<T> s = {};
        for (int64_t i = 0; i < hc; ++i) s = s + static_cast<T>(comb[i * hc + j]) * r[i];
        Vec<T> o = static_cast<T>(post[j]) * x + s;
        bf_lanes<T>(o);
        store_lanes<T>(out + j * dim + d, o);
      }
    }
  for (int64_t j = 0; j < hc; ++j)
    for (int64_t e = d; e < dim; ++e) {
      T s = 0;
      for (int64_t i = 0; i < hc; ++i) s = s + static_cast<T>(comb[i * hc + j]) * static_cast<T>(R[i * dim + e]);
      out[j * dim + e] = bf_of<T>(static_cast<T>(post[j]) * static_cast<T>(y[e]) + s);
    }
}

// The kernels over N tokens, T float under the emulating regimes (_f32) and double under f64 (_f64).
V41_KERNEL void hc_pre_f32(const double* X, const double* pre, int64_t N, int64_t hc, int64_t dim, double* y) {
  for (int64_t t = 0; t < N; ++t) hc_pre_token<float>(X + t * hc * dim, pre + t * hc, hc, dim, y + t * dim);
}
V41_KERNEL void hc_pre_f64(const double* X, const double* pre, int64_t N, int64_t hc, int64_t dim, double* y) {
  for (int64_t t = 0; t < N; ++t) hc_pre_token<double>(X + t * hc * dim, pre + t * hc, hc, dim, y + t * dim);
}
V41_KERNEL void hc_post_f32(const double* y, const double* R, const double* post, const double* comb, int64_t N,
                            int64_t hc, int64_t dim, double* out) {
  for (int64_t t = 0; t < N; ++t)
    hc_post_token<float>(y + t * dim, R + t * hc * dim, post + t * hc, comb + t * hc * hc, hc, dim,
                         out + t * hc * dim);
}
V41_KERNEL void hc_post_f64(const double* y, const double* R, const double* post, const double* comb, int64_t N,
                            int64_t hc, int64_t dim, double* out) {
  for (int64_t t = 0; t < N; ++t)
    hc_post_token<double>(y + t * dim, R + t * hc * dim, post + t * hc, comb + t * hc * hc, hc, dim,
                          out + t * hc * dim);
}

}  // namespace

std::vector<double> hc_pre(const Arith& a, std::span<const double> X, std::span<const double> pre, int64_t N,
                           int64_t hc, int64_t dim) {
  std::vector<double> y(static_cast<size_t>(N * dim));
  (a.emulate ? hc_pre_f32 : hc_pre_f64)(X.data(), pre.data(), N, hc, dim, y.data());
  return y;
}

std::vector<double> hc_post(const Arith& a, std::span<const double> y, std::span<const double> R,
                            std::span<const double> post, std::span<const double> comb, int64_t N, int64_t hc,
                            int64_t dim) {
  std::vector<double> out(static_cast<size_t>(N * hc * dim));
  (a.emulate ? hc_post_f32 : hc_post_f64)(y.data(), R.data(), post.data(), comb.data(), N, hc, dim, out.data());
  return out;
}

}  // namespace ced::v41::fwd
