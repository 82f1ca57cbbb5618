#pragma once
// docs/spec.md §7: the FLOP model of a prefill (full / ced / resume) and its decode
// steps. It equals, exactly (int64, per layer, per FlopKind), what the
// instrumented reference counts: 2 FLOPs per multiply-add; norms, RoPE,
// softmax and sorting are not counted.
//
// Two implementations of the same rules:
//  - flop_model_by_position: the rules read literally, one position at a time
//    (O((N + K)·L)); the definition the closed form is tested against.
//  - flop_model: per layer, arithmetic series over the evaluated positions
//    (O(L), independent of N); what the oracle table uses.
// Both derive the evaluated positions themselves rather than from
// models/lab/schedule.hpp: the model is an independent prediction of what the
// instrumented reference counts.
#include <cstdint>
#include <string>
#include <vector>

#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"
#include "model/run.hpp"

namespace ced {

// What the FLOP model is asked about: the fields of a RunRequest that decide
// which positions are evaluated and which logits are produced.
struct FlopQuery {
  Mode mode = Mode::Full;
  ReplayPolicy replay;         // ced / resume; Kind::None in full mode
  int64_t n_prompt = 0;        // N
  int64_t prefix_len = -1;     // P (resume only)
  int64_t resume_replay = -1;  // s_r = max(0, P - resume_replay); -1 = W (docs/spec.md §6)
  int64_t decode_steps = 0;    // K: decode positions N .. N+K-1
  LogitsScope logits = LogitsScope::All;  // of the prefill; decode always produces its logits
};

// The FlopQuery of a run request (its faults, tokens and probes are ignored).
FlopQuery flop_query(const RunRequest& r);
// Throws InputError for queries that break docs/spec.md §4–§6 (mirrors validate_request).
void validate_flop_query(const FlopQuery& q);

// docs/spec.md §4–§6: the positions each layer evaluates. Layer l evaluates the
// contiguous positions first[l] .. n_total-1 (the prefill up to N-1, then the
// decode positions).
struct EvalSchedule {
  int64_t n_prompt = 0;        // N
  int64_t n_total = 0;         // N + K
  int64_t replay_start = 0;    // decoder s (0 in full mode)
  int64_t encoder_start = 0;   // s_r in resume mode, else 0
  int64_t token_start = 0;     // first token the kv sources consume: P in resume mode, else 0
  int64_t logits_first = 0;    // first prefill position whose logits are produced
  std::vector<int64_t> first;  // [L] first evaluated position of each layer
};
EvalSchedule eval_schedule(const Plan& plan, const FlopQuery& q);

// ---- Per-position costs (2 per multiply-add), docs/spec.md §3 -----------------------
int64_t flops_query(const Config& c);        // §3.1: 2(d·q_lora + q_lora·H·hd)
int64_t flops_local_entry(const Config& c);  // §3.2: 2·d·hd
int64_t flops_attention(const Config& c, int64_t n_entries);  // §3.5: 2·2·H·hd·n (scores and values)
int64_t flops_output(const Config& c);       // §3.6: 2(H·hd·o_lora + o_groups·o_lora·d)
int64_t flops_router(const Config& c);       // §3.7: 2·d·n_routed
int64_t flops_experts(const Config& c);      // §3.7: 2·3·d·moe_dim·(n_active + n_shared)
int64_t flops_indexer_qw(const Config& c);   // §3.4: 2(q_lora·ih·ihd + d·ih), index sources
int64_t flops_index_scoring(const Config& c, int64_t n_eligible);  // §3.4: 2·ih·ihd·n
int64_t flops_compressor_token(const Config& c, int64_t r);  // §3.3: 2·d·hd (r = 1), 2·2·d·hd (r >= 2)
int64_t flops_index_key(const Config& c);    // §3.3: 2·hd·ihd per completed entry
int64_t flops_lm_head(const Config& c);      // §3: 2·d·V per produced logits row

// ---- Entry counts at query position p ---------------------------------------
// §3.5/§4/§5: local entries p - lo(p) + 1 with lo(p) = max(first, p - W + 1).
int64_t n_local(int64_t first, int64_t W, int64_t p);
// §3.3: entries visible to p, (j+1)·r - 1 <= p, i.e. floor((p+1)/r).
int64_t n_visible(int64_t r, int64_t p);
// §3.4: entries in the candidate pool of a query that sees n_vis entries: all
// when ceil(n_vis/bs) <= topk_blocks, else (topk_blocks-1) full blocks plus the
// pinned newest block.
int64_t pool_size(const Config& c, int64_t n_vis);
// §3.4: entries index source l scores at p (all visible before / at the
// candidate source or without a pool; the pool at later index sources).
int64_t n_scored(const Config& c, const Plan& plan, int64_t l, int64_t p);
// §3.4: |S_l(p)| for a layer with r > 0: min(index_topk, eligible entries of
// idx_src(l)), eligible = the pool at and after the candidate source. Reuse
// layers take idx_src(l)'s selection at the same p.
int64_t n_selected(const Config& c, const Plan& plan, int64_t l, int64_t p);
// §3.3: entries completed by consuming tokens t0 .. t1-1 (block j completes at token (j+1)r - 1).
int64_t entries_completed(int64_t r, int64_t t0, int64_t t1);

// ---- The model --------------------------------------------------------------
// Per layer (rows 0..L-1) and the lm_head (row L). Throws InputError for a bad
// query, std::overflow_error if a count leaves int64.
FlopCount flop_model(const Config& c, const Plan& plan, const FlopQuery& q);
FlopCount flop_model_by_position(const Config& c, const Plan& plan, const FlopQuery& q);

// A readable table: one row per layer (and the lm_head), one column per FlopKind.
std::string format_flop_count(const FlopCount& f);

}  // namespace ced
