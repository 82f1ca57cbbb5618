#pragma once
// Prompts that make ties and near-ties likely (docs/v41.md §13.12): random prompts almost never tie, so an
// order-dependent selection (a top-k's tie order, a router's) is exercised only where the prompt repeats
// itself. The property suites and the golden set run these beside the seeded random ones.
#include <cstdint>
#include <string>
#include <vector>

#include "models/v41/config.hpp"
#include "models/v41/plan.hpp"

namespace ced::v41 {

struct V41StressPrompt {
  std::string name;             // "one-token", "two-alternating", "period-ratio", "period-window", "single"
  std::vector<int64_t> tokens;  // n ids (one for "single")
  std::string why;              // what it makes tie
};

// Each of n tokens (n >= 1) of the config's vocabulary: one token repeated (every n-gram equal, the window's
// keys equal but for their rotation), two alternating, a period of the largest compress ratio (every group the
// same tokens), a period of the window, and a prompt of one token.
std::vector<V41StressPrompt> v41_stress_prompts(const V41Config& c, const V41Plan& p, int64_t n);

}  // namespace ced::v41
