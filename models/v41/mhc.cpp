// docs/v41.md §8.3: the hyper-connections (model.py Block.hc_mixes / hc_pre / hc_post and the
// kernel's hc_split_sinkhorn), all fp32 in the bf16 regime.
#include <algorithm>

#include "models/v41/forward_ops.hpp"

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
  for (int64_t t = 0; t < N; ++t) {
    const double* x = X.data() + t * K;
    double ss = 0.0;
    for (int64_t k = 0; k < K; ++k) ss = a.add(ss, a.mul(x[k], x[k]));
    const double rs = a.rsqrt(a.add(a.div(ss, static_cast<double>(K)), e));
    double* m = mixes.data() + t * nm;
    for (int64_t j = 0; j < nm; ++j) m[j] = a.mul(m[j], rs);
    hc_split_sinkhorn(a, m, hc, scale, base, iters, hc_eps, out.pre.data() + t * hc, out.post.data() + t * hc,
                      out.comb.data() + t * hc * hc);
  }
  return out;
}

std::vector<double> hc_pre(const Arith& a, std::span<const double> X, std::span<const double> pre, int64_t N,
                           int64_t hc, int64_t dim) {
  std::vector<double> y(static_cast<size_t>(N * dim));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      double s = 0.0;
      for (int64_t i = 0; i < hc; ++i)
        s = a.add(s, a.mul(pre[static_cast<size_t>(t * hc + i)], X[static_cast<size_t>((t * hc + i) * dim + d)]));
      y[static_cast<size_t>(t * dim + d)] = a.bf(s);
    }
  return y;
}

std::vector<double> hc_post(const Arith& a, std::span<const double> y, std::span<const double> R,
                            std::span<const double> post, std::span<const double> comb, int64_t N, int64_t hc,
                            int64_t dim) {
  std::vector<double> out(static_cast<size_t>(N * hc * dim));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < hc; ++j)
      for (int64_t d = 0; d < dim; ++d) {
        double s = 0.0;
        for (int64_t i = 0; i < hc; ++i)
          s = a.add(s, a.mul(comb[static_cast<size_t>((t * hc + i) * hc + j)],
                             R[static_cast<size_t>((t * hc + i) * dim + d)]));
        const double p = a.mul(post[static_cast<size_t>(t * hc + j)], y[static_cast<size_t>(t * dim + d)]);
        out[static_cast<size_t>((t * hc + j) * dim + d)] = a.bf(a.add(p, s));
      }
  return out;
}

}  // namespace ced::v41::fwd
