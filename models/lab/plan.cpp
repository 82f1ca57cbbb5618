#include "models/lab/plan.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ced {

const char* role_name(Role r) {
  switch (r) {
    case Role::SwaOnly: return "SWA-only";
    case Role::Full: return "Full";
    case Role::Reindex: return "Reindex";
    case Role::Reuse: return "Reuse";
  }
  return "?";
}

Plan make_plan(const Config& c) {
  Plan p;
  p.L = c.n_layers;
  p.E = c.n_encoder_layers;
  p.D = c.n_layers - c.n_encoder_layers;
  p.W = c.window;
  p.candidate_source = c.candidate_source_layer;
  auto has = [](const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  for (int64_t l = 0; l < p.L; ++l) {
    LayerPlan lp;
    lp.layer = l;
    lp.ratio = c.compress_ratios[static_cast<size_t>(l)];
    lp.decoder = l >= p.E;
    if (lp.ratio > 0) {
      for (int64_t s : c.kv_source_layers)
        if (s <= l) lp.kv_src = s;
      for (int64_t s : c.index_source_layers)
        if (s <= l) lp.idx_src = s;
      const bool kv = has(c.kv_source_layers, l);
      const bool ix = has(c.index_source_layers, l);
      lp.role = kv ? Role::Full : ix ? Role::Reindex : Role::Reuse;
      lp.index_source = ix;
      lp.candidate_source = (l == c.candidate_source_layer);
      lp.selects_in_pool = ix && c.candidate_source_layer >= 0 && l >= c.candidate_source_layer;
      if (kv) {
        lp.reads_xhat_E = lp.decoder;
        lp.comp_weight_layer = (c.tie_decoder_kv && l > p.E) ? p.E : l;
        p.kv_sources.push_back(l);
        if (lp.decoder) p.decoder_kv_sources.push_back(l);
      }
    }
    p.layers.push_back(lp);
  }
  return p;
}

std::string describe_plan(const Plan& p) {
  std::string s = fmt::format("{:>5} {:>4} {:>5} {:>9} {:>6} {:>7} {}\n", "layer", "part", "ratio", "role", "kv_src",
                              "idx_src", "notes");
  for (const auto& lp : p.layers) {
    std::string notes;
    if (lp.candidate_source) notes += "candidate source; ";
    if (lp.selects_in_pool && !lp.candidate_source) notes += "selects in pool; ";
    if (lp.reads_xhat_E) notes += "reads x̂_E (source-only write); ";
    if (lp.role == Role::Full && lp.comp_weight_layer != lp.layer)
      notes += fmt::format("tied to layer {}; ", lp.comp_weight_layer);
    if (!notes.empty()) notes.resize(notes.size() - 2);
    auto src = [](int64_t v) { return v < 0 ? std::string("-") : std::to_string(v); };
    s += fmt::format("{:>5} {:>4} {:>5} {:>9} {:>6} {:>7} {}\n", lp.layer, lp.decoder ? "dec" : "enc", lp.ratio,
                     role_name(lp.role), src(lp.kv_src), src(lp.idx_src), notes);
  }
  return s;
}

}  // namespace ced
