#pragma once
// What the v41 commands that run the reference on a seeded checkpoint and prompt share (ced spans,
// cache-hit, replay-budget): the model with its hashing, the prompt, and the error they report.
#include <cstdint>
#include <span>
#include <vector>

#include "models/v41/checkpoint.hpp"
#include "models/v41/forward.hpp"

namespace ced::tools {

struct V41Seeded {
  v41::V41Model model;
  v41::V41EngramHashing hashing;
};
// `ced export`'s random checkpoint of the seed, loaded in the regime, the fault planted, captures off.
V41Seeded v41_seeded_model(const v41::V41Config& c, uint64_t weight_seed, v41::V41Regime regime,
                           v41::V41Fault fault = v41::V41Fault::none);
// The seeded prompt both families draw (make_tokens), as the v41 forward takes it.
std::vector<int64_t> v41_seeded_tokens(uint64_t token_seed, const v41::V41Config& c, int64_t n);
// ‖t − r‖ / ‖r‖ over every element (‖t − r‖ when r is zero); a NaN anywhere makes it NaN.
double rel_l2(std::span<const double> t, std::span<const double> r);

}  // namespace ced::tools
