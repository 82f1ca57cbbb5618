// docs/spec.md §7: the analytic oracle table. See analytic.hpp.
#include "oracle/analytic.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "model/error.hpp"

namespace ced {

// ---- Exactness cone (docs/spec.md §4) ----------------------------------------------------

bool cone_exact(const Plan& plan, int64_t k, int64_t p, int64_t s) {
  if (k < 0 || k >= plan.D)
    throw InputError(fmt::format("cone: decoder layer index k must satisfy 0 <= k < D = {} (got {})", plan.D, k));
  return s == 0 || p - (k + 1) * (plan.W - 1) >= s;
}

int64_t cone_min_replay(const Plan& plan, int64_t k) {
  if (k < 0 || k >= plan.D)
    throw InputError(fmt::format("cone: decoder layer index k must satisfy 0 <= k < D = {} (got {})", plan.D, k));
  // Last position p = N-1, s = N-B: N-1 - (k+1)(W-1) >= N-B  <=>  B >= 1 + (k+1)(W-1).
  return 1 + (k + 1) * (plan.W - 1);
}

int64_t predicted_min_exact_replay(const Plan& plan, int64_t N) { return std::min(N, plan.exact_replay()); }

int64_t predicted_min_exact_decode_replay(const Plan& plan, int64_t N) {
  return std::max<int64_t>(1, std::min(N, plan.exact_decode_replay()));
}

// ---- Ratios --------------------------------------------------------------------------

CedSplit ced_split(const Plan& plan) { return {plan.L, plan.E, plan.D, plan.W}; }

int64_t bounded_replay(const Plan& plan, int64_t N) { return bounded_replay(ced_split(plan), N); }

double ideal_ratio(const Plan& plan, int64_t N) { return ideal_ratio(ced_split(plan), N); }

RatioFlops exact_ratio_flops(const Config& c, const Plan& plan, int64_t N) {
  FlopQuery full;
  full.mode = Mode::Full;
  full.n_prompt = N;
  full.logits = LogitsScope::Last;
  FlopQuery ced = full;
  ced.mode = Mode::Ced;
  ced.replay.kind = ReplayPolicy::Kind::Bounded;
  return {flop_model(c, plan, full).total(), flop_model(c, plan, ced).total()};
}

// ---- The table -------------------------------------------------------------------------

OracleTable oracle_table(const Config& c, std::vector<int64_t> Ns, std::optional<int64_t> prefix) {
  const Plan plan = make_plan(c);
  OracleTable t;
  t.config_name = c.name;
  t.L = plan.L;
  t.E = plan.E;
  t.D = plan.D;
  t.W = plan.W;
  const int64_t D = plan.D, W = plan.W;
  t.seed = seed_figures(ced_split(plan));

  for (int64_t N : Ns) {
    if (N < 1) throw InputError(fmt::format("oracle: N must be >= 1 (got {})", N));
    OracleRow row;
    row.n_prompt = N;
    row.bounded_replay = bounded_replay(plan, N);
    row.ideal_ratio = ideal_ratio(plan, N);
    const RatioFlops f = exact_ratio_flops(c, plan, N);
    row.full_flops = f.full;
    row.ced_flops = f.ced;
    row.exact_ratio = f.ratio();
    t.rows.push_back(row);
  }

  t.n_layers_cache = plan.L;
  for (int64_t l : plan.kv_sources) {
    const double r = double(plan[l].ratio);
    t.cache_copies += 1.0 / r;
    t.cache_elements_per_token += double(c.head_dim + c.index_head_dim) / r;
  }
  t.cache_bytes_per_token_bf16 = 2 * t.cache_elements_per_token;
  t.cache_bytes_per_token_f32 = 4 * t.cache_elements_per_token;
  t.local_entries_elements = plan.L * W * c.head_dim;

  for (int64_t k = 0; k < D; ++k) t.cone.push_back({k, plan.E + k, cone_min_replay(plan, k)});

  if (prefix) {
    const int64_t P = *prefix;
    if (P < 0) throw InputError(fmt::format("oracle: prefix P must be >= 0 (got {})", P));
    EncoderReplaySpans s;
    s.prefix_len = P;
    s.bounded_span = std::min(P, W);
    s.bounded_work = plan.E * s.bounded_span;
    s.exact_local_span = plan.E * (W - 1);
    s.exact_hidden_span = 1 + plan.E * (W - 1);
    t.spans = s;
  }
  return t;
}

namespace {
// Shortest decimal that round-trips (fmt's default for double), e.g. 2.5.
std::string num(double x) { return fmt::format("{}", x); }
// A JSON string literal (config names may be file paths).
std::string json_string(const std::string& v) {
  std::string out = "\"";
  for (char ch : v) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(ch)));
      continue;
    }
    out += ch;
  }
  return out + "\"";
}
}  // namespace

std::string format_oracle_table(const OracleTable& t) {
  std::string s;
  auto line = [&s](const std::string& what, const std::string& value) { s += oracle_line(what, value); };
  s += fmt::format("CED analytic oracle (docs/spec.md §7), config {}: L = {}, E = {}, D = {}, W = {}\n", t.config_name, t.L,
                   t.E, t.D, t.W);
  s += format_seed_figures(t.seed);
  s += "cache\n";
  line(fmt::format("KV cache copies Σ 1/r (of {} per-layer)", t.n_layers_cache),
       fmt::format("{:>12}", num(t.cache_copies)));
  line("global entries per token Σ (hd + ihd)/r", fmt::format("{:>12} elements = {} B bf16 = {} B f32",
                                                                num(t.cache_elements_per_token),
                                                                num(t.cache_bytes_per_token_bf16),
                                                                num(t.cache_bytes_per_token_f32)));
  line("local (SWA) entries L·W·head_dim, any N",
       fmt::format("{:>12} elements = {} B bf16 = {} B f32", t.local_entries_elements,
                   2 * t.local_entries_elements, 4 * t.local_entries_elements));

  s += "prefill FLOPs, ced (bounded, B = min(N, W)) vs full, last position's logits only\n";
  s += fmt::format("  {:>9} {:>6} {:>12} {:>12} {:>22} {:>22}\n", "N", "B", "ideal", "exact", "full FLOPs",
                   "ced FLOPs");
  for (const auto& r : t.rows)
    s += fmt::format("  {:>9} {:>6} {:>12} {:>12} {:>22} {:>22}\n", r.n_prompt, r.bounded_replay, oracle_percent(r.ideal_ratio),
                     oracle_percent(r.exact_ratio), r.full_flops, r.ced_flops);
  s += "  ideal = (N·E + B·D)/(N·L); exact = the FLOP model of the actual layers\n";

  s += "exactness cone: decoder layer E+k is exact at the last position iff B >= B_k = 1 + (k+1)(W-1) or s = 0\n";
  s += fmt::format("  {:>4} {:>6} {:>8}\n", "k", "layer", "B_k");
  for (const auto& c : t.cone) s += fmt::format("  {:>4} {:>6} {:>8}\n", c.k, c.layer, c.min_replay);

  if (t.spans) {
    const auto& e = *t.spans;
    s += fmt::format("encoder replay for a prefix P = {} (positions)\n", e.prefix_len);
    line("bounded span min(P, W)", fmt::format("{:>12}", e.bounded_span));
    line("its work E·min(P, W) (position-layers)", fmt::format("{:>12}", e.bounded_work));
    line("exact rebuild, local entries read next E(W-1)", fmt::format("{:>12}", e.exact_local_span));
    line("exact rebuild, exact H_E at P-1 1 + E(W-1)", fmt::format("{:>12}", e.exact_hidden_span));
  }
  return s;
}

std::string oracle_table_json(const OracleTable& t) {
  std::string s = "{\n";
  s += fmt::format("  \"config\": {},\n", json_string(t.config_name));
  s += fmt::format("  \"L\": {}, \"E\": {}, \"D\": {}, \"W\": {},\n", t.L, t.E, t.D, t.W);
  s += fmt::format("  \"exact_replay\": {}, \"report_upper\": {}, \"exact_decode_replay\": {},\n", t.seed.exact_replay,
                   t.seed.report_upper, t.seed.exact_decode_replay);
  s += fmt::format("  \"work_triangle\": {}, \"work_rectangle\": {}, \"work_bounded\": {},\n", t.seed.work_triangle,
                   t.seed.work_rectangle, t.seed.work_bounded);
  s += fmt::format("  \"cache_copies\": {}, \"cache_elements_per_token\": {}, \"cache_bytes_per_token_bf16\": {}, "
                   "\"cache_bytes_per_token_f32\": {},\n",
                   num(t.cache_copies), num(t.cache_elements_per_token), num(t.cache_bytes_per_token_bf16),
                   num(t.cache_bytes_per_token_f32));
  s += fmt::format("  \"local_entries_elements\": {},\n", t.local_entries_elements);
  s += "  \"rows\": [";
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const auto& r = t.rows[i];
    s += fmt::format("{}\n    {{\"N\": {}, \"B\": {}, \"ideal_ratio\": {}, \"exact_ratio\": {}, \"full_flops\": {}, "
                     "\"ced_flops\": {}}}",
                     i ? "," : "", r.n_prompt, r.bounded_replay, num(r.ideal_ratio), num(r.exact_ratio), r.full_flops,
                     r.ced_flops);
  }
  s += t.rows.empty() ? "],\n" : "\n  ],\n";
  s += "  \"cone\": [";
  for (size_t i = 0; i < t.cone.size(); ++i)
    s += fmt::format("{}{{\"k\": {}, \"layer\": {}, \"min_replay\": {}}}", i ? ", " : "", t.cone[i].k, t.cone[i].layer,
                     t.cone[i].min_replay);
  s += "]";
  if (t.spans) {
    const auto& e = *t.spans;
    s += fmt::format(",\n  \"encoder_replay\": {{\"prefix_len\": {}, \"bounded_span\": {}, \"bounded_work\": {}, "
                     "\"exact_local_span\": {}, \"exact_hidden_span\": {}}}",
                     e.prefix_len, e.bounded_span, e.bounded_work, e.exact_local_span, e.exact_hidden_span);
  }
  s += "\n}\n";
  return s;
}

}  // namespace ced
