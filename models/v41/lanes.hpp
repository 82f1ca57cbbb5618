#pragma once
// The v41 forward's vector kernels (forward_ops.cpp, attention_ops.cpp): a lane of a 32-byte vector
// is one independent output (an output column, a key, a channel), its own accumulator summed in the
// scalar loop's order with one rounding per operation (the build neither fuses nor reassociates:
// -ffp-contract=off, no fast-math). So every output gets exactly the scalar loop's roundings; only
// the order in which outputs are computed changes, never an output's own order of operations.
// Under bf16 the lanes are fp32 and every value an fp32 value, where fp32 arithmetic gives the bits
// of Arith's double-then-round; under f64 they are doubles.
#include <cstdint>

namespace ced::v41::fwd {

template <typename T>
using Vec [[gnu::vector_size(32)]] = T;
template <typename T>
constexpr int64_t kLanes = 32 / sizeof(T);  // loaded and stored with std::memcpy (one unaligned move)

// A kernel is compiled for AVX2 and for the x86-64 baseline, the one chosen at load. 32 bytes is
// AVX2's register. Measured on v41-wide N = 256, one thread: 64-byte vectors on AVX-512 were at most
// a fifth faster (release 0.9 s against 1.0, f64 1.1 against 1.3), and the same 64-byte code built
// for AVX2, each vector split over two registers, took 8.3 s.
#define V41_KERNEL [[gnu::target_clones("avx2", "default")]]

}  // namespace ced::v41::fwd
