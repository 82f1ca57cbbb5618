#pragma once
// The v41 layer plan (docs/v41.md §7): every layer's role, sources, owned modules and rotary
// table, and the CED split, computed once from a validated config. Nothing else asks "is l == 20".
#include <cstdint>
#include <string>
#include <vector>

#include "models/v41/config.hpp"

namespace ced::v41 {

// SwaOnly: ratio 0. Full: a kv source (compressor, index keys, its own selection). Reindex: an index
// source that is not a kv source (its own queries against its kv source's keys). Reuse: a
// compressed layer with neither (the latest published compressed KV and selection).
enum class Role { SwaOnly, Full, Reindex, Reuse };
const char* role_name(Role r);

struct LayerPlan {
  int64_t layer = 0;
  int64_t ratio = 0;  // compress_ratios[layer]; 0 = SWA-only
  Role role = Role::SwaOnly;
  int64_t kv_src = -1;   // latest kv source <= layer (ratio > 0): whose compressed KV and index keys it reads
  int64_t idx_src = -1;  // latest index source <= layer (ratio > 0): whose selection it attends over
  bool candidate_source = false;  // publishes the candidate pool
  int64_t cand_src = -1;          // an index source above the candidate source: its score is filtered there
  // The modules (and so the checkpoint tensors) the layer owns.
  bool owns_compressor = false;  // attn.compressor.{wkv,norm}: kv sources
  bool owns_wgate = false;       // attn.compressor.wgate: kv sources with ratio > 1
  bool owns_indexer = false;     // attn.indexer.{wq_b,weights_proj}: index sources
  bool owns_index_k = false;     // attn.indexer.{wk,k_norm} and the index-key cache: kv sources
  // Rotary table: ratio > 0 layers rotate at compress_rope_theta with YaRN (when original_seq_len
  // > 0); SWA-only layers at rope_theta without it.
  bool yarn = false;
  double rope_theta = 0.0;
  bool engram = false;   // Engram before the block
  bool decoder = false;  // layer >= E
};

struct V41Plan {
  int64_t L = 0;  // n_layers (the backbone; the DSpark stages are SWA-only and not planned here)
  int64_t E = 0;  // the CED split: the largest kv source, the first decoder layer
  int64_t D = 0;  // L - E decoder layers
  int64_t W = 0;  // window_size
  std::vector<LayerPlan> layers;        // [L]
  std::vector<int64_t> kv_sources;      // ascending
  std::vector<int64_t> index_sources;   // ascending
  std::vector<int64_t> engram_layers;   // ascending
  int64_t candidate_source = -1;

  const LayerPlan& operator[](int64_t l) const { return layers[static_cast<size_t>(l)]; }
  // The exact replay span: the last position is exact with R = 1 + D(W - 1) replayed positions.
  int64_t R() const { return 1 + D * (W - 1); }
};

// The config must be valid (validate_v41); the plan is computed, not checked.
V41Plan make_v41_plan(const V41Config& c);

// One line per layer: "layer  ratio role kv_src idx_src ..." for ced run -v and the docs.
std::string describe_v41_plan(const V41Plan& p);

}  // namespace ced::v41
