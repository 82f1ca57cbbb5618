#pragma once
// docs/v41.md §14.2: the FLOP model of the release's prefill, a full one or a CED one, from the config
// and the layer plan alone (never from the forward code): an independent count of the work each op of
// the released forward pass does, per layer and per term.
//
// The convention (docs/v41.md §14.2): every multiply-add of a product summed over an axis (a linear,
// an einsum, the attention's scores and values, the compressor's pooling, mHC's mixes, collapse and
// expansion, Engram's gate) counts 2 FLOPs; Sinkhorn counts 2 per matrix element per normalisation
// (a sum and a division); norms, rotations, activations, clamps, exponentials, comparisons, top-k and
// table lookups count 0. The head and the final collapse count on the last row only: a prefill
// produces the last position's logits (model.py's default), both the full and the CED one.
#include <array>
#include <cstdint>
#include <vector>

#include "models/v41/config.hpp"
#include "models/v41/plan.hpp"

namespace ced::v41 {

// One term per op of the released forward pass, in the order a block runs them.
enum V41FlopTerm : int {
  kV41HcMixes,        // hc_pre's mixing linear over hc_mult·dim, both sublayers
  kV41HcSinkhorn,     // the split's Sinkhorn normalisations of the hc × hc comb, both sublayers
  kV41HcCollapse,     // the collapse Σᵢ preᵢ·Rᵢ, both sublayers
  kV41HcExpand,       // hc_post: post_j·o + Σᵢ comb[i, j]·Rᵢ, both sublayers
  kV41EngramWkv,      // Engram's projection of the fetched rows into hc keys and one value
  kV41EngramGate,     // its gate's dot products and the gated add
  kV41WqA,            // attention: wq_a
  kV41WqB,            // wq_b
  kV41WindowKv,       // wkv, the window key
  kV41Compressor,     // kv sources: compressor.wkv (and wgate, and the pooling, ratio > 1)
  kV41IndexKeys,      // kv sources: indexer.wk on each completed group's latent
  kV41IndexerQ,       // index sources: indexer.wq_b
  kV41IndexerWeights, // index sources: indexer.weights_proj
  kV41IndexScores,    // index sources: q·k per index head and the weighted head sum, per scored entry
  kV41Attention,      // sparse attention: scores and values over the window and the selected entries
  kV41WoA,            // wo_a, grouped over o_groups
  kV41WoB,            // wo_b
  kV41Gate,           // the MoE gate over n_routed_experts
  kV41Experts,        // the routed and shared experts' SwiGLU at moe_inter_dim
  kV41FinalCollapse,  // the last collapse before norm (the head's row)
  kV41Head,           // the head over vocab_size (the head's row)
  kV41FlopTerms
};
const char* v41_flop_term_name(int term);

// How the index scores are counted (docs/v41.md §14.2).
enum class V41IndexScoring {
  Causal,  // each query scores the compressed entries it sees, an index source above the candidate
           // source only its candidate pool: what an engine's indexer computes
  Dense,   // model.py's einsum: every query against all N / ratio entries, masked afterwards
};
const char* v41_index_scoring_name(V41IndexScoring s);

// The FLOPs of one row (position) a layer runs, per term; per entry where it says so.
struct V41RowCosts {
  int64_t hc_mixes = 0;      // 2·(2 + hc)·hc·hc·dim per sublayer
  int64_t hc_sinkhorn = 0;   // 2·hc²·2·sinkhorn_iters per sublayer
  int64_t hc_collapse = 0;   // 2·hc·dim per sublayer
  int64_t hc_expand = 0;     // 2·hc·(hc + 1)·dim per sublayer
  int64_t engram_wkv = 0;    // 2·(ngram - 1)·engram_heads·engram_head_dim·(hc + 1)·dim
  int64_t engram_gate = 0;   // 2·hc·dim (the dots) + 2·hc·dim (h + gate·value)
  int64_t wq_a = 0;          // 2·dim·q_lora_rank
  int64_t wq_b = 0;          // 2·q_lora_rank·n_heads·head_dim
  int64_t window_kv = 0;     // 2·dim·head_dim
  int64_t wo_a = 0;          // 2·n_heads·head_dim·o_lora_rank (o_groups blocks of n_heads·head_dim/o_groups)
  int64_t wo_b = 0;          // 2·o_groups·o_lora_rank·dim
  int64_t indexer_q = 0;     // 2·q_lora_rank·index_n_heads·index_head_dim
  int64_t indexer_weights = 0;  // 2·dim·index_n_heads
  int64_t gate = 0;          // 2·dim·n_routed_experts
  int64_t experts = 0;       // 2·3·dim·moe_inter_dim·(n_activated_experts + n_shared_experts)
  int64_t head = 0;          // 2·dim·vocab_size
  // per entry
  int64_t attention_entry = 0;  // 2·2·n_heads·head_dim: a score and a value row
  int64_t index_score_entry = 0;  // 2·index_n_heads·(index_head_dim + 1): q·k per head, then Σₕ wₕ·relu
  // kv sources, per token consumed and per group completed
  int64_t compressor_token_plain = 0;   // ratio 1: 2·dim·head_dim (wkv)
  int64_t compressor_token_pooled = 0;  // ratio > 1: 2·2·dim·head_dim (wkv and wgate)
  int64_t compressor_pool_token = 0;    // ratio > 1: 2·head_dim per token of a completed group (its pooling)
  int64_t index_key_group = 0;          // 2·head_dim·index_head_dim
};
V41RowCosts v41_row_costs(const V41Config& c);

// ---- entry counts at query position p -------------------------------------------------------
// Window entries of a query at p whose window is floored at `floor` (<= p): min(p - floor + 1, W).
int64_t v41_window_entries(int64_t W, int64_t floor, int64_t p);
// Compressed entries visible at p: floor((p + 1) / ratio).
int64_t v41_visible(int64_t ratio, int64_t p);
// The candidate pool of a query seeing n entries: all of them when ceil(n / block) <= topk_blocks,
// else (topk_blocks - 1) full blocks and the pinned newest block's ((n - 1) mod block) + 1 entries.
// These three are the rules read literally; the model sums them in closed form (v41_compressed_sums),
// which the tests hold against them position by position.
int64_t v41_pool_size(const V41Config& c, int64_t n_visible);

// The compressed side's counts summed over the query rows first .. N-1 of a layer of this ratio, in
// closed form (O(1) in N).
struct V41CompressedSums {
  int64_t visible = 0;        // Σ v41_visible(ratio, p)
  int64_t pool = 0;           // Σ v41_pool_size(visible)
  int64_t selected = 0;       // Σ min(index_topk, visible)
  int64_t selected_pool = 0;  // Σ min(index_topk, pool)
  bool operator==(const V41CompressedSums&) const = default;
};
V41CompressedSums v41_compressed_sums(const V41Config& c, int64_t ratio, int64_t first, int64_t N);

// ---- the model --------------------------------------------------------------------------------
// A prefill of N tokens from position 0: full (tail_start 0), or CED: the encoder layers on every row,
// layer E's sources (its attention collapse, compressor, index keys; its window keys too when the
// convention keeps layer E whole) on every row, the decoder layers on rows tail_start .. N-1, their
// windows floored at tail_start (layer E's only when floor_first_layer).
struct V41FlopQuery {
  int64_t n_prompt = 0;            // N >= 1
  int64_t tail_start = 0;          // S, 0 <= S < N
  bool floor_first_layer = true;   // V41ReplayConvention::floor_first_layer
  bool all_layers = false;         // V41ReplayConvention::all_layers: the prefill side's pass, then every
                                   // layer on the tail (its kv sources reading what that pass wrote)
  V41IndexScoring scoring = V41IndexScoring::Causal;
};

struct V41FlopCount {
  std::vector<std::array<int64_t, kV41FlopTerms>> rows;  // [L + 1]: each layer, then the head's row
  int64_t total() const;
  int64_t term(int t) const;        // over every row
  int64_t layer(int64_t l) const;   // over every term of row l (L: the head's row)
};

// InputError for N < 1 or S outside [0, N); std::overflow_error if a count leaves int64.
V41FlopCount v41_flop_model(const V41Config& c, const V41Plan& plan, const V41FlopQuery& q);

// The limit of the CED ratio (bounded replay) as N grows, where the N² index scores dominate every
// other term: Σ 1/ratio over the encoder's index sources whose scores grow with N, over the same sum
// for every layer's (docs/v41.md §14.3); NaN when no index score grows with N. The seed's framing
// says E/L instead.
double v41_ratio_limit(const V41Plan& plan, V41IndexScoring scoring);

}  // namespace ced::v41
