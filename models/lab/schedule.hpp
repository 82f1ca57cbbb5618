#pragma once
// The lab family's rules of a run (docs/spec.md §4–§6): which positions a run evaluates, what a request
// must satisfy, the attributes of its result, and the check of a persisted
// cache against the config and prefix it is used with. Written once here and
// used by every backend (reference/lab/forward.cpp, optimized/lab/forward.cpp), so the
// backends differ only in how they compute a layer, never in where they start.
#include <cstdint>

#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"
#include "model/run.hpp"

namespace ced {

// A result with the request's attributes filled in (docs/spec.md §9 /runs/<run>
// attrs) and an empty FLOP count per layer; replay_start is the backend's.
RunResult result_for(const Backend& b, const RunRequest& req, const Plan& p);

// The B of a replay policy on a lab plan (ReplayPolicy::n_replay with the plan's window and exact span).
inline int64_t n_replay(const ReplayPolicy& r, const Plan& p, int64_t n_prompt) {
  return r.n_replay(p.W, p.exact_replay(), n_prompt);
}

// Checks a request against the config: validate_request_shape (model/run.hpp), then the tokens against
// the vocabulary; InputError.
void validate_request(const Config& c, const RunRequest& r);

struct RunSchedule {
  // First position the encoder layers evaluate: 0, or for a resume
  // s_r = max(0, P − span) with span = resume_replay (−1: W) (docs/spec.md §6).
  int64_t encoder_start = 0;
  // First position the decoder layers evaluate (the replay start):
  // max(N − B, encoder_start) with B = N in full mode, min(N, n_replay)
  // otherwise (docs/spec.md §4, §6). Full mode: 0.
  int64_t replay_start = 0;
  // First position whose global entries the run writes: P for a resume (the
  // cache holds those below), 0 otherwise (docs/spec.md §6).
  int64_t resume_start = 0;
  // First position with prompt logits: N − 1 for LogitsScope::Last, the
  // replay start otherwise.
  int64_t first_logit = 0;
};

// The schedule of a validated request; n_replay is the B of its replay
// policy (RunResult::n_replay). The resume-replay-short fault (a negative
// control) shortens the default span to W − 1.
RunSchedule run_schedule(const Plan& plan, const RunRequest& req, int64_t n_replay);

// A persisted cache used with prefix P must be the one of this config and
// prefix: its prefix length, one source per kv source (layer, ratio, tokens)
// and the shapes of its entries, index keys and pending rows. InputError
// naming the first mismatch otherwise.
void check_cache(const Config& c, const Plan& plan, const PersistedCache& cache, int64_t P);

}  // namespace ced
