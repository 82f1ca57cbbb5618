#pragma once
// Ced runs of one prompt that differ only in how the decoder replays: the
// replay-budget study (`ced replay-budget`, docs/spec.md §10) runs a list of
// policies, the span searches (`ced spans --empirical`) probe one replay
// length at a time. On the reference backends they share what does not
// depend on the replay, the encoder and the source-only write (docs/spec.md
// §4.2 steps 1–2), computed once when the session opens; each run continues a
// copy of the engine from there. Any other backend (or a request that is not
// a plain ced prefill: a resume, a run that returns its cache) gets one
// be.run() per request.
#include <functional>
#include <memory>
#include <vector>

#include "model/run.hpp"

namespace ced {

class ReplaySession {
 public:
  virtual ~ReplaySession() = default;
  // What be.run(r) returns, bitwise, FLOP counts and captures included; its
  // prefill_seconds includes the shared part's seconds (each run's, in full,
  // as if it had computed it), decode_seconds is its own. `r` may differ from
  // the opening request only in the replay policy, decode_steps (tokens may be
  // longer; the first n_prompt are the same), poison_truncated and logits:
  // anything else is the caller's bug (std::logic_error). InputError as
  // be.run() for an invalid request.
  virtual RunResult run(const RunRequest& r) = 0;
};

// On a reference backend validates `base` (InputError) and computes the
// shared part. `be` must outlive the session.
std::unique_ptr<ReplaySession> open_replays(Backend& be, const RunRequest& base);

// One result per policy, handed to `each` in the order of `replays` (one
// result alive at a time): each equals be.run() with req.replay set to that
// policy, bitwise (a session opened on `req`).
void run_replays(Backend& be, const RunRequest& req, const std::vector<ReplayPolicy>& replays,
                 const std::function<void(RunResult&&)>& each);

// std::logic_error unless `r` differs from `base` only where a session's runs
// may (above). Used by every session, so a caller's slip fails alike on every
// backend.
void require_same_prefill(const RunRequest& base, const RunRequest& r);

}  // namespace ced
