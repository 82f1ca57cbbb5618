#pragma once
// Per-element maths shared by the CUDA kernels and their host tests.
// This header compiles with nvcc (__host__ __device__) and with a plain C++
// compiler (CED_HD expands to nothing), so unit-tests/cuda_device_math_test.cpp
// checks on the host exactly the functions the kernels call.
//
// Accumulation type: float everywhere (the CUDA model is an f32 model), except
// the RoPE angle, which is computed in double and rounded once. Sums run
// sequentially in index order (the reference's stated orders); the model's
// other orders are the RMSNorm sum of squares (a fixed tree, kernels.cu) and
// the cuBLAS products.
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#define CED_HD __host__ __device__
#else
#define CED_HD
#endif

namespace ced::cuda {

// docs/spec.md §3: θ = pos · rope_theta^(−2i/rope_dim) for pair i of the rotated dims.
CED_HD inline double rope_angle(int64_t pos, int64_t i, int64_t rope_dim, double rope_theta) {
  return static_cast<double>(pos) * pow(rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
}

// docs/spec.md §3: (a, b) → (a cos θ − b sin θ, a sin θ + b cos θ).
CED_HD inline void rope_rotate_pair(float& a, float& b, float cos_t, float sin_t) {
  const float a0 = a, b0 = b;
  a = a0 * cos_t - b0 * sin_t;
  b = a0 * sin_t + b0 * cos_t;
}

// docs/spec.md §3: inverse RoPE = rotation by −θ: (a, b) → (a cos θ + b sin θ, −a sin θ + b cos θ).
CED_HD inline void rope_unrotate_pair(float& a, float& b, float cos_t, float sin_t) {
  const float a0 = a, b0 = b;
  a = a0 * cos_t + b0 * sin_t;
  b = b0 * cos_t - a0 * sin_t;
}

// Offset of the first rotated element of a vector of `dim` elements (the
// last rope_dim dims are rotated).
CED_HD inline int64_t rope_offset(int64_t dim, int64_t rope_dim) { return dim - rope_dim; }

// softplus(x) = log(1 + e^x), in the form that neither overflows nor loses
// small values: max(x, 0) + log1p(e^−|x|).
CED_HD inline float softplus(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

// docs/spec.md §3.7: s_e = sqrt(softplus(router logit)).
CED_HD inline float router_score(float logit) { return sqrtf(softplus(logit)); }

// The value a score ranks by: itself, except that a NaN ranks below every
// number (as −∞), so that the orders below stay total whatever the inputs.
CED_HD inline float rank_key(float s) { return s != s ? -INFINITY : s; }

// docs/spec.md §3.7: expert a ranks before expert b: larger s + bias first, ties → lower e.
CED_HD inline bool route_before(float va, int64_t ea, float vb, int64_t eb) {
  const float ka = rank_key(va), kb = rank_key(vb);
  return ka > kb || (ka == kb && ea < eb);
}

// docs/spec.md §3.4: entry (or block) a ranks before b in a top-k: higher score first,
// equal scores → larger id first. Scores compare as real numbers, so −0 == +0.
CED_HD inline bool topk_before(float sa, int64_t ia, float sb, int64_t ib) {
  const float ka = rank_key(sa), kb = rank_key(sb);
  return ka > kb || (ka == kb && ia > ib);
}

// docs/spec.md §3.4: ReLU as used by the index score (a NaN dot product stays NaN-free: 0).
CED_HD inline float relu(float x) { return x > 0.0f ? x : 0.0f; }

// docs/spec.md §3.7: silu(v) = v · sigmoid(v).
CED_HD inline float silu(float x) { return x / (1.0f + expf(-x)); }

// docs/spec.md §3.3: global entry j of ratio r is visible to query p iff (j+1)·r − 1 ≤ p.
CED_HD inline bool entry_visible(int64_t j, int64_t r, int64_t p) { return (j + 1) * r - 1 <= p; }

// Number of global entries visible to query p (ids 0 .. n−1): floor((p+1)/r).
CED_HD inline int64_t n_visible(int64_t p, int64_t r) { return (p + 1) / r; }

// Entries completed by the first `n_tokens` tokens (the same count as n_visible(n_tokens − 1)).
CED_HD inline int64_t n_complete_entries(int64_t n_tokens, int64_t r) { return n_tokens / r; }

// docs/spec.md §4/§5/§6: lo(p) = max(first evaluated position of the layer, p − W + 1).
CED_HD inline int64_t window_lo(int64_t first, int64_t p, int64_t W) {
  const int64_t w = p - W + 1;
  return first > w ? first : w;
}

// docs/spec.md §3.4 candidate pool: blocks holding at least one visible entry.
CED_HD inline int64_t pool_n_blocks(int64_t n_vis, int64_t block_size) {
  return (n_vis + block_size - 1) / block_size;
}

// The block holding the newest visible entry (always kept, ranks first); −1 if none.
CED_HD inline int64_t pool_pinned_block(int64_t n_vis, int64_t block_size) {
  return n_vis > 0 ? (n_vis - 1) / block_size : -1;
}

// Number of blocks in the pool of a query with n_vis visible entries.
CED_HD inline int64_t pool_size(int64_t n_vis, int64_t block_size, int64_t topk_blocks) {
  const int64_t nb = pool_n_blocks(n_vis, block_size);
  return nb < topk_blocks ? nb : topk_blocks;
}

// bf16 bits of x, rounded to nearest even: the device's own conversion
// (__float2bfloat16_rn) in device code; elsewhere the same rounding written
// out (a NaN becomes the canonical quiet NaN 0x7FFF, as on the device).
CED_HD inline uint16_t bf16_bits_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#else
  if (x != x) return 0x7FFF;
  uint32_t u = 0;
  memcpy(&u, &x, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
#endif
}

// The float a bf16 value stands for (exact).
CED_HD inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x = 0.0f;
  memcpy(&x, &u, sizeof x);
  return x;
}

// Entry j is in block j / block_size.
CED_HD inline int64_t pool_block_of(int64_t j, int64_t block_size) { return j / block_size; }


// ---- Small serial routines: one thread runs each; the host tests run them too. ----

// Σ_i a[i]·b[i] in index order.
CED_HD inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// docs/spec.md §3.4: I[p, j] = Σ_h w_h · ReLU(iq_h · ik_j); iq [n_heads·dim], w [n_heads], key [dim].
CED_HD inline float index_score(const float* iq, const float* w, const float* key, int64_t n_heads, int64_t dim) {
  float s = 0.0f;
  for (int64_t h = 0; h < n_heads; ++h) s += w[h] * relu(dot(iq + h * dim, key, dim));
  return s;
}

// docs/spec.md §3.3, r ≥ 2, one channel of one block: Σ_t softmax_t(z_t) · c_t over the
// block's r tokens; c and z point at token 0 of the block, rows `stride` apart.
CED_HD inline float compress_channel(const float* c, const float* z, int64_t stride, int64_t r) {
  float m = z[0];
  for (int64_t t = 1; t < r; ++t)
    if (z[t * stride] > m) m = z[t * stride];
  float den = 0.0f;
  for (int64_t t = 0; t < r; ++t) den += expf(z[t * stride] - m);
  float acc = 0.0f;
  for (int64_t t = 0; t < r; ++t) acc += (expf(z[t * stride] - m) / den) * c[t * stride];
  return acc;
}

// docs/spec.md §3.5: softmax over n logits plus the sink logit, which joins the
// denominator and has no value. Replaces logits[e] by its weight.
CED_HD inline void softmax_with_sink(float* logits, int64_t n, float sink) {
  float m = sink;
  for (int64_t e = 0; e < n; ++e)
    if (logits[e] > m) m = logits[e];
  float den = expf(sink - m);
  for (int64_t e = 0; e < n; ++e) den += expf(logits[e] - m);
  for (int64_t e = 0; e < n; ++e) logits[e] = expf(logits[e] - m) / den;
}

// Repeated argmax under topk_before (the selections below): a candidate may be
// picked at a step iff it ranks strictly after the previous pick.
CED_HD inline bool ranks_after(bool have_prev, float prev_s, int64_t prev_id, float s, int64_t id) {
  return !have_prev || topk_before(prev_s, prev_id, s, id);
}

// Keeps the better of the running best (best_id < 0: none yet) and (s, id).
CED_HD inline void keep_best(float& best_s, int64_t& best_id, float s, int64_t id) {
  if (best_id < 0 || topk_before(s, id, best_s, best_id)) {
    best_s = s;
    best_id = id;
  }
}

// docs/spec.md §3.4 candidate pool of one query with n_vis visible entries
// (scores [n_vis]): block scores (max of the block's visible entries) go to
// block_scores [pool_n_blocks]; pool [topk_blocks] receives the pinned block
// (newest visible entry) first, then the best other blocks in rank order
// (higher score, equal → larger block id), −1 padded.
CED_HD inline void candidate_pool_query(const float* scores, int64_t n_vis, int64_t block_size, int64_t topk_blocks,
                                        float* block_scores, int32_t* pool) {
  for (int64_t k = 0; k < topk_blocks; ++k) pool[k] = -1;
  const int64_t nb = pool_n_blocks(n_vis, block_size);
  if (nb == 0) return;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t j0 = b * block_size;
    const int64_t j1 = (j0 + block_size < n_vis) ? j0 + block_size : n_vis;
    float m = rank_key(scores[j0]);
    for (int64_t j = j0 + 1; j < j1; ++j)
      if (rank_key(scores[j]) > m) m = rank_key(scores[j]);
    block_scores[b] = m;
  }
  const int64_t pinned = pool_pinned_block(n_vis, block_size);
  pool[0] = static_cast<int32_t>(pinned);
  bool have_prev = false;
  float prev_s = 0.0f;
  int64_t prev_id = -1;
  for (int64_t k = 1; k < topk_blocks; ++k) {
    float best_s = 0.0f;
    int64_t best_id = -1;
    for (int64_t b = 0; b < nb; ++b) {
      if (b == pinned || !ranks_after(have_prev, prev_s, prev_id, block_scores[b], b)) continue;
      keep_best(best_s, best_id, block_scores[b], b);
    }
    if (best_id < 0) return;
    pool[k] = static_cast<int32_t>(best_id);
    have_prev = true;
    prev_s = best_s;
    prev_id = best_id;
  }
}

// docs/spec.md §3.4: S(p) = the k highest-ranked eligible entries in rank order,
// −1 padded to k. Eligible: the n_vis visible entries (pool == nullptr), or
// the visible entries of the pool's blocks (pool [topk_blocks], −1 padded).
// out_scores [k + 1] (docs/spec.md §9.1), when given: the score of each chosen
// entry (NaN where out is −1), then the score of the best eligible entry left
// out (NaN when none is): one more step of the same argmax.
CED_HD inline void select_topk_query(const float* scores, int64_t n_vis, const int32_t* pool, int64_t block_size,
                                     int64_t topk_blocks, int64_t k, int32_t* out, float* out_scores = nullptr) {
  const int64_t n_slots = pool ? topk_blocks * block_size : n_vis;
  const int64_t steps = out_scores ? k + 1 : k;
  bool have_prev = false;
  float prev_s = 0.0f;
  int64_t prev_id = -1;
  int64_t t = 0;
  for (; t < steps; ++t) {
    float best_s = 0.0f;
    int64_t best_id = -1;
    for (int64_t slot = 0; slot < n_slots; ++slot) {
      int64_t j = slot;
      if (pool) {
        const int32_t blk = pool[slot / block_size];
        if (blk < 0) continue;
        j = static_cast<int64_t>(blk) * block_size + slot % block_size;
      }
      if (j >= n_vis || !ranks_after(have_prev, prev_s, prev_id, scores[j], j)) continue;
      keep_best(best_s, best_id, scores[j], j);
    }
    if (best_id < 0) break;
    if (t == k) {  // the best entry left out
      out_scores[k] = best_s;
      return;
    }
    out[t] = static_cast<int32_t>(best_id);
    if (out_scores) out_scores[t] = best_s;
    have_prev = true;
    prev_s = best_s;
    prev_id = best_id;
  }
  for (; t < k; ++t) {
    out[t] = -1;
    if (out_scores) out_scores[t] = NAN;
  }
  if (out_scores) out_scores[k] = NAN;
}

// docs/spec.md §3.7 routing of one position: s [R] = routing scores, bias [R].
// Writes the n_active chosen experts in rank order (largest s + bias, ties →
// lower e) to chosen [n_active] and their weights (s_e / Σ_chosen s) ·
// routed_scaling_factor to weights [n_active]; Σ_chosen s runs in ascending
// expert order.
CED_HD inline void route_select(const float* s, const float* bias, int64_t R, int64_t n_active,
                                float routed_scaling_factor, int32_t* chosen, float* weights) {
  float prev_v = 0.0f;
  int64_t prev_e = -1, n_chosen = 0;
  for (int64_t k = 0; k < n_active; ++k) {
    int64_t best = -1;
    float bv = 0.0f;
    for (int64_t e = 0; e < R; ++e) {
      const float v = s[e] + bias[e];
      if (prev_e >= 0 && !route_before(prev_v, prev_e, v, e)) continue;
      if (best < 0 || route_before(v, e, bv, best)) {
        best = e;
        bv = v;
      }
    }
    if (best < 0) break;
    chosen[k] = static_cast<int32_t>(best);
    prev_v = bv;
    prev_e = best;
    ++n_chosen;
  }
  float sum = 0.0f;
  for (int64_t e = 0; e < R; ++e)
    for (int64_t k = 0; k < n_chosen; ++k)
      if (chosen[k] == e) sum += s[e];
  for (int64_t k = 0; k < n_active; ++k) {
    if (k < n_chosen) {
      weights[k] = (s[chosen[k]] / sum) * routed_scaling_factor;
    } else {
      chosen[k] = -1;
      weights[k] = 0.0f;
    }
  }
}

}  // namespace ced::cuda
