// docs/v41.md §7: the layer plan.
#include "models/v41/plan.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ced::v41 {

const char* role_name(Role r) {
  switch (r) {
    case Role::SwaOnly: return "SwaOnly";
    case Role::Full: return "Full";
    case Role::Reindex: return "Reindex";
    case Role::Reuse: return "Reuse";
  }
  return "?";
}

namespace {
bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
// The largest entry of v at or below l, or -1.
int64_t latest_at_or_below(const std::vector<int64_t>& v, int64_t l) {
  int64_t out = -1;
  for (int64_t s : v)
    if (s <= l) out = s;
  return out;
}
}  // namespace

V41Plan make_v41_plan(const V41Config& c) {
  V41Plan p;
  p.L = c.n_layers;
  p.E = c.kv_source_layers.back();
  p.D = p.L - p.E;
  p.W = c.window_size;
  p.kv_sources = c.kv_source_layers;
  p.index_sources = c.index_source_layers;
  p.engram_layers = c.engram_layer_ids;
  p.candidate_source = c.candidate_source_layer;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerPlan lp;
    lp.layer = l;
    lp.ratio = c.compress_ratios[static_cast<size_t>(l)];
    const bool kv = contains(c.kv_source_layers, l), idx = contains(c.index_source_layers, l);
    if (lp.ratio == 0) lp.role = Role::SwaOnly;
    else if (kv) lp.role = Role::Full;
    else if (idx) lp.role = Role::Reindex;
    else lp.role = Role::Reuse;
    if (lp.ratio > 0) {
      lp.kv_src = latest_at_or_below(c.kv_source_layers, l);
      lp.idx_src = latest_at_or_below(c.index_source_layers, l);
    }
    lp.candidate_source = idx && l == c.candidate_source_layer;
    if (idx && c.candidate_source_layer >= 0 && c.candidate_source_layer < l) lp.cand_src = c.candidate_source_layer;
    lp.owns_compressor = kv;
    lp.owns_wgate = kv && lp.ratio > 1;
    lp.owns_indexer = idx;
    lp.owns_index_k = kv;
    lp.yarn = lp.ratio > 0 && c.original_seq_len > 0;
    lp.rope_theta = lp.ratio > 0 ? c.compress_rope_theta : c.rope_theta;
    lp.engram = contains(c.engram_layer_ids, l);
    lp.decoder = l >= p.E;
    p.layers.push_back(lp);
  }
  return p;
}

std::string describe_v41_plan(const V41Plan& p) {
  std::string out = fmt::format("L = {}, E = {}, D = {}, W = {}, R = {}\n", p.L, p.E, p.D, p.W, p.R());
  out += "layer ratio role     kv_src idx_src cand  owns               rope             engram part\n";
  for (const auto& lp : p.layers) {
    std::string owns;
    if (lp.owns_compressor) owns += lp.owns_wgate ? "comp+gate " : "comp ";
    if (lp.owns_index_k) owns += "wk ";
    if (lp.owns_indexer) owns += "idx ";
    std::string cand = lp.candidate_source ? "src" : (lp.cand_src >= 0 ? fmt::format("<{}", lp.cand_src) : "-");
    out += fmt::format("{:>5} {:>5} {:<8} {:>6} {:>7} {:<5} {:<18} {:<16} {:<6} {}\n", lp.layer, lp.ratio,
                       role_name(lp.role), lp.kv_src, lp.idx_src, cand, owns.empty() ? "-" : owns,
                       fmt::format("{:g}{}", lp.rope_theta, lp.yarn ? " yarn" : ""), lp.engram ? "yes" : "-",
                       lp.decoder ? "decoder" : "encoder");
  }
  return out;
}

}  // namespace ced::v41
