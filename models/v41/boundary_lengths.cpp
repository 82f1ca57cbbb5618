// docs/v41.md §13.10: a config's boundary lengths; see boundary_lengths.hpp.
#include "models/v41/boundary_lengths.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "models/v41/run_types.hpp"

namespace ced::v41 {

std::vector<V41BoundaryLength> v41_boundary_lengths(const V41Config& c, const V41Plan& p) {
  std::map<int64_t, std::vector<std::string>> at;
  // K − 1, K, K + 1 of one constant named `what` (lengths below 1 dropped).
  auto around = [&](int64_t k, const std::string& what) {
    if (k < 1) return;
    for (int64_t d : {-1, 0, 1})
      if (k + d >= 1) at[k + d].push_back(d == 0 ? what : fmt::format("{} {} 1", what, d < 0 ? "-" : "+"));
  };
  around(p.W, fmt::format("W = {}", p.W));
  around(2 * p.W, fmt::format("2W = {}", 2 * p.W));
  std::set<int64_t> ratios;
  for (const LayerPlan& lp : p.layers)
    if (lp.ratio > 0) ratios.insert(lp.ratio);
  for (int64_t r : ratios) {
    if (r > 1) around(r, fmt::format("ratio {}: the first whole group", r));
    bool indexed = false;
    for (int64_t l : p.index_sources) indexed = indexed || p[l].ratio == r;
    if (indexed) around(c.index_topk * r, fmt::format("index_topk × ratio = {} × {}", c.index_topk, r));
  }
  if (p.candidate_source >= 0) {
    const int64_t r = p[p.candidate_source].ratio, groups = c.candidate_topk_blocks * c.candidate_block_size;
    around(groups * r, fmt::format("the candidate pool: {} blocks × {} groups × ratio {}", c.candidate_topk_blocks,
                                   c.candidate_block_size, r));
  }
  bool yarn = false;
  for (const LayerPlan& lp : p.layers) yarn = yarn || lp.yarn;
  if (yarn && c.original_seq_len > 0) around(c.original_seq_len, fmt::format("YaRN's original_seq_len = {}", c.original_seq_len));
  if (!p.engram_layers.empty()) around(c.engram_max_ngram_size, fmt::format("Engram's n-gram size = {}", c.engram_max_ngram_size));
  std::map<int64_t, std::vector<std::string>> spans;  // conventions sharing a span named together
  for (const V41ReplayConvention& conv : v41_replay_conventions()) spans[v41_exact_span(p, conv)].push_back(conv.name);
  for (const auto& [span, names] : spans) around(span, fmt::format("the exact span of {} = {}", fmt::join(names, ", "), span));
  std::vector<V41BoundaryLength> out;
  for (auto& [n, why] : at) out.push_back({n, std::move(why)});
  return out;
}

}  // namespace ced::v41
