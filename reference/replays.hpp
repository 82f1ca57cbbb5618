#pragma once
// One ced run per replay policy of the same request (`ced replay-budget`,
// docs/spec.md §10), handed to `each` in the order of `replays` (one result alive
// at a time): each equals be.run() with req.replay set to that policy,
// bitwise. On the reference backends the runs share what does not depend on
// the policy, the encoder and the source-only write (docs/spec.md §4.2 steps 1–2),
// computed once; each result's prefill_seconds then includes that shared
// part. Any other backend (or a request that is not a plain ced prefill)
// gets one run() per policy.
#include <functional>
#include <vector>

#include "model/run.hpp"

namespace ced {

void run_replays(Backend& be, const RunRequest& req, const std::vector<ReplayPolicy>& replays,
                 const std::function<void(RunResult&&)>& each);

}  // namespace ced
