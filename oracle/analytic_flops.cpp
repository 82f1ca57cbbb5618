// docs/spec.md §7: the FLOP model. See analytic_flops.hpp.
#include "oracle/analytic_flops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "model/error.hpp"
#include "models/lab/schedule.hpp"
#include "oracle/checked_int.hpp"

namespace ced {
namespace {

using checked::add;
using checked::mul;

constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();

}  // namespace

// ---- Query and schedule ------------------------------------------------------

FlopQuery flop_query(const RunRequest& r) {
  FlopQuery q;
  q.mode = r.mode;
  q.replay = r.replay;
  q.n_prompt = r.n_prompt;
  q.prefix_len = r.prefix_len;
  q.resume_replay = r.resume_replay;
  q.decode_steps = r.decode_steps;
  q.logits = r.logits;
  return q;
}

void validate_flop_query(const FlopQuery& q) {
  if (q.n_prompt < 1) throw InputError(fmt::format("flop model: N must be >= 1 (got {})", q.n_prompt));
  if (q.decode_steps < 0)
    throw InputError(fmt::format("flop model: decode steps must be >= 0 (got {})", q.decode_steps));
  if (q.mode == Mode::Full && q.replay.kind != ReplayPolicy::Kind::None)
    throw InputError("flop model: full mode takes no replay policy");
  if (q.mode != Mode::Full && q.replay.kind == ReplayPolicy::Kind::None)
    throw InputError(fmt::format("flop model: {} mode needs a replay policy", mode_name(q.mode)));
  if (q.replay.kind == ReplayPolicy::Kind::Count && q.replay.count < 1)
    throw InputError(fmt::format("flop model: replay K must be >= 1 (got {})", q.replay.count));
  if (q.mode == Mode::Resume) {
    if (q.prefix_len < 0 || q.prefix_len > q.n_prompt)
      throw InputError(
          fmt::format("flop model: P must satisfy 0 <= P <= N = {} (got {})", q.n_prompt, q.prefix_len));
    if (q.resume_replay == 0 || q.resume_replay < -1)
      throw InputError(fmt::format("flop model: resume replay length must be >= 1 (got {})", q.resume_replay));
  } else if (q.prefix_len != -1) {
    throw InputError("flop model: only resume mode takes a prefix");
  }
}

// Deliberately not models/lab/schedule.hpp's run_schedule: the oracle derives the
// evaluated positions from the spec's rules on its own, as an independent
// prediction, so a slip in the schedule the backends share shows up as a
// disagreement between this FLOP model and the instrumented counter
// (prop::check_flops) instead of being repeated on both sides.
EvalSchedule eval_schedule(const Plan& plan, const FlopQuery& q) {
  validate_flop_query(q);
  EvalSchedule s;
  const int64_t N = q.n_prompt;
  s.n_prompt = N;
  s.n_total = N + q.decode_steps;
  switch (q.mode) {
    case Mode::Full:  // docs/spec.md §4 full: every layer at 0..N-1
      break;
    case Mode::Ced: {  // docs/spec.md §4 ced: B = min(N, n_replay), s = N - B
      const int64_t B = std::min(N, n_replay(q.replay, plan, N));
      s.replay_start = N - B;
      break;
    }
    case Mode::Resume: {  // docs/spec.md §6: s_r = max(0, P - W), s = max(N - B, s_r)
      const int64_t span = q.resume_replay < 0 ? plan.W : q.resume_replay;
      s.encoder_start = std::max<int64_t>(0, q.prefix_len - span);
      const int64_t B = std::min(N, n_replay(q.replay, plan, N));
      s.replay_start = std::max(N - B, s.encoder_start);
      s.token_start = q.prefix_len;  // the cache holds tokens 0..P-1
      break;
    }
  }
  s.first.resize(size_t(plan.L));
  for (int64_t l = 0; l < plan.L; ++l) s.first[size_t(l)] = plan[l].decoder ? s.replay_start : s.encoder_start;
  // Full mode: logits at 0..N-1; ced / resume: at s..N-1 (docs/spec.md §4); or the last only.
  s.logits_first = q.logits == LogitsScope::Last ? N - 1 : s.replay_start;
  return s;
}

// ---- Per-position costs (docs/spec.md §3, §7) -----------------------------------------

int64_t flops_query(const Config& c) {  // q_lat = x̂ wq_a; q = q_lat wq_b
  return 2 * (c.d_model * c.q_lora_rank + c.q_lora_rank * c.n_heads * c.head_dim);
}
int64_t flops_local_entry(const Config& c) {  // x̂ wkv
  return 2 * c.d_model * c.head_dim;
}
int64_t flops_attention(const Config& c, int64_t n_entries) {  // q·k and Σ weight·value per head
  return mul(2 * 2 * c.n_heads * c.head_dim, n_entries);
}
int64_t flops_output(const Config& c) {  // concat(o_h in g) wo_a.g per group; concat(u_g) wo_b
  return 2 * (c.n_heads * c.head_dim * c.o_lora_rank + c.o_groups * c.o_lora_rank * c.d_model);
}
int64_t flops_router(const Config& c) {  // f̂ router
  return 2 * c.d_model * c.n_routed_experts;
}
int64_t flops_experts(const Config& c) {  // SwiGLU: w1, w3, w2 per active and shared expert
  const int64_t active = c.n_routed_experts > 0 ? c.n_active_experts : 0;
  return 2 * 3 * c.d_model * c.moe_dim * (active + c.n_shared_experts);
}
int64_t flops_indexer_qw(const Config& c) {  // iq = q_lat idx_wq; w = x̂ idx_wweights
  return 2 * (c.q_lora_rank * c.index_n_heads * c.index_head_dim + c.d_model * c.index_n_heads);
}
int64_t flops_index_scoring(const Config& c, int64_t n_eligible) {  // iq_h · ik_j per head and entry
  return mul(2 * c.index_n_heads * c.index_head_dim, n_eligible);
}
int64_t flops_compressor_token(const Config& c, int64_t r) {  // x̂ comp_wkv (and x̂ comp_wgate for r >= 2)
  return (r >= 2 ? 2 : 1) * 2 * c.d_model * c.head_dim;
}
int64_t flops_index_key(const Config& c) {  // lat_j idx_wk
  return 2 * c.head_dim * c.index_head_dim;
}
int64_t flops_lm_head(const Config& c) {  // final x̂ lm_head
  return 2 * c.d_model * c.vocab_size;
}

// ---- Entry counts --------------------------------------------------------------

int64_t n_local(int64_t first, int64_t W, int64_t p) { return p - std::max(first, p - W + 1) + 1; }

int64_t n_visible(int64_t r, int64_t p) { return (p + 1) / r; }

int64_t pool_size(const Config& c, int64_t n_vis) {
  const int64_t bs = c.candidate_block_size, kb = c.candidate_topk_blocks;
  const int64_t nb = (n_vis + bs - 1) / bs;  // visible blocks, the newest maybe partial
  if (nb <= kb) return n_vis;
  return (kb - 1) * bs + (n_vis - (nb - 1) * bs);
}

namespace {
// Index source l scores only its pool (rather than every visible entry).
bool scores_pool(const LayerPlan& lp) { return lp.selects_in_pool && !lp.candidate_source; }
}  // namespace

int64_t n_scored(const Config& c, const Plan& plan, int64_t l, int64_t p) {
  const LayerPlan& lp = plan[l];
  const int64_t nv = n_visible(lp.ratio, p);
  return scores_pool(lp) ? pool_size(c, nv) : nv;
}

int64_t n_selected(const Config& c, const Plan& plan, int64_t l, int64_t p) {
  const LayerPlan& src = plan[plan[l].idx_src];
  const int64_t nv = n_visible(src.ratio, p);
  const int64_t eligible = src.selects_in_pool ? pool_size(c, nv) : nv;
  return std::min(c.index_topk, eligible);
}

int64_t entries_completed(int64_t r, int64_t t0, int64_t t1) { return t1 / r - t0 / r; }

// ---- The model, position by position -------------------------------------------

FlopCount flop_model_by_position(const Config& c, const Plan& plan, const FlopQuery& q) {
  const EvalSchedule s = eval_schedule(plan, q);
  FlopCount f;
  f.resize(plan.L);
  auto add_to = [&f](int64_t l, int kind, int64_t v) {
    int64_t& cell = f.per_layer[size_t(l)][size_t(kind)];
    cell = add(cell, v);
  };
  for (int64_t l = 0; l < plan.L; ++l) {
    const LayerPlan& lp = plan[l];
    const int64_t first = s.first[size_t(l)];
    for (int64_t p = first; p < s.n_total; ++p) {  // prefill positions, then decode positions
      add_to(l, kFlopQuery, flops_query(c));
      add_to(l, kFlopLocalEntry, flops_local_entry(c));
      const int64_t n_sel = lp.ratio > 0 ? n_selected(c, plan, l, p) : 0;
      add_to(l, kFlopAttention, flops_attention(c, n_local(first, plan.W, p) + n_sel));
      add_to(l, kFlopOutput, flops_output(c));
      add_to(l, kFlopRouter, flops_router(c));
      add_to(l, kFlopExperts, flops_experts(c));
      if (lp.index_source) {
        add_to(l, kFlopIndexerQW, flops_indexer_qw(c));
        add_to(l, kFlopIndexScoring, flops_index_scoring(c, n_scored(c, plan, l, p)));
      }
    }
    if (lp.role == Role::Full) {  // the compressor consumes every token the source covers
      for (int64_t t = s.token_start; t < s.n_total; ++t) {
        add_to(l, kFlopCompressor, flops_compressor_token(c, lp.ratio));
        if ((t + 1) % lp.ratio == 0) add_to(l, kFlopIndexKeys, flops_index_key(c));  // entry (t+1)/r - 1 completes
      }
    }
  }
  for (int64_t p = s.logits_first; p < s.n_total; ++p) add_to(plan.L, kFlopLmHead, flops_lm_head(c));
  return f;
}

// ---- The model, in closed form -------------------------------------------------
namespace {

// Σ_{x=1}^{n} min(T, x); 0 for n <= 0.
int64_t sum_capped(int64_t T, int64_t n) {
  if (n <= 0) return 0;
  if (n <= T) return mul(n, n + 1) / 2;
  return add(mul(T, T + 1) / 2, mul(n - T, T));
}

// A per-query entry count as a function of v = n_visible(r, p):
// h(v) = min(cap, pool ? pool_size(v) : v).
struct EntryCount {
  const Config* c = nullptr;
  int64_t r = 1;
  bool pool = false;
  int64_t cap = kNoCap;

  int64_t at(int64_t v) const { return std::min(cap, pool ? pool_size(*c, v) : v); }

  // Σ_{v=0}^{q-1} h(v).
  int64_t values_below(int64_t q) const {
    if (q <= 0) return 0;
    if (!pool) return sum_capped(cap, q - 1);  // h(0) = 0
    // v <= kb·bs: the pool is everything, h(v) = min(cap, v).
    const int64_t bs = c->candidate_block_size, kb = c->candidate_topk_blocks;
    const int64_t v_all = kb * bs;
    int64_t s = sum_capped(cap, std::min(q - 1, v_all));
    if (q - 1 <= v_all) return s;
    // v = kb·bs + 1 + i: pool = (kb-1)·bs + 1 + (i mod bs), a sawtooth of period bs.
    const int64_t base = (kb - 1) * bs;
    const int64_t m = q - 1 - v_all;  // i = 0 .. m-1
    const int64_t period = sum_capped(cap, base + bs) - sum_capped(cap, base);
    s = add(s, mul(m / bs, period));
    return add(s, sum_capped(cap, base + m % bs) - sum_capped(cap, base));
  }

  // Σ_{x=0}^{n-1} h(floor(x / r)): each value v < n/r taken r times, then the rest.
  int64_t by_numerator(int64_t n) const { return add(mul(r, values_below(n / r)), mul(n % r, at(n / r))); }

  // Σ_{p=a}^{b-1} h(n_visible(r, p)) = Σ_{x=a+1}^{b} h(floor(x / r)).
  int64_t over_positions(int64_t a, int64_t b) const { return by_numerator(b + 1) - by_numerator(a + 1); }
};

// Σ_{p=first}^{end-1} n_local(first, W, p) = Σ_{i=1}^{end-first} min(W, i).
int64_t local_entries(int64_t W, int64_t first, int64_t end) { return sum_capped(W, end - first); }

}  // namespace

FlopCount flop_model(const Config& c, const Plan& plan, const FlopQuery& q) {
  const EvalSchedule s = eval_schedule(plan, q);
  FlopCount f;
  f.resize(plan.L);
  for (int64_t l = 0; l < plan.L; ++l) {
    const LayerPlan& lp = plan[l];
    auto& row = f.per_layer[size_t(l)];
    const int64_t first = s.first[size_t(l)], end = s.n_total;
    const int64_t n_eval = end - first;
    row[kFlopQuery] = mul(n_eval, flops_query(c));
    row[kFlopLocalEntry] = mul(n_eval, flops_local_entry(c));
    int64_t entries = local_entries(plan.W, first, end);
    if (lp.ratio > 0) {
      const LayerPlan& src = plan[lp.idx_src];  // Reuse layers take idx_src's selection
      const EntryCount selected{&c, src.ratio, src.selects_in_pool, c.index_topk};
      entries = add(entries, selected.over_positions(first, end));
    }
    row[kFlopAttention] = flops_attention(c, entries);
    row[kFlopOutput] = mul(n_eval, flops_output(c));
    row[kFlopRouter] = mul(n_eval, flops_router(c));
    row[kFlopExperts] = mul(n_eval, flops_experts(c));
    if (lp.index_source) {
      const EntryCount scored{&c, lp.ratio, scores_pool(lp), kNoCap};
      row[kFlopIndexerQW] = mul(n_eval, flops_indexer_qw(c));
      row[kFlopIndexScoring] = flops_index_scoring(c, scored.over_positions(first, end));
    }
    if (lp.role == Role::Full) {
      row[kFlopCompressor] = mul(end - s.token_start, flops_compressor_token(c, lp.ratio));
      row[kFlopIndexKeys] = mul(entries_completed(lp.ratio, s.token_start, end), flops_index_key(c));
    }
  }
  f.per_layer[size_t(plan.L)][kFlopLmHead] = mul(s.n_total - s.logits_first, flops_lm_head(c));
  return f;
}

std::string format_flop_count(const FlopCount& f) {
  std::string out = fmt::format("{:>7}", "layer");
  for (int k = 0; k < kFlopKinds; ++k) out += fmt::format(" {:>16}", flop_kind_name(k));
  out += fmt::format(" {:>18}\n", "total");
  for (size_t l = 0; l < f.per_layer.size(); ++l) {
    out += l + 1 == f.per_layer.size() ? fmt::format("{:>7}", "lm_head") : fmt::format("{:>7}", l);
    for (int k = 0; k < kFlopKinds; ++k) out += fmt::format(" {:>16}", f.per_layer[l][size_t(k)]);
    out += fmt::format(" {:>18}\n", f.total_layer(int64_t(l)));
  }
  out += fmt::format("{:>7}", "total");
  for (int k = 0; k < kFlopKinds; ++k) out += fmt::format(" {:>16}", f.total_kind(k));
  out += fmt::format(" {:>18}\n", f.total());
  return out;
}

}  // namespace ced
