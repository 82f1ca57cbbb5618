#pragma once
// The layer plan (docs/spec.md §1 "Derived roles"): computed once from the config and
// read by both models, the oracle and the tools. No code asks "is l == 20".
#include <cstdint>
#include <string>
#include <vector>

#include "models/lab/config.hpp"

namespace ced {

enum class Role { SwaOnly, Full, Reindex, Reuse };
const char* role_name(Role r);

struct LayerPlan {
  int64_t layer = 0;
  int64_t ratio = 0;          // r; 0 = SWA-only
  Role role = Role::SwaOnly;
  int64_t kv_src = -1;        // largest kv source <= l (r > 0)
  int64_t idx_src = -1;       // largest index source <= l (r > 0)
  bool decoder = false;       // l >= E
  bool index_source = false;  // computes its own top-k (Full or Reindex)
  bool candidate_source = false;
  bool selects_in_pool = false;  // index source at or after the candidate source
  // Full layers only: the layer whose names the compressor and index-key
  // tensors are generated under (layer E for tied decoder sources, §2).
  int64_t comp_weight_layer = -1;
  // Full layers in the decoder read x̂_E rather than their own input (§3.3).
  bool reads_xhat_E = false;
};

struct Plan {
  int64_t L = 0, E = 0, D = 0, W = 0;
  std::vector<LayerPlan> layers;
  std::vector<int64_t> kv_sources;       // Full layers, ascending
  std::vector<int64_t> decoder_kv_sources;  // Full layers >= E (written by the source-only step)
  int64_t candidate_source = -1;

  const LayerPlan& operator[](int64_t l) const { return layers[static_cast<size_t>(l)]; }
  // docs/spec.md §0/§4: the exact replay span R = 1 + D(W-1).
  int64_t exact_replay() const { return 1 + D * (W - 1); }
  // docs/spec.md §4: decoder local entries a following decode step reads are exact iff B >= D(W-1).
  int64_t exact_decode_replay() const { return D * (W - 1); }
};

Plan make_plan(const Config& c);

// A one-line-per-layer table of the plan (ced verify, ced run -v).
std::string describe_plan(const Plan& p);

}  // namespace ced
