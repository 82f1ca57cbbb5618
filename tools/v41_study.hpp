#pragma once
// What the v41 commands that run the reference on a seeded checkpoint and prompt share (ced spans,
// cache-hit, replay-budget): the model with its hashing, the prompt, and the error they report.
#include <cstdint>
#include <span>
#include <vector>

#include "models/v41/plan.hpp"

#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward.hpp"

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
// The middle value (the mean of the two middle ones for an even count); NaN for none.
double median(std::vector<double> v);
// A result's last logits row [vocab].
std::span<const double> last_logits(const v41::V41ForwardResult& r, int64_t vocab);
// The oracle's FLOP ratio (docs/v41.md §14) of a ced prefill of N rows replaying K under the convention,
// over the full prefill's.
double ced_flop_ratio(const v41::V41Config& c, const v41::V41Plan& p, const v41::V41ReplayConvention& conv,
                      int64_t N, int64_t K);

}  // namespace ced::tools
