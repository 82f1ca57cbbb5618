#pragma once
// The CED properties (docs/spec.md §4–§7) as checks on one model and one input: each
// returns "" when the property holds, else what broke. The RapidCheck suite
// feeds them generated configs and lengths; the fault kill table runs every
// check against every fault; `ced verify` runs them on the default config.
#include <functional>
#include <string>

#include "checks/harness.hpp"

namespace ced::prop {

std::string check_replay_full_equals_full(const Model& m, int64_t N);
std::string check_cone(const Model& m, int64_t N, int64_t K);
std::string check_min_exact_replay(const Model& m, int64_t N);
std::string check_decode_bound(const Model& m, int64_t N, int64_t steps);
std::string check_bounded_equals_exact_short(const Model& m, int64_t N);
std::string check_source_only_write(const Model& m, int64_t N);
std::string check_reuse_selection(const Model& m, int64_t N);
// Builds its own models (tied, Reindex, untied); `wrap`, when given, wraps
// each one's backend (label "tied", "reindex", "untied"): the tests of the
// checks plant differences through it.
std::string check_shared_kv(const Config& c, int64_t N, Fault fault = Fault::None, const BackendDecorator& wrap = {});
std::string check_resume_short_prefix(const Model& m, int64_t N, int64_t P);
std::string check_resume_saved_cache(const Model& m, int64_t N, int64_t P);
std::string check_flops(const Model& m, int64_t N);
// The counter of one run against the oracle's FLOP model, every layer and kind.
std::string check_flops_of(const Model& m, const RunRequest& r);
std::string check_decode_equals_prefill(const Model& m, int64_t N, int64_t K);
// docs/spec.md §3 invariants: a ced run (bounded replay, 2 decode steps, captured) on 1
// and on 2 .. max_threads OpenMP threads gives the same bits; positions 0..N-1 of a full run
// of N and of N + extra (on 2 threads) give the same bits. They guard the
// parallel regions only on a model wide enough to open them (wide_config).
std::string check_thread_invariance(const Model& m, int64_t N, int max_threads = 2);
std::string check_batch_invariance(const Model& m, int64_t N, int64_t extra);
// `base` widened (d_model 256, moe_dim 128) so that at N >= 33 positions the
// FFN's matmuls run in matmul_rows' OpenMP parallel region.
Config wide_config(const Config& base);

// Spans found on the model by search over replay length (docs/spec.md §4, §6).
struct Spans {
  int64_t exact_last = -1;        // min B: last logits exact (dependency probe)
  int64_t exact_decode = -1;      // min B: decode logits exact (dependency probe)
  int64_t numeric_last = -1;      // min B: last logits bitwise equal to full mode's, plain arithmetic
  int64_t enc_exact_hidden = -1;  // min encoder replay: exact H_E at P-1 (probe); -1 without a prefix
  int64_t enc_exact_next = -1;    // min encoder replay: exact H_E at P, the first new position (probe)
};
// N prompt tokens; P > 0 also searches the encoder resume spans (needs N > P).
// `progress` (optional) hears one line per step of a search. The decoder
// searches share one replay session (the encoder computed once,
// reference/lab/replays.hpp); the two probe searches of each part share a run
// where they ask the same length.
Spans empirical_spans(const Model& m, int64_t N, int64_t P,
                      const std::function<void(const std::string&)>& progress = {});

// One row of `ced spans`: a span as the oracle states it (capped by N and P, docs/spec.md §4, §6) beside
// the one a search found (-1 when there was no search).
struct SpanRow {
  std::string what;
  int64_t oracle = 0, found = -1;
};
// The four rows in the order printed: the decoder's exact last logits and next decode step, then the
// encoder resume's H_E at P-1 and first new position.
std::vector<SpanRow> span_rows(const Plan& p, int64_t N, int64_t P, const Spans& found);
// The verdict of a search: every row's found span is the oracle's.
bool spans_agree(const std::vector<SpanRow>& rows);

}  // namespace ced::prop
