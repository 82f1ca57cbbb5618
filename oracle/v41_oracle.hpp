#pragma once
// docs/v41.md §14: the analytic oracle of the release, what `ced oracle --config <a v41 config>`
// prints. The seed design's framing on the config's split (oracle/ced_split.hpp), the replay
// conventions' exact spans, and the CED ratio from the FLOP model of the release's layers
// (oracle/v41_flops.hpp) next to the ideal one, with where the two part.
#include <cstdint>
#include <string>
#include <vector>

#include "models/v41/config.hpp"
#include "oracle/ced_split.hpp"
#include "oracle/v41_flops.hpp"

namespace ced::v41 {

struct V41OracleRow {  // one prompt length N
  int64_t n_prompt = 0;        // N
  int64_t bounded_replay = 0;  // B = min(N, W)
  double ideal_ratio = 0;      // (N·E + B·D) / (N·L)
  // The CED prefill with B rows, layer E floored (the seed's framing), against the full prefill.
  int64_t full_flops = 0, ced_flops = 0;  // index scores causal
  double exact_ratio = 0;
  int64_t full_flops_dense = 0, ced_flops_dense = 0;  // index scores dense (model.py's einsum)
  double exact_ratio_dense = 0;
  // Where the release departs from the framing (causal scores): shares of a prefill's FLOPs.
  double encoder_of_full = 0;       // the layers below E, of the full prefill (E/L in the framing)
  double index_scores_of_full = 0;  // every index source's scores, of the full prefill
  double index_scores_of_ced = 0;   // of the CED prefill
  double mhc_of_full = 0;           // mixes, Sinkhorn, collapse, expansion (and the final collapse)
  double boundary_of_ced = 0;       // layer E's sources on every row: N collapses, compressor, index keys
  double head_of_ced = 0;           // the head on the last row
};

struct V41ConventionRatio {  // one convention at one N
  int64_t n_prompt = 0;
  double bounded_ratio = 0;        // B = min(N, W)
  int64_t exact_replay = 0;        // min(N, its exact span)
  double exact_replay_ratio = 0;   // with that replay
};

struct V41ConventionRow {
  std::string name;
  bool floor_first_layer = true;
  bool all_layers = false;     // the tail from layer 0 (else from E)
  int64_t floored_layers = 0;  // F
  int64_t exact_span = 0;      // 1 + F(W - 1), v41_exact_span
  std::vector<V41ConventionRatio> ratios;  // one per N
};

// A figure published for the release's CED prefill, shown for comparison (docs/v41.md §14.4).
struct V41PublishedFigure {
  std::string what;   // who measured what, and how it was reported
  double speedup = 0; // full prefill time over CED prefill time
};

// The release's KV cache (docs/v41.md §14.5): what a prefill leaves per token, and the window rings.
struct V41CacheFigures {
  double copies = 0;              // Σ over kv sources of 1/ratio, against L per-layer copies (the seed's 2.5)
  int64_t kv_sources = 0, n_layers = 0;
  double elements_per_token = 0;  // Σ over kv sources (head_dim + index_head_dim where it owns the keys)/ratio
  double bytes_per_token_bf16 = 0, bytes_per_token_f32 = 0;
  int64_t window_elements = 0;    // every layer's ring: L·W·head_dim, independent of N
};

struct V41OracleTable {
  std::string config_name;
  CedSplit split;
  SeedFigures seed;
  V41CacheFigures cache;
  std::vector<V41ConventionRow> conventions;
  std::vector<V41OracleRow> rows;
  V41RowCosts costs;
  double limit_ideal = 0;         // E / L
  double limit_causal = 0;        // v41_ratio_limit, causal scores
  double limit_dense = 0;         // dense scores
  std::vector<V41PublishedFigure> published;
};

// Ns must be >= 1 (InputError); std::overflow_error when a count leaves int64.
V41OracleTable v41_oracle_table(const V41Config& c, const std::vector<int64_t>& Ns);
std::string format_v41_oracle_table(const V41OracleTable& t);
std::string v41_oracle_table_json(const V41OracleTable& t);

}  // namespace ced::v41
