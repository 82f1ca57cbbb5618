// docs/v41.md §9.2: Engram (model.py Engram, ParallelEngramEmbedding; engram.py NgramHashState):
// the n-gram hash ids of a prompt and the gated lookup added to the four streams.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/error.hpp"
#include "reference/v41/forward_ops.hpp"

namespace ced::v41 {

std::vector<int64_t> v41_halving_token_map(const V41Config& c) {
  std::vector<int64_t> m(static_cast<size_t>(c.vocab_size));
  std::iota(m.begin(), m.end(), 0);
  for (int64_t& v : m) v /= 2;
  return m;
}

namespace fwd {

void engram_forward(const LayerCtx& L, std::span<double> streams, std::span<const int64_t> hash_ids) {
  const V41Config& c = L.c;
  const Arith& a = L.a;
  const int64_t N = L.N, hc = c.hc_mult, D = c.dim, ed = c.engram_head_dim;
  const int64_t cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  // The rows the hash ids name (bf16 values), flattened to [N, cols · ed], through wkv: [N, (hc + 1) D].
  std::vector<double> emb(static_cast<size_t>(N * cols * ed));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t row = hash_ids[static_cast<size_t>(t * cols + j)];
      if (row < 0 || row >= L.w.engram_rows)
        throw InputError("v41 engram: a hash id lies outside the table (" + std::to_string(row) + ")");
      std::copy_n(L.w.engram_table.begin() + row * ed, ed, emb.begin() + (t * cols + j) * ed);
    }
  std::vector<double> kv(static_cast<size_t>(N * (hc + 1) * D));
  linear_w(a, emb, N, L.w.engram_wkv, kv, true);

  const double eps = a.c(c.norm_eps), inv_sqrt_d = a.c(std::pow(static_cast<double>(D), -0.5));
  for (int64_t t = 0; t < N; ++t) {
    const double* value = kv.data() + t * (hc + 1) * D + hc * D;
    for (int64_t ch = 0; ch < hc; ++ch) {
      double* h = streams.data() + (t * hc + ch) * D;
      const double* key = kv.data() + t * (hc + 1) * D + ch * D;
      double hh = 0.0, kk = 0.0, dot = 0.0;
      for (int64_t d = 0; d < D; ++d) {
        hh = a.add(hh, a.mul(h[d], h[d]));
        kk = a.add(kk, a.mul(key[d], key[d]));
        const double wgt = a.mul(L.w.engram_q[static_cast<size_t>(ch * D + d)], L.w.engram_k[static_cast<size_t>(ch * D + d)]);
        dot = a.add(dot, a.mul(a.mul(h[d], wgt), key[d]));
      }
      // rstd = rsqrt(mean(h²) + eps) · rsqrt(mean(key²) + eps); dot · rstd · D^-0.5; the signed sqrt.
      const double rstd = a.mul(a.rsqrt(a.add(a.div(hh, static_cast<double>(D)), eps)),
                                a.rsqrt(a.add(a.div(kk, static_cast<double>(D)), eps)));
      const double g = a.mul(a.mul(dot, rstd), inv_sqrt_d);
      const double gate = a.sigmoid(std::copysign(a.sqrt(std::max(std::fabs(g), a.c(1e-6))), g));
      for (int64_t d = 0; d < D; ++d) h[d] = a.bf(a.add(h[d], a.mul(gate, value[d])));
    }
  }
}

}  // namespace fwd
}  // namespace ced::v41
