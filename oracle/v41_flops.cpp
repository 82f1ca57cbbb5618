// docs/v41.md §14.2: the FLOP model of the release's prefill. See v41_flops.hpp.
#include "oracle/v41_flops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "model/error.hpp"
#include "oracle/checked_int.hpp"

namespace ced::v41 {

using checked::add;
using checked::mul;

const char* v41_flop_term_name(int term) {
  static constexpr const char* kNames[kV41FlopTerms] = {
      "hc_mixes", "hc_sinkhorn", "hc_collapse", "hc_expand", "engram_wkv", "engram_gate", "wq_a", "wq_b", "window_kv",
      "compressor", "index_keys", "indexer_q", "indexer_weights", "index_scores", "attention", "wo_a", "wo_b", "gate",
      "experts", "final_collapse", "head"};
  return term >= 0 && term < kV41FlopTerms ? kNames[term] : "?";
}

const char* v41_index_scoring_name(V41IndexScoring s) { return s == V41IndexScoring::Causal ? "causal" : "dense"; }

V41RowCosts v41_row_costs(const V41Config& c) {
  V41RowCosts r;
  const int64_t hc = c.hc_mult, d = c.dim, hd = c.head_dim;
  r.hc_mixes = 2 * (2 + hc) * hc * hc * d;
  // The split: one row softmax and one column normalisation, then iters - 1 (row, column) rounds.
  r.hc_sinkhorn = 2 * hc * hc * 2 * c.hc_sinkhorn_iters;
  r.hc_collapse = 2 * hc * d;
  r.hc_expand = 2 * hc * (hc + 1) * d;
  r.engram_wkv = 2 * (c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim * (hc + 1) * d;
  r.engram_gate = 2 * hc * d + 2 * hc * d;
  r.wq_a = 2 * d * c.q_lora_rank;
  r.wq_b = 2 * c.q_lora_rank * c.n_heads * hd;
  r.window_kv = 2 * d * hd;
  r.wo_a = 2 * c.n_heads * hd * c.o_lora_rank;
  r.wo_b = 2 * c.o_groups * c.o_lora_rank * d;
  r.indexer_q = 2 * c.q_lora_rank * c.index_n_heads * c.index_head_dim;
  r.indexer_weights = 2 * d * c.index_n_heads;
  r.gate = 2 * d * c.n_routed_experts;
  r.experts = 2 * 3 * d * c.moe_inter_dim * (c.n_activated_experts + c.n_shared_experts);
  r.head = 2 * d * c.vocab_size;
  r.attention_entry = 2 * 2 * c.n_heads * hd;
  r.index_score_entry = 2 * c.index_n_heads * (c.index_head_dim + 1);
  r.compressor_token_plain = 2 * d * hd;
  r.compressor_token_pooled = 2 * 2 * d * hd;
  r.compressor_pool_token = 2 * hd;
  r.index_key_group = 2 * hd * c.index_head_dim;
  return r;
}

int64_t v41_window_entries(int64_t W, int64_t floor, int64_t p) { return std::min(p - floor + 1, W); }

int64_t v41_visible(int64_t ratio, int64_t p) { return (p + 1) / ratio; }

int64_t v41_pool_size(const V41Config& c, int64_t n) {
  const int64_t bs = c.candidate_block_size, blocks = c.candidate_topk_blocks;
  if (n <= blocks * bs) return n;
  return (blocks - 1) * bs + (n - 1) % bs + 1;
}

int64_t V41FlopCount::total() const {
  int64_t s = 0;
  for (const auto& r : rows)
    for (int64_t v : r) s = add(s, v);
  return s;
}
int64_t V41FlopCount::term(int t) const {
  int64_t s = 0;
  for (const auto& r : rows) s = add(s, r[static_cast<size_t>(t)]);
  return s;
}
int64_t V41FlopCount::layer(int64_t l) const {
  int64_t s = 0;
  for (int64_t v : rows[static_cast<size_t>(l)]) s = add(s, v);
  return s;
}

namespace {

// Σ_{m=1}^{n} min(cap, m), cap >= 0.
int64_t tri_min(int64_t cap, int64_t n) {
  if (n <= cap) return mul(n, n + 1) / 2;
  return add(mul(cap, cap + 1) / 2, mul(n - cap, cap));
}
constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max() / 4;

// Σ over the query rows first .. N-1 of the window entries, the window floored at `floor` (<= first):
// Σ_{i=a}^{b} min(i, W) with a = first - floor + 1, b = N - floor.
int64_t window_sum(int64_t W, int64_t floor, int64_t first, int64_t N) {
  return tri_min(W, N - floor) - tri_min(W, first - floor);
}

// Σ over c consecutive values of min(cap, m) with m cycling 1 .. bs from 1.
int64_t cycles(int64_t c, int64_t bs, int64_t cap) { return add(mul(c / bs, tri_min(cap, bs)), tri_min(cap, c % bs)); }

// What a layer's compressed side reads as a function of the visible count v, g(v) with g(0) = 0, and
// its prefix sum G(k) = Σ_{v<k} g(v) in closed form.
enum class Counted { Visible, Pool, Selected, SelectedPool };

int64_t prefix(const V41Config& c, Counted what, int64_t k) {
  const int64_t K = c.index_topk, bs = c.candidate_block_size, TB = c.candidate_topk_blocks;
  const int64_t T = TB * bs, n = k - 1;  // the pool is every visible entry up to T of them
  switch (what) {
    case Counted::Visible: return tri_min(kNoCap, n);
    case Counted::Selected: return tri_min(K, n);
    case Counted::Pool:
      if (n <= T) return tri_min(kNoCap, n);
      // above T: (TB - 1) full blocks and the newest's ((v - 1) mod bs) + 1, which cycles 1 .. bs from v = T + 1
      return add(add(tri_min(kNoCap, T), mul(n - T, (TB - 1) * bs)), cycles(n - T, bs, kNoCap));
    case Counted::SelectedPool: {
      if (n <= T) return tri_min(K, n);
      const int64_t spare = K - (TB - 1) * bs;  // what the newest block's entries may add below topk
      const int64_t above = spare <= 0 ? mul(n - T, K) : add(mul(n - T, (TB - 1) * bs), cycles(n - T, bs, spare));
      return add(tri_min(K, T), above);
    }
  }
  return 0;
}

// Σ_{q=1}^{n} g(⌊q / r⌋): v = 1 .. k-1 each r times, v = k (j + 1) times, for n = r·k + j, 0 <= j < r.
int64_t over_queries(const V41Config& c, Counted what, int64_t r, int64_t n) {
  const int64_t k = n / r, j = n % r;
  if (k == 0) return 0;
  const int64_t g_k = prefix(c, what, k + 1) - prefix(c, what, k);
  return add(mul(r, prefix(c, what, k)), mul(j + 1, g_k));
}

}  // namespace

V41CompressedSums v41_compressed_sums(const V41Config& c, int64_t ratio, int64_t first, int64_t N) {
  // Query p sees ⌊(p + 1)/r⌋: rows first .. N-1 are q = p + 1 in first + 1 .. N.
  auto sum = [&](Counted what) { return over_queries(c, what, ratio, N) - over_queries(c, what, ratio, first); };
  return {sum(Counted::Visible), sum(Counted::Pool), sum(Counted::Selected), sum(Counted::SelectedPool)};
}

V41FlopCount v41_flop_model(const V41Config& c, const V41Plan& plan, const V41FlopQuery& q) {
  const int64_t N = q.n_prompt, S = q.tail_start;
  if (N < 1) throw InputError(fmt::format("v41 flop model: N must be >= 1 (got {})", N));
  if (S < 0 || S >= N)
    throw InputError(fmt::format("v41 flop model: the tail must start in [0, N = {}) (got {})", N, S));
  const V41RowCosts k = v41_row_costs(c);
  V41FlopCount out;
  out.rows.resize(static_cast<size_t>(plan.L + 1), {});
  const bool all = S > 0 && q.all_layers;
  const int64_t cut = all ? 0 : plan.E;  // the first layer on the tail
  for (const LayerPlan& lp : plan.layers) {
    auto& r = out.rows[static_cast<size_t>(lp.layer)];
    const bool tail = S > 0 && (all || lp.decoder);
    const bool boundary = tail && !all && lp.layer == plan.E;  // layer E of a CED prefill cut at E
    const int64_t first = tail ? S : 0, rows = N - first;
    const int64_t floor = tail && (lp.layer > cut || q.floor_first_layer) ? S : 0;

    r[kV41HcMixes] = mul(rows, 2 * k.hc_mixes);
    r[kV41HcSinkhorn] = mul(rows, 2 * k.hc_sinkhorn);
    // Layer E's compressor reads attn_norm of its attention collapse on every row; its FFN collapse,
    // like the rest of the block, runs on the tail.
    r[kV41HcCollapse] = mul(boundary ? N + rows : 2 * rows, k.hc_collapse);
    r[kV41HcExpand] = mul(rows, 2 * k.hc_expand);
    if (lp.engram) {
      r[kV41EngramWkv] = mul(rows, k.engram_wkv);
      r[kV41EngramGate] = mul(rows, k.engram_gate);
    }
    r[kV41WqA] = mul(rows, k.wq_a);
    r[kV41WqB] = mul(rows, k.wq_b);
    // A convention that keeps layer E whole writes its window keys for every row.
    r[kV41WindowKv] = mul(tail && lp.layer == cut && !q.floor_first_layer ? N : rows, k.window_kv);
    int64_t entries = window_sum(plan.W, floor, first, N);
    if (lp.ratio > 0) {
      const int64_t groups = N / lp.ratio;
      const V41CompressedSums s = v41_compressed_sums(c, lp.ratio, first, N);
      // The entries a query attends are its index source's selection: top-k of what that source may
      // pick, its visible entries, or its candidate pool above the candidate source.
      const LayerPlan& src = plan[lp.idx_src];
      const V41CompressedSums picked = v41_compressed_sums(c, src.ratio, first, N);
      entries = add(entries, src.cand_src >= 0 ? picked.selected_pool : picked.selected);
      // kv sources lie at or below E, so they consume every token in both prefills.
      if (lp.owns_compressor) {
        r[kV41Compressor] = lp.ratio == 1 ? mul(N, k.compressor_token_plain)
                                          : add(mul(N, k.compressor_token_pooled),
                                                mul(groups * lp.ratio, k.compressor_pool_token));
      }
      if (lp.owns_index_k) r[kV41IndexKeys] = mul(groups, k.index_key_group);
      // model.py runs no indexer while no group is complete (compress_len 0).
      if (lp.owns_indexer && groups > 0) {
        r[kV41IndexerQ] = mul(rows, k.indexer_q);
        r[kV41IndexerWeights] = mul(rows, k.indexer_weights);
        const int64_t scored = q.scoring == V41IndexScoring::Dense ? mul(rows, groups)
                               : lp.cand_src >= 0                   ? s.pool
                                                                    : s.visible;
        r[kV41IndexScores] = mul(scored, k.index_score_entry);
      }
    }
    r[kV41Attention] = mul(entries, k.attention_entry);
    r[kV41WoA] = mul(rows, k.wo_a);
    r[kV41WoB] = mul(rows, k.wo_b);
    r[kV41Gate] = mul(rows, k.gate);
    r[kV41Experts] = mul(rows, k.experts);
  }
  if (all) {
    // The prefill side: layers 0 .. E - 1 on every row (their compressors and index keys, counted once
    // above, are what the tail's kv sources read), and layer E's source write: its attention collapse
    // on every row (its compressor and index keys are counted above too).
    V41FlopQuery side = q;
    side.tail_start = 0;
    side.all_layers = false;
    const V41FlopCount full = v41_flop_model(c, plan, side);
    for (int64_t l = 0; l < plan.E; ++l)
      for (int t = 0; t < kV41FlopTerms; ++t)
        if (t != kV41Compressor && t != kV41IndexKeys)
          out.rows[static_cast<size_t>(l)][static_cast<size_t>(t)] =
              add(out.rows[static_cast<size_t>(l)][static_cast<size_t>(t)], full.rows[static_cast<size_t>(l)][static_cast<size_t>(t)]);
    auto& e = out.rows[static_cast<size_t>(plan.E)];
    e[kV41HcCollapse] = add(e[kV41HcCollapse], mul(N, k.hc_collapse));
  }
  auto& head = out.rows.back();
  head[kV41FinalCollapse] = k.hc_collapse;
  head[kV41Head] = k.head;
  return out;
}

double v41_ratio_limit(const V41Plan& plan, V41IndexScoring scoring) {
  // Causal: an index source's scores grow as Σ_p (p + 1)/r ~ N²/(2r), unless it scores a candidate
  // pool (at most topk_blocks·block entries a query). Dense: every index source's, as N·N/r. In a CED
  // prefill only the encoder's keep their N² (the decoder's run on the tail's rows).
  double encoder = 0, all = 0;
  for (const LayerPlan& lp : plan.layers) {
    if (!lp.owns_indexer) continue;
    if (scoring == V41IndexScoring::Causal && lp.cand_src >= 0) continue;
    const double w = 1.0 / double(lp.ratio);
    all += w;
    if (!lp.decoder) encoder += w;
  }
  return all > 0 ? encoder / all : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace ced::v41
