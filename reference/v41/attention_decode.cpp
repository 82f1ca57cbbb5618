// docs/v41.md §8.8: one layer's attention in a decode step (model.py Attention.forward, Compressor and
// Indexer with start_pos > 0 and one token): the window ring, the compressor's group, the indexer over
// every key so far, and sparse_attn over [ring | compressed rows] with the compressed indices offset by
// the ring's W rows.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/error.hpp"
#include "reference/v41/forward_ops.hpp"

namespace ced::v41::fwd {
namespace {

using Vec = std::vector<double>;

// The window indices of a decode step at position p: the ring's W slots oldest first (slot p % W + 1
// onwards, then from 0), a slot past p (the ring still filling) -1 (model.py get_window_topk_idxs).
std::vector<int32_t> ring_idxs(int64_t p, int64_t W) {
  std::vector<int32_t> idx;
  const int64_t oldest = p % W + 1;
  for (int64_t i = 0; i < W; ++i) {
    const int64_t slot = (oldest + i) % W;
    idx.push_back(slot > p ? -1 : static_cast<int32_t>(slot));
  }
  return idx;
}

// Where a group completed at step p is rotated: its first token, p + 1 - ratio (the planted fault: p).
int64_t group_position(const LayerCtx& L, int64_t p) {
  return L.fault == V41Fault::decode_group_rope_at_step ? p : p + 1 - L.lp.ratio;
}

// The compressor of a kv source at step p: the RoPE-free latent [1, head_dim] when this token completes
// a group, else empty (model.py Compressor.forward, the decode branch).
Vec compressor_step(const LayerCtx& L, std::span<const double> x, V41LayerCache& cache, int64_t p) {
  const int64_t r = L.lp.ratio, hd = L.c.head_dim;
  Vec latent;
  if (r == 1) {
    latent = linear_out(L, x, 1, L.w.compressor_wkv, true);
  } else {
    const Vec kv = linear_out(L, x, 1, L.w.compressor_wkv, false), score = linear_out(L, x, 1, L.w.compressor_wgate, false);
    const int64_t slot = p % r;
    std::copy(kv.begin(), kv.end(), cache.kv_state.begin() + slot * hd);
    std::copy(score.begin(), score.end(), cache.score_state.begin() + slot * hd);
    if ((p + 1) % r != 0) return {};
    latent = compress_pool(L.a, cache.kv_state, cache.score_state, r, hd, r);
  }
  rmsnorm(L.a, latent, hd, L.w.compressor_norm, L.c.norm_eps);
  return latent;
}

// The indexer of an index source at step p (model.py Indexer.forward, decode): publishes this step's
// index key (an owner whose group completed), scores the query against the published keys of the
// (p + 1) / ratio complete groups, publishes or applies the candidate pool, and returns the selection
// [1, min(index_topk, groups)], offset by W.
std::vector<int32_t> indexer_step(const LayerCtx& L, std::span<const double> x, std::span<const double> qr,
                                  const Vec& latent, V41DecodeState& st, V41LayerCapture& cap, int64_t p) {
  const V41Config& c = L.c;
  const int64_t r = L.lp.ratio, IH = c.index_n_heads, ID = c.index_head_dim, T = (p + 1) / r;
  V41LayerCache& own = st.layers[static_cast<size_t>(L.lp.layer)];
  if (L.lp.owns_index_k) {
    if (!latent.empty()) {
      Vec k = linear_out(L, latent, 1, L.w.indexer_wk, true);
      rmsnorm(L.a, k, ID, L.w.indexer_k_norm, c.norm_eps);
      const int64_t at = group_position(L, p);
      rope_rows(L, k, 1, 1, ID, [at](int64_t) { return at; }, false);
      qdq_fp4_32(L.a, k, ID);
      own.index_k.insert(own.index_k.end(), k.begin(), k.end());
      cap.index_k = k;
    }
    // model.py republishes only with a new key; the mended ports point at their own keys every step.
    if (!latent.empty() || L.options.decode_index_k == V41DecodeIndexK::owner) st.index_k_from = L.lp.layer;
  }
  if (st.index_k_from < 0) throw InputError(fmt::format("v41 decode layer {}: no index keys were published", L.lp.layer));
  const Vec& keys = st.layers[static_cast<size_t>(st.index_k_from)].index_k;
  if (static_cast<int64_t>(keys.size()) < T * ID)
    throw InputError(fmt::format("v41 decode layer {}: the published index keys (layer {}) hold {} rows, {} needed",
                                 L.lp.layer, st.index_k_from, keys.size() / static_cast<size_t>(ID), T));
  Vec q = linear_out(L, qr, 1, L.w.indexer_wq_b, true);
  rope_rows(L, q, 1, IH, ID, [p](int64_t) { return p; }, false);
  qdq_fp4_32(L.a, q, ID);
  const Vec wts = index_weights(L, x, 1);
  Vec dots(static_cast<size_t>(IH * T));
  if (L.fault == V41Fault::index_cache_offset) {  // the planted port bug: rows read one group late, the last empty
    Vec late(static_cast<size_t>(T * ID), 0.0);
    std::copy(keys.begin() + ID, keys.begin() + T * ID, late.begin());
    linear(L.a, q, IH, ID, late, T, dots, false);
  } else {
    linear(L.a, q, IH, ID, std::span<const double>(keys).first(static_cast<size_t>(T * ID)), T, dots, false);
  }
  Vec score(static_cast<size_t>(T));
  index_scores(L, dots.data(), T, wts.data(), score.data());

  const double ninf = -std::numeric_limits<double>::infinity();
  if (L.lp.candidate_source) {
    st.candidates.assign(static_cast<size_t>(T), 0);
    candidate_blocks(score, T, c.candidate_topk_blocks, c.candidate_block_size, L.a.emulate, st.candidates,
                     L.options.topk_ties);
    cap.candidates = st.candidates;
  } else if (L.lp.cand_src >= 0) {
    if (static_cast<int64_t>(st.candidates.size()) != T)
      throw InputError(fmt::format("v41 decode layer {}: the candidate pool has {} groups, the layer {}", L.lp.layer,
                                   st.candidates.size(), T));
    for (int64_t j = 0; j < T; ++j)
      if (!st.candidates[static_cast<size_t>(j)]) score[static_cast<size_t>(j)] = ninf;
  }
  if (L.capture) cap.index_score = score;
  std::vector<int32_t> idx(static_cast<size_t>(std::min(c.index_topk, T)));
  select_row(L, score, T, c.window_size, idx);
  return idx;
}

}  // namespace

std::vector<double> attention_decode(const LayerCtx& L, std::span<const double> x, V41DecodeState& st,
                                     V41LayerCapture& cap) {
  const V41Config& c = L.c;
  const int64_t H = c.n_heads, hd = c.head_dim, r = L.lp.ratio, W = c.window_size, p = st.pos;
  auto at_p = [p](int64_t) { return p; };
  V41LayerCache& own = st.layers[static_cast<size_t>(L.lp.layer)];

  Vec qr = linear_out(L, x, 1, L.w.wq_a, true);
  rmsnorm(L.a, qr, c.q_lora_rank, L.w.q_norm, c.norm_eps);
  Vec q = linear_out(L, qr, 1, L.w.wq_b, true);
  if (L.fault == V41Fault::v4_q_norm) rmsnorm(L.a, q, hd, std::vector<double>(static_cast<size_t>(hd), 1.0), c.norm_eps);
  rope_rows(L, q, 1, H, hd, at_p, false);

  // The window KV of this token into its ring slot; the step attends the whole ring.
  Vec kv = linear_out(L, x, 1, L.w.wkv, true);
  rmsnorm(L.a, kv, hd, L.w.kv_norm, c.norm_eps);
  rope_rows(L, kv, 1, 1, hd, at_p, false);
  qdq_fp8_32(L.a, kv, hd);
  std::copy(kv.begin(), kv.end(), own.window.begin() + (p % W) * hd);
  Vec rows = own.window;
  std::vector<int32_t> idx = ring_idxs(p, W);

  if (r > 0) {
    const int64_t T = (p + 1) / r;
    Vec latent;
    if (L.lp.owns_compressor) {
      latent = compressor_step(L, x, own, p);
      st.compress_kv_from = L.lp.layer;
      if (L.capture && !latent.empty()) cap.latent = latent;
    }
    if (L.lp.owns_indexer) {
      st.topk_idxs = T == 0 ? std::vector<int32_t>{} : indexer_step(L, x, qr, latent, st, cap, p);
      st.topk = static_cast<int64_t>(st.topk_idxs.size());
      cap.topk = st.topk;
      cap.topk_idxs = st.topk_idxs;
    }
    if (!latent.empty()) {  // RoPE at the group's first token, FP4 per 16 with e4m3 scales, into the cache
      const int64_t at = group_position(L, p);
      if (L.fault != V41Fault::unrotated_compressed_keys) rope_rows(L, latent, 1, 1, hd, [at](int64_t) { return at; }, false);
      qdq_fp4_e4m3_16(L.a, latent, hd);
      own.compress_kv.insert(own.compress_kv.end(), latent.begin(), latent.end());
      cap.compress_kv = latent;
    }
    if (st.compress_kv_from < 0) throw InputError(fmt::format("v41 decode layer {}: no compressed KV was published", L.lp.layer));
    const Vec& ckv = st.layers[static_cast<size_t>(st.compress_kv_from)].compress_kv;
    if (static_cast<int64_t>(ckv.size()) < T * hd)
      throw InputError(fmt::format("v41 decode layer {}: the compressed KV (layer {}) holds {} rows, {} needed", L.lp.layer,
                                   st.compress_kv_from, ckv.size() / static_cast<size_t>(hd), T));
    rows.insert(rows.end(), ckv.begin(), ckv.begin() + T * hd);
    idx.insert(idx.end(), st.topk_idxs.begin(), st.topk_idxs.end());
  }
  const int64_t k = static_cast<int64_t>(idx.size());
  Vec o(static_cast<size_t>(H * hd));
  sparse_attn(L.a, q, 1, H, hd, rows, L.w.attn_sink, idx, k, std::pow(static_cast<double>(hd), -0.5), o);
  if (L.capture) {
    cap.attn_q = q;
    cap.attn_kv = rows;
    cap.attn_idx = idx;
    cap.attn_o = o;
  }
  rope_rows(L, o, 1, H, hd, at_p, true);
  return grouped_output(L, o, 1);
}

}  // namespace ced::v41::fwd
