#pragma once
// docs/spec.md §8.2: the arithmetic of one logits row, shared by the logits metrics
// (compare.cpp) and the generation-level verdicts (generation.cpp), so that both
// rank and measure a row the same way.
#include <cstdint>
#include <span>
#include <vector>

namespace ced {

// Top-k ranking of docs/spec.md §3.4's rule: higher first, ties -> larger index first,
// NaN last (larger index first among NaNs).
bool ranks_before(double a, int64_t ia, double b, int64_t ib);
// The k indices that rank first, in rank order (k <= row.size()).
std::vector<int64_t> top_indices(std::span<const double> row, int64_t k);
// The 1-based rank of `index` in its row under ranks_before: 1 + the entries that rank before it.
int64_t rank_in_row(std::span<const double> row, int64_t index);

// log-sum-exp of a row of finite or -Inf values; -Inf if all are -Inf.
double log_sum_exp(std::span<const double> x);
// KL(softmax r || softmax t) of one row, clamped at 0; +Inf where undefined
// (a NaN or +Inf in either row, every logit -Inf, or t -Inf where p_r > 0).
double row_kl(std::span<const double> t, std::span<const double> r);

}  // namespace ced
