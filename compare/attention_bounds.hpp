#pragma once
// Admissible results of softmax attention over an index list with a sink (docs/sound-bounds.md §12):
// computed from the query, the key-value rows and the list the implementation was given (the official's
// own, op-level forcing), so a selection made differently upstream never reaches this verdict.
#include <cstdint>
#include <span>
#include <vector>

#include "compare/op_bounds.hpp"

namespace ced::bounds {

// o[t, h, :] = Σ_j e^{s_j} kv[j, :] / (Σ_j e^{s_j} + e^{sink[h]}) over the rows j = idxs[t, i] ≥ 0 of
// one query's list (−1: no key), s_j = scale · q[t, h, :]·kv[j, :]. q [N, H, d], kv [rows, d] (each row
// both key and value), sink [H], idxs [N, k]; outputs [N, H, d] rounded to `out_bits`. Any order of the
// dot products and sums, one pass or an online softmax in blocks of `block` keys or more (its running max
// and rescales; the default 1 admits every blocking), probabilities (the sink's included) in fp32 or
// rounded to bf16 before P·V, scale as given or rounded to fp32, exp or exp2 with log2(e) folded in: all
// within the interval. `needed` [N, H] (empty: every one) names the queries and heads to bound; the others'
// outputs are left {0, [0, 0], 0} (a caller that knows them fills them in).
std::vector<BoundedValue> sparse_attention_bounds(std::span<const double> q, int64_t N, int64_t H, int64_t d,
                                                  std::span<const double> kv, std::span<const double> sink,
                                                  std::span<const int32_t> idxs, int64_t k, double scale,
                                                  const BoundModel& model, int out_bits, int64_t block = 1,
                                                  std::span<const uint8_t> needed = {});

}  // namespace ced::bounds
