#pragma once
// The v41 forward's vector kernels (forward_ops.cpp, attention_ops.cpp): a lane of a 64-byte vector
// is one independent output (an output column, a key, a channel), its own accumulator summed in the
// scalar loop's order with one rounding per operation (the build neither fuses nor reassociates:
// -ffp-contract=off, no fast-math). So every output gets exactly the scalar loop's roundings; only
// the order in which outputs are computed changes, never an output's own order of operations.
// Under bf16 the lanes are fp32 and every value an fp32 value, where fp32 arithmetic gives the bits
// of Arith's double-then-round; under f64 they are doubles.
#include <cstdint>

namespace ced::v41::fwd {

template <typename T>
using Vec [[gnu::vector_size(64)]] = T;
template <typename T>
constexpr int64_t kLanes = 64 / sizeof(T);  // loaded and stored with std::memcpy (one unaligned move)

}  // namespace ced::v41::fwd
