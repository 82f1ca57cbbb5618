// docs/v41.md §13.12: prompts that make ties likely; see stress_prompts.hpp.
#include "models/v41/stress_prompts.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "model/error.hpp"

namespace ced::v41 {

std::vector<V41StressPrompt> v41_stress_prompts(const V41Config& c, const V41Plan& p, int64_t n) {
  if (n < 1) throw InputError(fmt::format("stress prompts: n = {} tokens; want at least 1", n));
  const int64_t V = c.vocab_size;
  // Ids away from 0 (a tokenizer's specials sit low) and distinct for every vocabulary of at least 3.
  const int64_t a = V / 3, b = std::min(V - 1, 2 * V / 3 + 1);
  int64_t ratio = 1;
  for (const LayerPlan& lp : p.layers) ratio = std::max(ratio, lp.ratio);
  auto periodic = [&](int64_t period) {
    std::vector<int64_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (a + (i % period) * 7) % V;
    return t;
  };
  std::vector<int64_t> alternating(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) alternating[static_cast<size_t>(i)] = i % 2 ? b : a;
  return {
      {"one-token", std::vector<int64_t>(static_cast<size_t>(n), a),
       fmt::format("token {} repeated: every Engram n-gram equal, the window's keys equal but for their rotation", a)},
      {"two-alternating", alternating, fmt::format("tokens {} and {} alternating: every second row the same", a, b)},
      {"period-ratio", periodic(ratio),
       fmt::format("a period of {} (the largest compress ratio): every compressed group of that ratio the same tokens",
                   ratio)},
      {"period-window", periodic(p.W), fmt::format("a period of W = {}: the window's content repeats", p.W)},
      {"single", {a}, "a prompt of one token"},
  };
}

}  // namespace ced::v41
