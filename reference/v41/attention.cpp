// docs/v41.md §8.5, §8.6: one layer's attention (model.py Attention, Compressor, Indexer) in a
// prefill from position 0: the low-rank query, the window KV, the compressed KV and index keys of a
// kv source, the selection of an index source, the candidate pool, sparse_attn with the sink, the
// inverse rotation and the grouped output projection.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/error.hpp"
#include "reference/v41/forward_ops.hpp"

namespace ced::v41::fwd {
namespace {

using Vec = std::vector<double>;

constexpr auto lin = linear_out;

// The compressor of a kv source (model.py Compressor.forward) on x's N rows, the first of them a group's
// first token: the RoPE-free latent [N / ratio, head_dim], or empty when no group is complete. Seeding
// decode, the trailing N % ratio tokens' projections wait in the cache's group state.
Vec compressor(const LayerCtx& L, std::span<const double> x, int64_t N) {
  const int64_t r = L.lp.ratio, hd = L.c.head_dim;
  Vec latent;
  if (r == 1) {  // norm(wkv(x)): a bf16 linear, no gate
    latent = lin(L, x, N, L.w.compressor_wkv, true);
  } else {  // fp32 projections of x.float(), the softmax pooling, then kv.to(bf16)
    if (N < r && !L.cache) return {};
    const Vec kv = lin(L, x, N, L.w.compressor_wkv, false), score = lin(L, x, N, L.w.compressor_wgate, false);
    if (L.cache) {
      const int64_t cut = N - N % r;
      L.cache->kv_state.assign(static_cast<size_t>(r * hd), 0.0);
      L.cache->score_state.assign(static_cast<size_t>(r * hd), -std::numeric_limits<double>::infinity());
      if (L.fault != V41Fault::decode_fresh_compressor) {  // the planted fault hands over an empty group
        std::copy(kv.begin() + cut * hd, kv.end(), L.cache->kv_state.begin());
        std::copy(score.begin() + cut * hd, score.end(), L.cache->score_state.begin());
      }
    }
    if (N < r) return {};
    latent = compress_pool(L.a, kv, score, N, hd, r);
  }
  rmsnorm(L.a, latent, hd, L.w.compressor_norm, L.c.norm_eps);
  // The planted compressor-without-lengths: the pooling kernel, given no sequence lengths, pools no group, and
  // the groups the attention counts from the positions read the zeros their buffer was cleared to.
  if (L.fault == V41Fault::compressor_without_lengths && r > 1) std::fill(latent.begin(), latent.end(), 0.0);
  return latent;
}

// The index keys of T groups from group g0: wk(latent), k_norm, RoPE at the group's first token (group j
// at position j·r), FP4 per 32.
Vec index_keys(const LayerCtx& L, const Vec& latent, int64_t T, int64_t g0) {
  const int64_t r = L.lp.ratio, ID = L.c.index_head_dim;
  Vec k = lin(L, latent, T, L.w.indexer_wk, true);
  rmsnorm(L.a, k, ID, L.w.indexer_k_norm, L.c.norm_eps);
  rope_rows(L, k, T, 1, ID, [r, g0](int64_t j) { return (g0 + j) * r; }, false);
  qdq_fp4_32(L.a, k, ID);
  return k;
}

// The compressed KV from the latent of T groups from g0: RoPE at the group's first token, then FP4 per 16
// with e4m3 scales.
void finish_compressed(const LayerCtx& L, Vec& latent, int64_t T, int64_t g0) {
  const int64_t r = L.lp.ratio;
  if (L.fault != V41Fault::unrotated_compressed_keys)
    rope_rows(L, latent, T, 1, L.c.head_dim, [r, g0](int64_t j) { return (g0 + j) * r; }, false);
  qdq_fp4_e4m3_16(L.a, latent, L.c.head_dim);
}

// A kv source's publication: its compressed KV and, for an owner, its index keys, into shared, the cache and
// the capture. The groups L.sources holds are read, not computed (the all-layers tail's prefill side: every
// group; a resumed prompt: its cached prefix's); the compressor runs on the rows of the groups after them,
// which must start at or after the layer's first row.
void publish_sources(const LayerCtx& L, std::span<const double> x, V41SharedAttention& shared, V41LayerCapture& cap) {
  const int64_t N = L.N, r = L.lp.ratio, hd = L.c.head_dim, ID = L.c.index_head_dim, P0 = L.first;
  const int64_t T = (P0 + N) / r;
  const V41LayerCache* src = L.sources;
  const int64_t G = src ? static_cast<int64_t>(src->compress_kv.size()) / hd : 0;
  shared.ratio = r;
  // Every group read-only, and with them the group being filled: the prefill side's sources hold it; a
  // prefix cache does not, so a group pending at its end is recomputed from its tokens below.
  const bool pending = (P0 + N) % r != 0 && src && src->kv_state.empty();
  if (src && G >= T && !pending) {
    shared.compress_kv = src->compress_kv;
    shared.compress_rows = T;
    cap.compress_kv = src->compress_kv;
    if (L.lp.owns_index_k) {
      shared.index_k = src->index_k;
      cap.index_k = src->index_k;
    }
    if (L.cache) {
      L.cache->compress_kv = src->compress_kv;
      if (L.lp.owns_index_k) L.cache->index_k = src->index_k;
      L.cache->kv_state = src->kv_state;
      L.cache->score_state = src->score_state;
    }
    return;
  }
  const int64_t row0 = G * r - P0;  // the row of group G's first token
  if (row0 < 0)
    throw InputError(fmt::format("v41 layer {}: its rows start at position {}, after its {} cached groups end "
                                 "(position {}); a resumed prompt recomputes the pending group's tokens",
                                 L.lp.layer, P0, G, G * r));
  const int64_t n = N - row0, Tn = n / r;
  Vec latent = compressor(L, x.subspan(static_cast<size_t>(row0 * L.c.dim)), n);
  if (L.capture) cap.latent = latent;
  if (latent.empty() && G == 0) return;  // no group complete: nothing published
  Vec keys;
  if (L.lp.owns_index_k && Tn > 0) keys = index_keys(L, latent, Tn, G);
  if (Tn > 0) finish_compressed(L, latent, Tn, G);
  if (src) {  // the cached groups, then the new ones
    latent.insert(latent.begin(), src->compress_kv.begin(), src->compress_kv.end());
    if (L.lp.owns_index_k) keys.insert(keys.begin(), src->index_k.begin(), src->index_k.begin() + G * ID);
  }
  if (L.lp.owns_index_k) {
    if (L.cache) L.cache->index_k = keys;
    cap.index_k = keys;
    shared.index_k = std::move(keys);
  }
  if (L.cache) L.cache->compress_kv = latent;
  cap.compress_kv = latent;
  shared.compress_kv = std::move(latent);
  shared.compress_rows = T;
}

// The indexer of an index source (model.py Indexer.forward, start_pos 0, offset N): publishes the
// index keys (when it owns them) and the candidate pool (the candidate source); returns the
// selection [N, topk], offset by N, -1 for none.
std::vector<int32_t> indexer(const LayerCtx& L, std::span<const double> x, std::span<const double> qr,
                             V41SharedAttention& shared, V41LayerCapture& cap) {
  const V41Config& c = L.c;
  const int64_t N = L.N, r = L.lp.ratio, IH = c.index_n_heads, ID = c.index_head_dim, P0 = L.first;
  const int64_t T = (P0 + N) / r;  // every group of the prompt (a replayed tail reads them all)
  const double ninf = -std::numeric_limits<double>::infinity();
  Vec q = lin(L, qr, N, L.w.indexer_wq_b, true);
  rope_rows(L, q, N, IH, ID, [P0](int64_t t) { return P0 + t; }, false);
  qdq_fp4_32(L.a, q, ID);
  // weights_proj(x) · (index_head_dim^-0.5 · index_n_heads^-0.5): the product of two python floats,
  // applied to the bf16 tensor as an fp32 constant.
  const Vec wts = index_weights(L, x, N);

  // score[t, j] = Σ_h bf16(relu(bf16(q_th · k_j)) · w_th), the head sum in fp32, then bf16; with
  // --index-scores fp32 (engines whose indexer kernel keeps fp32) none of the three bf16 roundings.
  // The dot products q_th · k_j, each summed over the head dim in order, are one `linear` of the rows
  // q_th by the keys, taken a chunk of queries at a time and only over the groups the chunk's last
  // query sees: the others are masked to -inf below whatever they hold, and each dot is its own sum,
  // so neither the chunking nor the skipping changes a bit.
  constexpr int64_t kQueryChunk = 64;
  Vec score(static_cast<size_t>(N * T), ninf), dots;
  for (int64_t t0 = 0; t0 < N; t0 += kQueryChunk) {
    const int64_t tc = std::min(kQueryChunk, N - t0), Tv = std::min(T, (P0 + t0 + tc) / r);
    if (Tv == 0) continue;
    dots.assign(static_cast<size_t>(tc * IH * Tv), 0.0);
    linear(L.a, std::span<const double>(q).subspan(static_cast<size_t>(t0 * IH * ID), static_cast<size_t>(tc * IH * ID)),
           tc * IH, ID, std::span<const double>(shared.index_k).first(static_cast<size_t>(Tv * ID)), Tv, dots, false);
    for (int64_t t = t0; t < t0 + tc; ++t)
      index_scores(L, dots.data() + (t - t0) * IH * Tv, Tv, wts.data() + t * IH, score.data() + t * T);
  }
  // A query at position p sees the groups complete by p: j < (p + 1) / r.
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = (P0 + t + 1) / r; j < T; ++j) score[static_cast<size_t>(t * T + j)] = ninf;

  if (L.lp.candidate_source) {
    shared.candidates.assign(static_cast<size_t>(N * T), 0);
    for (int64_t t = 0; t < N; ++t)
      candidate_blocks(std::span<const double>(score).subspan(static_cast<size_t>(t * T), static_cast<size_t>(T)),
                       (P0 + t + 1) / r, c.candidate_topk_blocks, c.candidate_block_size, L.a.emulate,
                       std::span<uint8_t>(shared.candidates).subspan(static_cast<size_t>(t * T), static_cast<size_t>(T)),
                       L.options.topk_ties);
    cap.candidates = shared.candidates;
  } else if (L.lp.cand_src >= 0) {
    for (size_t i = 0; i < score.size(); ++i)
      if (!shared.candidates[i]) score[i] = ninf;
  }

  if (L.capture) cap.index_score = score;
  const int64_t k = std::min(c.index_topk, T);
  std::vector<int32_t> idx(static_cast<size_t>(N * k));
  for (int64_t t = 0; t < N; ++t)
    select_row(L, std::span<const double>(score).subspan(static_cast<size_t>(t * T), static_cast<size_t>(T)),
               (P0 + t + 1) / r, N, std::span<int32_t>(idx).subspan(static_cast<size_t>(t * k), static_cast<size_t>(k)));
  return idx;
}

}  // namespace

std::vector<double> linear_out(const LayerCtx& L, std::span<const double> x, int64_t M, const V41Linear& w,
                               bool out_bf16) {
  Vec y(static_cast<size_t>(M * w.out));
  linear_w(L.a, x, M, w, y, out_bf16);
  return y;
}

Vec index_weights(const LayerCtx& L, std::span<const double> x, int64_t M) {
  // The product of two python floats, applied to the bf16 tensor as an fp32 constant.
  const double ID = static_cast<double>(L.c.index_head_dim), IH = static_cast<double>(L.c.index_n_heads);
  Vec wts = lin(L, x, M, L.w.indexer_weights_proj, true);
  const double ws = L.a.c(std::pow(ID, -0.5) * std::pow(IH, -0.5));
  for (double& v : wts) v = L.a.bf(L.a.mul(v, ws));
  return wts;
}

void select_row(const LayerCtx& L, std::span<const double> score, int64_t visible, int64_t offset,
                std::span<int32_t> out) {
  const int64_t k = static_cast<int64_t>(out.size());
  auto top = select_topk(score, k, L.a.emulate, L.options.topk_ties);
  // The planted index-topk-capped keeps the cap's best (select_topk's first entries) and drops the rest, each
  // dropped position p held as ~p (negative) so that it sorts in its place and is written -1.
  if (L.fault == V41Fault::index_topk_capped)
    for (size_t j = static_cast<size_t>(std::max<int64_t>(1, L.c.index_topk / 2)); j < top.size(); ++j) top[j] = ~top[j];
  auto position = [](int64_t p) { return p < 0 ? ~p : p; };
  std::sort(top.begin(), top.end(), [&](int64_t a, int64_t b) { return position(a) < position(b); });
  for (int64_t j = 0; j < k; ++j) {
    const int64_t p = top[static_cast<size_t>(j)];
    out[static_cast<size_t>(j)] = p >= 0 && p < visible ? static_cast<int32_t>(p + offset) : -1;
  }
}

std::vector<double> attention_forward(const LayerCtx& L, std::span<const double> x, V41SharedAttention& shared,
                                      V41LayerCapture& cap) {
  const V41Config& c = L.c;
  const int64_t N = L.N, H = c.n_heads, hd = c.head_dim, r = L.lp.ratio, P0 = L.first;
  auto at_t = [P0](int64_t t) { return P0 + t; };

  Vec qr = lin(L, x, N, L.w.wq_a, true);
  rmsnorm(L.a, qr, c.q_lora_rank, L.w.q_norm, c.norm_eps);
  Vec q = lin(L, qr, N, L.w.wq_b, true);  // [N, H, hd]; no per-head norm in V4.1
  if (L.fault == V41Fault::v4_q_norm) rmsnorm(L.a, q, hd, std::vector<double>(static_cast<size_t>(hd), 1.0), c.norm_eps);
  rope_rows(L, q, N, H, hd, at_t, false);

  // The window KV: one shared K = V head, RoPE, FP8 QDQ of the whole vector (rope tail included).
  Vec kv = lin(L, x, N, L.w.wkv, true);
  rmsnorm(L.a, kv, hd, L.w.kv_norm, c.norm_eps);
  rope_rows(L, kv, N, 1, hd, at_t, false);
  qdq_fp8_32(L.a, kv, hd);
  if (L.cache) {  // the ring after the prompt: position p at slot p % W (a tail's rows at their positions)
    const int64_t W = c.window_size;
    L.cache->window.assign(static_cast<size_t>(W * hd), 0.0);
    for (int64_t t = std::max<int64_t>(0, N - W); t < N; ++t)
      // The planted window-ring-drops-last leaves the last row's slot empty once the prompt wrapped the ring.
      if (!(L.fault == V41Fault::window_ring_drops_last && P0 + N > W && t == N - 1))
        std::copy_n(kv.begin() + t * hd, hd,
                    L.cache->window.begin() + ((L.fault == V41Fault::ced_ring_slot_of_row ? t : P0 + t) % W) * hd);
  }
  const bool probe = L.floor_probe && (P0 > 0 || L.window_floor > 0);
  std::vector<int32_t> win = probe ? probe_window_idxs(N, c.window_size, P0, L.window_floor)
                                   : window_topk_idxs(N, c.window_size);
  // A floored window: the keys below the replay's first row are not there (the planted fault compares
  // the floor with the row's index in the tail, as a port that masks on the wrong positions does).
  const int64_t floor_base = L.fault == V41Fault::ced_floor_on_row_index ? 0 : P0;
  for (int32_t& i : win)
    if (i >= 0 && floor_base + i < L.window_floor) i = -1;
  int64_t kw = probe ? c.window_size : std::min(N, c.window_size), kc = 0;
  std::vector<int32_t> comp;

  if (r > 0) {
    const int64_t T = (P0 + N) / r;
    if (L.lp.owns_compressor) publish_sources(L, x, shared, cap);
    if (L.lp.owns_indexer) {
      if (T == 0) {
        shared.topk = 0;
        shared.topk_idxs.clear();
      } else {
        shared.topk_idxs = indexer(L, x, qr, shared, cap);
        shared.topk = std::min(c.index_topk, T);
      }
      cap.topk = shared.topk;
      cap.topk_idxs = shared.topk_idxs;
    }
    kv.insert(kv.end(), shared.compress_kv.begin(), shared.compress_kv.begin() + T * hd);
    comp = shared.topk_idxs;
    kc = shared.topk;
  }
  // [window indices | compressed indices] per query.
  const int64_t k = kw + kc;
  std::vector<int32_t> idx(static_cast<size_t>(N * k));
  for (int64_t t = 0; t < N; ++t) {
    std::copy_n(win.begin() + t * kw, kw, idx.begin() + t * k);
    std::copy_n(comp.begin() + t * kc, kc, idx.begin() + t * k + kw);
  }
  if (probe) {  // the keys the floor left out: one NaN row after the others
    const int32_t nan_row = static_cast<int32_t>(kv.size() / static_cast<size_t>(hd));
    kv.insert(kv.end(), static_cast<size_t>(hd), std::numeric_limits<double>::quiet_NaN());
    for (int32_t& i : idx)
      if (i == kProbeKey) i = nan_row;
  }
  Vec o(static_cast<size_t>(N * H * hd));
  sparse_attn(L.a, q, N, H, hd, kv, L.w.attn_sink, idx, k, std::pow(static_cast<double>(hd), -0.5), o);
  if (L.capture) {
    cap.attn_q = q;
    cap.attn_kv = kv;
    cap.attn_idx = idx;
    cap.attn_o = o;
  }
  rope_rows(L, o, N, H, hd, at_t, true);

  return grouped_output(L, o, N);
}

void write_sources(const LayerCtx& L, std::span<const double> x) {
  V41LayerCache& out = *L.cache;
  Vec latent = compressor(L, x, L.N);  // seeds the group state of a ratio > 1
  out.compress_kv.clear();
  out.index_k.clear();
  if (latent.empty()) return;
  const int64_t T = L.N / L.lp.ratio;
  if (L.lp.owns_index_k) out.index_k = index_keys(L, latent, T, 0);
  finish_compressed(L, latent, T, 0);
  out.compress_kv = std::move(latent);
}

std::vector<double> grouped_output(const LayerCtx& L, std::span<const double> o, int64_t N) {
  // o as [N, G, H hd / G], each group through its own [o_lora_rank, H hd / G] block of wo_a (a bf16
  // einsum), flattened, then wo_b.
  const V41Config& c = L.c;
  const int64_t G = c.o_groups, R = c.o_lora_rank, gd = c.n_heads * c.head_dim / G;
  Vec og(static_cast<size_t>(N * G * R));
  for (int64_t g = 0; g < G; ++g) {
    Vec xg(static_cast<size_t>(N * gd)), yg(static_cast<size_t>(N * R));
    for (int64_t t = 0; t < N; ++t) std::copy_n(o.begin() + (t * G + g) * gd, gd, xg.begin() + t * gd);
    linear(L.a, xg, N, gd, std::span<const double>(L.w.wo_a.w).subspan(static_cast<size_t>(g * R * gd),
                                                                       static_cast<size_t>(R * gd)),
           R, yg, true);
    for (int64_t t = 0; t < N; ++t) std::copy_n(yg.begin() + t * R, R, og.begin() + (t * G + g) * R);
  }
  return lin(L, og, N, L.w.wo_b, true);
}

}  // namespace ced::v41::fwd
