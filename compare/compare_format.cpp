// docs/spec.md §8: one-line summaries and JSON renderings of the comparisons.
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "compare/compare.hpp"

namespace ced {
namespace {

std::string num(double v) { return fmt::format("{:.6g}", v); }

std::string index_text(const std::vector<int64_t>& idx) { return fmt::format("[{}]", fmt::join(idx, ",")); }

std::string index_text(int64_t flat, const std::vector<int64_t>& shape) {
  return index_text(unravel_index(flat, shape));
}

std::string nonfinite_text(const char* side, const NonFiniteCount& nf, const std::vector<int64_t>& shape) {
  std::string s = fmt::format("{}: nan={}", side, nf.nan);
  if (nf.nan > 0) s += fmt::format(" first {}", index_text(nf.first_nan, shape));
  s += fmt::format(" inf={}", nf.inf);
  if (nf.inf > 0) s += fmt::format(" first {}", index_text(nf.first_inf, shape));
  return s;
}

std::string location_text(const Location& l) {
  if (l.flat < 0) return "";
  return fmt::format(" at {} (t={} r={})", index_text(l.index), num(l.t), num(l.r));
}

std::string json_index(const std::vector<int64_t>& idx) { return fmt::format("[{}]", fmt::join(idx, ",")); }

std::string json_location(const Location& l) {
  if (l.flat < 0) return "null";
  return fmt::format(R"({{"flat":{},"index":{},"t":{},"r":{}}})", l.flat, json_index(l.index), json_number(l.t),
                     json_number(l.r));
}

std::string json_nonfinite(const NonFiniteCount& nf) {
  return fmt::format(R"({{"nan":{},"inf":{},"first_nan":{},"first_inf":{}}})", nf.nan, nf.inf, nf.first_nan,
                     nf.first_inf);
}

// "row r", or "position p" of row r when positions are given.
std::string row_text(int64_t row, std::span<const int64_t> positions) {
  if (row < 0) return "-";
  if (positions.empty()) return fmt::format("row {}", row);
  return static_cast<size_t>(row) < positions.size() ? fmt::format("position {}", positions[static_cast<size_t>(row)])
                                                     : "-";
}

}  // namespace

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20) out += fmt::format("\\u{:04x}", static_cast<unsigned>(u));
        else out += ch;  // UTF-8 passes through
    }
  }
  out += '"';
  return out;
}

std::string json_number(double v) {
  if (std::isnan(v)) return "\"nan\"";
  if (std::isinf(v)) return v > 0 ? "\"inf\"" : "\"-inf\"";
  return fmt::format("{}", v);  // shortest representation that round-trips
}

std::string summary(const TensorCompare& c) {
  std::string s = fmt::format("n={} {} | {} | {}", c.n, dtype_name(c.dtype), nonfinite_text("t", c.t_nonfinite, c.shape),
                              nonfinite_text("r", c.r_nonfinite, c.shape));
  if (c.inf_mismatches > 0)
    s += fmt::format(" | inf mismatches={} first {}", c.inf_mismatches, index_text(c.first_inf_mismatch, c.shape));
  s += fmt::format(" | max_abs={}{}", num(c.max_abs_err), location_text(c.max_abs));
  s += fmt::format(" | max_rel={}{}", num(c.max_rel_err), location_text(c.max_rel));
  if (c.zero_ref_nonzero > 0) s += fmt::format(" (+{} with r=0, t!=0)", c.zero_ref_nonzero);
  s += fmt::format(" | rel_l2={} nmse={} cos={}", num(c.rel_l2), num(c.nmse), fmt::format("{:.9g}", c.cosine));
  s += fmt::format(" | max_ulp={}{}", c.max_ulp, c.max_ulp_at.flat >= 0 ? " at " + index_text(c.max_ulp_at.index) : "");
  s += fmt::format(" | mismatches={}/{} (atol={} rtol={})", c.mismatches, c.n, num(c.atol), num(c.rtol));
  if (c.mismatches > 0) s += fmt::format(" first {}", index_text(c.first_mismatch.index));
  s += fmt::format(" | min_atol={}", num(c.min_passing_atol));
  return s;
}

std::string summary(const LogitsCompare& c) {
  std::string s = fmt::format("rows={} vocab={} | kl mean={} max={}", c.rows, c.vocab, num(c.mean_kl), num(c.max_kl));
  if (c.max_kl_row >= 0) s += fmt::format(" at row {}", c.max_kl_row);
  s += fmt::format(" | top1 {}/{} ({})", c.top1_agree, c.rows, num(c.top1_fraction));
  if (c.first_top1_disagreement >= 0) s += fmt::format(" first disagreement row {}", c.first_top1_disagreement);
  s += fmt::format(" | top{} overlap mean={} min={}", c.topk, num(c.topk_overlap), num(c.min_topk_overlap));
  if (c.min_topk_overlap_row >= 0) s += fmt::format(" at row {}", c.min_topk_overlap_row);
  s += " | " + summary(c.kl_distribution) + " | " + summary(c.greedy, {}, "t", "r");
  return s;
}

std::string summary(const SelectionCompare& c) {
  std::string s = fmt::format("rows={} k={}", c.rows, c.k);
  if (c.invalid_t + c.invalid_r > 0) s += fmt::format(" | invalid t={} r={}", c.invalid_t, c.invalid_r);
  s += fmt::format(" | jaccard mean={} min={}", num(c.mean_jaccard), num(c.min_jaccard));
  if (c.min_jaccard_row >= 0) s += fmt::format(" at row {}", c.min_jaccard_row);
  s += fmt::format(" | differing entries={} in {} rows", c.differing, c.differing_rows);
  if (c.scored) {
    s += fmt::format(" | near-ties={} real={} (near_tie={})", c.near_ties, c.real_disagreements, num(c.near_tie));
    if (c.worst_gap_row >= 0)
      s += fmt::format(" worst gap={} at row {} entry {}", num(c.worst_gap), c.worst_gap_row, c.worst_gap_entry);
  }
  return s;
}

std::string summary(const KlDistribution& d, std::span<const int64_t> positions) {
  return fmt::format("KL mean {}, p50 {}, p99 {} ({}), p99.9 {} ({}), max {} ({}); nearest rank of {} rows", num(d.mean),
                     num(d.p50), num(d.p99), row_text(d.p99_row, positions), num(d.p999),
                     row_text(d.p999_row, positions), num(d.max), row_text(d.max_row, positions), d.count);
}

std::string summary(const GreedyDivergence& g, std::span<const int64_t> positions, std::string_view a,
                    std::string_view b) {
  const std::string rule = fmt::format("greedy (vLLM's rule, top-{})", g.top_n);
  if (g.step < 0) return fmt::format("{}: the same token at all {} steps: pass", rule, g.steps);
  std::string s = fmt::format("{}: first divergence at step {}", rule, g.step);
  if (!positions.empty()) s += fmt::format(" ({})", row_text(g.step, positions));
  s += fmt::format(": {}'s token {} is rank {} in {}, {}'s token {} is rank {} in {}: {}", a, g.token_a, g.rank_a_in_b,
                   b, b, g.token_b, g.rank_b_in_a, a, g.pass ? "pass" : "FAIL");
  s += fmt::format("; logit gaps {} {}, {} {}; top-1/top-2 margins {} {}, {} {}", a, num(g.gap_a), b, num(g.gap_b), a,
                   num(g.top2_margin_a), b, num(g.top2_margin_b));
  return s;
}

std::string to_json(const TensorCompare& c) {
  std::string s = "{";
  s += fmt::format(R"("shape":{},"dtype":{},"n":{},)", json_index(c.shape), json_string(dtype_name(c.dtype)), c.n);
  s += fmt::format(R"("t_nonfinite":{},"r_nonfinite":{},"nan_pairs":{},"inf_mismatches":{},)",
                   json_nonfinite(c.t_nonfinite), json_nonfinite(c.r_nonfinite), c.nan_pairs, c.inf_mismatches);
  s += fmt::format(R"("first_inf_mismatch":{},"finite_pairs":{},)", c.first_inf_mismatch, c.finite_pairs);
  s += fmt::format(R"("max_abs_err":{},"max_abs":{},)", json_number(c.max_abs_err), json_location(c.max_abs));
  s += fmt::format(R"("max_rel_err":{},"max_rel":{},"zero_ref_nonzero":{},)", json_number(c.max_rel_err),
                   json_location(c.max_rel), c.zero_ref_nonzero);
  s += fmt::format(R"("rel_l2":{},"nmse":{},"cosine":{},)", json_number(c.rel_l2), json_number(c.nmse),
                   json_number(c.cosine));
  s += fmt::format(R"("max_ulp":{},"max_ulp_at":{},)", c.max_ulp, json_location(c.max_ulp_at));
  s += fmt::format(R"("atol":{},"rtol":{},"mismatches":{},"first_mismatch":{},"min_passing_atol":{})",
                   json_number(c.atol), json_number(c.rtol), c.mismatches, json_location(c.first_mismatch),
                   json_number(c.min_passing_atol));
  s += "}";
  return s;
}

std::string to_json(const LogitsCompare& c) {
  return fmt::format(
      R"({{"rows":{},"vocab":{},"mean_kl":{},"max_kl":{},"max_kl_row":{},"top1_agree":{},"top1_fraction":{},)"
      R"("first_top1_disagreement":{},"topk":{},"topk_overlap":{},"min_topk_overlap":{},"min_topk_overlap_row":{},)"
      R"("kl_distribution":{},"greedy_teacher_forced":{}}})",
      c.rows, c.vocab, json_number(c.mean_kl), json_number(c.max_kl), c.max_kl_row, c.top1_agree,
      json_number(c.top1_fraction), c.first_top1_disagreement, c.topk, json_number(c.topk_overlap),
      json_number(c.min_topk_overlap), c.min_topk_overlap_row, to_json(c.kl_distribution), to_json(c.greedy));
}

std::string to_json(const KlDistribution& d) {
  return fmt::format(
      R"({{"count":{},"mean":{},"p50":{},"p50_row":{},"p99":{},"p99_row":{},"p999":{},"p999_row":{},"max":{},)"
      R"("max_row":{},"quantile_rule":"nearest-rank"}})",
      d.count, json_number(d.mean), json_number(d.p50), d.p50_row, json_number(d.p99), d.p99_row, json_number(d.p999),
      d.p999_row, json_number(d.max), d.max_row);
}

std::string to_json(const GreedyDivergence& g) {
  return fmt::format(
      R"({{"steps":{},"top_n":{},"pass":{},"step":{},"token_a":{},"token_b":{},"rank_a_in_b":{},"rank_b_in_a":{},)"
      R"("gap_a":{},"gap_b":{},"top2_margin_a":{},"top2_margin_b":{}}})",
      g.steps, g.top_n, g.pass ? "true" : "false", g.step, g.token_a, g.token_b, g.rank_a_in_b, g.rank_b_in_a,
      json_number(g.gap_a), json_number(g.gap_b), json_number(g.top2_margin_a), json_number(g.top2_margin_b));
}

std::string to_json(const SelectionCompare& c) {
  std::string s = fmt::format(
      R"({{"rows":{},"k":{},"mean_jaccard":{},"min_jaccard":{},"min_jaccard_row":{},"invalid_t":{},"invalid_r":{},)"
      R"("differing":{},"differing_rows":{},"scored":{})",
      c.rows, c.k, json_number(c.mean_jaccard), json_number(c.min_jaccard), c.min_jaccard_row, c.invalid_t,
      c.invalid_r, c.differing, c.differing_rows, c.scored ? "true" : "false");
  if (c.scored)
    s += fmt::format(R"(,"near_tie":{},"near_ties":{},"real_disagreements":{},"worst_gap":{},"worst_gap_row":{},)"
                     R"("worst_gap_entry":{})",
                     json_number(c.near_tie), c.near_ties, c.real_disagreements, json_number(c.worst_gap),
                     c.worst_gap_row, c.worst_gap_entry);
  s += R"(,"listed":[)";
  for (size_t i = 0; i < c.listed.size(); ++i) {
    const auto& d = c.listed[i];
    if (i) s += ",";
    s += fmt::format(R"({{"row":{},"entry":{},"in":{})", d.row, d.entry, d.in_t ? R"("t")" : R"("r")");
    if (c.scored)
      s += fmt::format(R"(,"score":{},"gap":{},"near_tie":{})", json_number(d.score), json_number(d.gap),
                       d.near_tie ? "true" : "false");
    s += "}";
  }
  s += "]}";
  return s;
}

}  // namespace ced
