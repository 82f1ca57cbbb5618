#pragma once
// The CPU reference model as a Backend: `reference` (f32) and `reference-f64`.
#include <memory>

#include "model/run.hpp"

namespace ced {

// f64 = false: backend "reference", dtype f32; true: "reference-f64".
std::unique_ptr<Backend> make_reference_backend(const Config& c, uint64_t weight_seed, bool f64);

}  // namespace ced
