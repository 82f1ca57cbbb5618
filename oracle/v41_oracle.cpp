// docs/v41.md §14: the analytic oracle of the release. See v41_oracle.hpp.
#include "oracle/v41_oracle.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "models/v41/run_types.hpp"
#include "models/v41/plan.hpp"

namespace ced::v41 {
namespace {

// A prefill of N with the decoder on the last `replay` rows (replay >= N: every row, the full one).
V41FlopCount prefill(const V41Config& c, const V41Plan& plan, int64_t N, int64_t replay, bool floor_first_layer,
                     V41IndexScoring scoring, bool all_layers = false) {
  V41FlopQuery q;
  q.n_prompt = N;
  q.tail_start = std::max<int64_t>(0, N - replay);
  q.floor_first_layer = floor_first_layer;
  q.all_layers = all_layers;
  q.scoring = scoring;
  return v41_flop_model(c, plan, q);
}

double share(int64_t part, int64_t whole) { return double(part) / double(whole); }

int64_t mhc_flops(const V41FlopCount& f) {
  return f.term(kV41HcMixes) + f.term(kV41HcSinkhorn) + f.term(kV41HcCollapse) + f.term(kV41HcExpand) +
         f.term(kV41FinalCollapse);
}

}  // namespace

V41OracleTable v41_oracle_table(const V41Config& c, const std::vector<int64_t>& Ns) {
  const V41Plan plan = make_v41_plan(c);
  V41OracleTable t;
  t.config_name = c.name;
  t.split = {plan.L, plan.E, plan.D, plan.W};
  t.seed = seed_figures(t.split);
  t.cache.n_layers = plan.L;
  for (const LayerPlan& lp : plan.layers)
    if (lp.owns_compressor && lp.ratio > 0) {
      ++t.cache.kv_sources;
      t.cache.copies += 1.0 / double(lp.ratio);
      t.cache.elements_per_token += double(c.head_dim + (lp.owns_index_k ? c.index_head_dim : 0)) / double(lp.ratio);
    }
  t.cache.bytes_per_token_bf16 = 2 * t.cache.elements_per_token;
  t.cache.bytes_per_token_f32 = 4 * t.cache.elements_per_token;
  t.cache.window_elements = plan.L * plan.W * c.head_dim;
  t.costs = v41_row_costs(c);
  t.limit_ideal = double(plan.E) / double(plan.L);
  t.limit_causal = v41_ratio_limit(plan, V41IndexScoring::Causal);
  t.limit_dense = v41_ratio_limit(plan, V41IndexScoring::Dense);
  // Reported second-hand for SGLang's decoder replay on the release (docs/v41.md §14.4).
  t.published.push_back({"SGLang decoder replay, vendor figure reported second-hand: prefill 1.56x faster on 8 H200 "
                         "(wall time, prompt lengths not given)",
                         1.56});

  for (const V41ReplayConvention& conv : v41_replay_conventions()) {
    V41ConventionRow row;
    row.name = conv.name;
    row.floor_first_layer = conv.floor_first_layer;
    row.all_layers = conv.all_layers;
    row.exact_span = v41_exact_span(plan, conv);
    row.floored_layers = v41_floored_layers(plan, conv);
    t.conventions.push_back(row);
  }

  for (int64_t N : Ns) {
    if (N < 1) throw InputError(fmt::format("oracle: N must be >= 1 (got {})", N));
    V41OracleRow r;
    r.n_prompt = N;
    r.bounded_replay = bounded_replay(t.split, N);
    r.ideal_ratio = ideal_ratio(t.split, N);
    const int64_t B = r.bounded_replay;
    const V41FlopCount full = prefill(c, plan, N, N, true, V41IndexScoring::Causal);
    const V41FlopCount ced = prefill(c, plan, N, B, true, V41IndexScoring::Causal);
    r.full_flops = full.total();
    r.ced_flops = ced.total();
    r.exact_ratio = share(r.ced_flops, r.full_flops);
    r.full_flops_dense = prefill(c, plan, N, N, true, V41IndexScoring::Dense).total();
    r.ced_flops_dense = prefill(c, plan, N, B, true, V41IndexScoring::Dense).total();
    r.exact_ratio_dense = share(r.ced_flops_dense, r.full_flops_dense);
    int64_t encoder = 0;
    for (int64_t l = 0; l < plan.E; ++l) encoder += full.layer(l);
    r.encoder_of_full = share(encoder, r.full_flops);
    r.index_scores_of_full = share(full.term(kV41IndexScores), r.full_flops);
    r.index_scores_of_ced = share(ced.term(kV41IndexScores), r.ced_flops);
    r.mhc_of_full = share(mhc_flops(full), r.full_flops);
    const auto& boundary = ced.rows[static_cast<size_t>(plan.E)];
    r.boundary_of_ced = share(N * t.costs.hc_collapse + boundary[kV41Compressor] + boundary[kV41IndexKeys], r.ced_flops);
    r.head_of_ced = share(ced.layer(plan.L), r.ced_flops);
    t.rows.push_back(r);

    for (V41ConventionRow& conv : t.conventions) {
      V41ConventionRatio cr;
      cr.n_prompt = N;
      cr.bounded_ratio =
          share(prefill(c, plan, N, B, conv.floor_first_layer, V41IndexScoring::Causal, conv.all_layers).total(), r.full_flops);
      cr.exact_replay = std::min(N, conv.exact_span);
      cr.exact_replay_ratio =
          share(prefill(c, plan, N, cr.exact_replay, conv.floor_first_layer, V41IndexScoring::Causal, conv.all_layers)
                    .total(),
                r.full_flops);
      conv.ratios.push_back(cr);
    }
  }
  return t;
}

std::string format_v41_oracle_table(const V41OracleTable& t) {
  const auto& sp = t.split;
  const auto pct = oracle_percent;
  std::string s = fmt::format("CED analytic oracle of the release (docs/v41.md §14), config {}: L = {}, E = {}, D = {}, "
                              "W = {}\n",
                              t.config_name, sp.L, sp.E, sp.D, sp.W);
  s += format_seed_figures(t.seed);

  s += fmt::format("KV cache (docs/v41.md §14.5): {} kv sources\n", t.cache.kv_sources);
  s += fmt::format("  copies Σ 1/ratio (of {} per-layer; the seed's lab-flash: 2.5) {:>12.4g}\n", t.cache.n_layers,
                   t.cache.copies);
  s += fmt::format("  compressed entries per token (elements)                {:>12.6g}\n", t.cache.elements_per_token);
  s += fmt::format("  bytes per token, bf16 / f32                          {:>8.6g} / {:.6g}\n",
                   t.cache.bytes_per_token_bf16, t.cache.bytes_per_token_f32);
  s += fmt::format("  window rings L·W·head_dim (elements, any N)          {:>12}\n", t.cache.window_elements);
  s += "replay conventions (docs/v41.md §13.1): the exact span 1 + F(W-1), F the floored layers\n";
  s += fmt::format("  {:<10} {:<9} {:<10} {:>4} {:>11}\n", "convention", "tail from", "cut layer", "F", "exact span");
  for (const auto& c : t.conventions)
    s += fmt::format("  {:<10} {:<9} {:<10} {:>4} {:>11}\n", c.name, c.all_layers ? "layer 0" : "layer E",
                     c.floor_first_layer ? "floored" : "whole", c.floored_layers, c.exact_span);

  s += "prefill FLOPs (2 per multiply-add), ced (B = min(N, W), layer E floored) vs full, last position's logits "
       "only\n";
  s += fmt::format("  {:>9} {:>6} {:>10} {:>10} {:>10} {:>22} {:>22}\n", "N", "B", "ideal", "exact", "dense", "full FLOPs",
                   "ced FLOPs");
  for (const auto& r : t.rows)
    s += fmt::format("  {:>9} {:>6} {:>10} {:>10} {:>10} {:>22} {:>22}\n", r.n_prompt, r.bounded_replay,
                     pct(r.ideal_ratio), pct(r.exact_ratio), pct(r.exact_ratio_dense), r.full_flops, r.ced_flops);
  s += "  ideal = (N·E + B·D)/(N·L); exact = the FLOP model of the release's layers, each query scoring the\n"
       "  entries it sees (the candidate pool above the candidate source); dense = model.py's index scores,\n"
       "  every query against all N/ratio entries\n";
  s += fmt::format("  as N grows: ideal -> E/L = {}; exact -> {}, dense -> {} (the encoder's N² index scores\n"
                   "  stay in the ced prefill, the decoder's go)\n",
                   pct(t.limit_ideal), pct(t.limit_causal), pct(t.limit_dense));

  s += "ced ratio per convention (exact scores), bounded and at the exact span\n";
  s += fmt::format("  {:>9} {:<10} {:>10} {:>8} {:>10}\n", "N", "convention", "B = W", "span", "ratio");
  for (size_t i = 0; i < t.rows.size(); ++i)
    for (const auto& c : t.conventions) {
      const auto& cr = c.ratios[i];
      s += fmt::format("  {:>9} {:<10} {:>10} {:>8} {:>10}\n", cr.n_prompt, c.name, pct(cr.bounded_ratio),
                       cr.exact_replay, pct(cr.exact_replay_ratio));
    }

  s += "where the release departs from the seed's framing (shares of the FLOPs, exact scores)\n";
  s += fmt::format("  {:>9} {:>13} {:>12} {:>11} {:>10} {:>15} {:>10}\n", "N", "encoder/full", "scores/full",
                   "scores/ced", "mHC/full", "E all rows/ced", "head/ced");
  for (const auto& r : t.rows)
    s += fmt::format("  {:>9} {:>13} {:>12} {:>11} {:>10} {:>15} {:>10}\n", r.n_prompt, pct(r.encoder_of_full),
                     pct(r.index_scores_of_full), pct(r.index_scores_of_ced), pct(r.mhc_of_full),
                     pct(r.boundary_of_ced), pct(r.head_of_ced));
  s += "  encoder = the layers below E (E/L in the framing); scores = every index source's; E all rows = layer\n"
       "  E's attention collapse, compressor and index keys on every row; head = the head on the last row\n";

  const V41RowCosts& k = t.costs;
  s += "costs per row a layer runs (FLOPs, 2 per multiply-add)\n";
  s += oracle_line("mHC mixes, both sublayers", fmt::format("{:>14}", 2 * k.hc_mixes));
  s += oracle_line("mHC Sinkhorn, both sublayers", fmt::format("{:>14}", 2 * k.hc_sinkhorn));
  s += oracle_line("mHC collapse + expansion, both sublayers", fmt::format("{:>14}", 2 * (k.hc_collapse + k.hc_expand)));
  s += oracle_line("Engram wkv + gate (Engram layers)", fmt::format("{:>14}", k.engram_wkv + k.engram_gate));
  s += oracle_line("wq_a + wq_b", fmt::format("{:>14}", k.wq_a + k.wq_b));
  s += oracle_line("window key wkv", fmt::format("{:>14}", k.window_kv));
  s += oracle_line("wo_a (grouped) + wo_b", fmt::format("{:>14}", k.wo_a + k.wo_b));
  s += oracle_line("attention, per attended entry", fmt::format("{:>14}", k.attention_entry));
  s += oracle_line("indexer wq_b + weights_proj (index sources)", fmt::format("{:>14}", k.indexer_q + k.indexer_weights));
  s += oracle_line("index scores, per scored entry", fmt::format("{:>14}", k.index_score_entry));
  s += oracle_line("compressor per token, ratio 1 / ratio > 1",
                   fmt::format("{:>14} / {} + {} pooling", k.compressor_token_plain, k.compressor_token_pooled,
                               k.compressor_pool_token));
  s += oracle_line("index key, per completed group", fmt::format("{:>14}", k.index_key_group));
  s += oracle_line("MoE gate + experts", fmt::format("{:>14}", k.gate + k.experts));
  s += oracle_line("final collapse + head (the last row)", fmt::format("{:>14}", k.hc_collapse + k.head));

  for (const auto& p : t.published)
    s += fmt::format("published: {}\n  a time ratio of 1/{} = {}: wall time against this FLOP ratio, not like with "
                     "like\n",
                     p.what, p.speedup, pct(1.0 / p.speedup));
  return s;
}

std::string v41_oracle_table_json(const V41OracleTable& t) {
  using json = nlohmann::ordered_json;
  json j;
  j["config"] = t.config_name;
  j["L"] = t.split.L;
  j["E"] = t.split.E;
  j["D"] = t.split.D;
  j["W"] = t.split.W;
  j["exact_replay"] = t.seed.exact_replay;
  j["report_upper"] = t.seed.report_upper;
  j["exact_decode_replay"] = t.seed.exact_decode_replay;
  j["work_triangle"] = t.seed.work_triangle;
  j["work_rectangle"] = t.seed.work_rectangle;
  j["work_bounded"] = t.seed.work_bounded;
  j["cache"] = {{"kv_sources", t.cache.kv_sources},
                {"copies", t.cache.copies},
                {"n_layers", t.cache.n_layers},
                {"elements_per_token", t.cache.elements_per_token},
                {"bytes_per_token_bf16", t.cache.bytes_per_token_bf16},
                {"bytes_per_token_f32", t.cache.bytes_per_token_f32},
                {"window_elements", t.cache.window_elements}};
  json rows = json::array();
  for (const auto& r : t.rows)
    rows.push_back({{"N", r.n_prompt},
                    {"B", r.bounded_replay},
                    {"ideal_ratio", r.ideal_ratio},
                    {"exact_ratio", r.exact_ratio},
                    {"full_flops", r.full_flops},
                    {"ced_flops", r.ced_flops},
                    {"exact_ratio_dense", r.exact_ratio_dense},
                    {"full_flops_dense", r.full_flops_dense},
                    {"ced_flops_dense", r.ced_flops_dense},
                    {"encoder_of_full", r.encoder_of_full},
                    {"index_scores_of_full", r.index_scores_of_full},
                    {"index_scores_of_ced", r.index_scores_of_ced},
                    {"mhc_of_full", r.mhc_of_full},
                    {"boundary_of_ced", r.boundary_of_ced},
                    {"head_of_ced", r.head_of_ced}});
  j["rows"] = rows;
  json convs = json::array();
  for (const auto& c : t.conventions) {
    json ratios = json::array();
    for (const auto& cr : c.ratios)
      ratios.push_back({{"N", cr.n_prompt},
                        {"bounded_ratio", cr.bounded_ratio},
                        {"exact_replay", cr.exact_replay},
                        {"exact_replay_ratio", cr.exact_replay_ratio}});
    convs.push_back({{"name", c.name},
                     {"floor_first_layer", c.floor_first_layer},
                     {"all_layers", c.all_layers},
                     {"floored_layers", c.floored_layers},
                     {"exact_span", c.exact_span},
                     {"ratios", ratios}});
  }
  j["conventions"] = convs;
  j["limits"] = {{"ideal", t.limit_ideal}, {"exact", t.limit_causal}, {"dense", t.limit_dense}};
  const V41RowCosts& k = t.costs;
  j["row_costs"] = {{"hc_mixes", k.hc_mixes},
                    {"hc_sinkhorn", k.hc_sinkhorn},
                    {"hc_collapse", k.hc_collapse},
                    {"hc_expand", k.hc_expand},
                    {"engram_wkv", k.engram_wkv},
                    {"engram_gate", k.engram_gate},
                    {"wq_a", k.wq_a},
                    {"wq_b", k.wq_b},
                    {"window_kv", k.window_kv},
                    {"wo_a", k.wo_a},
                    {"wo_b", k.wo_b},
                    {"indexer_q", k.indexer_q},
                    {"indexer_weights", k.indexer_weights},
                    {"gate", k.gate},
                    {"experts", k.experts},
                    {"head", k.head},
                    {"attention_entry", k.attention_entry},
                    {"index_score_entry", k.index_score_entry},
                    {"compressor_token_plain", k.compressor_token_plain},
                    {"compressor_token_pooled", k.compressor_token_pooled},
                    {"compressor_pool_token", k.compressor_pool_token},
                    {"index_key_group", k.index_key_group}};
  json pub = json::array();
  for (const auto& p : t.published) pub.push_back({{"what", p.what}, {"speedup", p.speedup}, {"time_ratio", 1.0 / p.speedup}});
  j["published"] = pub;
  return j.dump(2);
}

}  // namespace ced::v41
