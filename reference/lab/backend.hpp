#pragma once
// The CPU reference model as a Backend: `reference` (f32) and `reference-f64`.
#include <memory>

#include "models/lab/schedule.hpp"
#include "reference/lab/replays.hpp"

namespace ced {

// f64 = false: backend "reference", dtype f32; true: "reference-f64".
std::unique_ptr<Backend> make_reference_backend(const Config& c, uint64_t weight_seed, bool f64);

// open_replays' session on a reference backend with a plain ced prefill
// (docs/spec.md §4.2 steps 1–2 computed once); nullptr for any other backend
// or request.
std::unique_ptr<ReplaySession> open_reference_replays(Backend& be, const RunRequest& base);

}  // namespace ced
