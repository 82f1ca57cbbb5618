#pragma once
// The v41 forward's vector kernels (forward_ops.cpp, attention_ops.cpp): a lane of a 32-byte vector
// is one independent output (an output column, a key, a channel), its own accumulator summed in the
// scalar loop's order with one rounding per operation (the build neither fuses nor reassociates:
// -ffp-contract=off, no fast-math). So every output gets exactly the scalar loop's roundings; only
// the order in which outputs are computed changes, never an output's own order of operations.
// Under bf16 the lanes are fp32 and every value an fp32 value, where fp32 arithmetic gives the bits
// of Arith's double-then-round; under f64 they are doubles.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "models/v41/numerics.hpp"

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

// The forward holds its values in doubles; a kernel in T reads and writes them a vector at a time.
// T is float exactly when the regime emulates fp32 (every value then an fp32 value, so both
// conversions are exact) and double under f64. (By reference: a vector passed by value outside an
// AVX function changes the ABI.)
template <typename T>
[[gnu::always_inline]] inline void load_lanes(Vec<T>& v, const double* p) {
  if constexpr (std::is_same_v<T, double>) {
    std::memcpy(&v, p, sizeof v);
  } else {
    using Wide [[gnu::vector_size(sizeof(double) * kLanes<T>)]] = double;
    Wide w;
    std::memcpy(&w, p, sizeof w);
    v = __builtin_convertvector(w, Vec<T>);
  }
}
template <typename T>
[[gnu::always_inline]] inline void store_lanes(double* p, const Vec<T>& v) {
  if constexpr (std::is_same_v<T, double>) {
    std::memcpy(p, &v, sizeof v);
  } else {
    using Wide [[gnu::vector_size(sizeof(double) * kLanes<T>)]] = double;
    const Wide w = __builtin_convertvector(v, Wide);
    std::memcpy(p, &w, sizeof w);
  }
}

// Arith::bf in T: round_bf16 on fp32 values (its bit arithmetic, a NaN kept a quiet NaN), nothing
// under f64; bf_lanes in place on a vector.
template <typename T>
[[gnu::always_inline]] inline T bf_of(T x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return round_bf16(x);
}
template <typename T>
[[gnu::always_inline]] inline void bf_lanes(Vec<T>& x) {
  if constexpr (!std::is_same_v<T, double>) {
    using U = Vec<uint32_t>;
    U u;
    std::memcpy(&u, &x, sizeof u);
    const U nan = (U)((u & 0x7FFFFFFFu) > 0x7F800000u);  // all ones where NaN
    const U rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    const U quiet = (u & 0xFFFF0000u) | 0x00400000u;
    u = (rounded & ~nan) | (quiet & nan);
    std::memcpy(&x, &u, sizeof x);
  }
}

// f32_from_e4m3(e4m3_from_f32(x)) on lanes of fp32 values (numerics.cpp), on the bits: a NaN gives
// the quiet NaN of its sign, |x| >= 448 gives ±448, |x| < 2^-6 the nearest multiple of 2^-9 (ties
// to even: adding and taking away 2^23 rounds |x| · 512 to an integer in the default rounding mode),
// and otherwise x's mantissa rounded to 3 bits, ties to even, a carry moving into the exponent.
[[gnu::always_inline]] inline void e4m3_value_lanes(Vec<float>& x) {
  using U = Vec<uint32_t>;
  U u;
  std::memcpy(&u, &x, sizeof u);
  const U sign = u & 0x80000000u, au = u & 0x7FFFFFFFu;
  const U nan = (U)(au > 0x7F800000u), sat = (U)(au >= 0x43E00000u), small = (U)(au < 0x3C800000u);
  Vec<float> a;
  std::memcpy(&a, &au, sizeof a);
  const Vec<float> sub = ((a * 512.0f + 0x1p23f) - 0x1p23f) * 0x1p-9f;
  U sub_bits;
  std::memcpy(&sub_bits, &sub, sizeof sub_bits);
  const U normal = (au + 0x7FFFFu + ((au >> 20) & 1u)) & 0xFFF00000u;
  U v = (normal & ~small) | (sub_bits & small);
  v = (v & ~sat) | (0x43E00000u & sat);
  v = (v & ~nan) | (0x7FC00000u & nan);
  u = v | sign;
  std::memcpy(&x, &u, sizeof x);
}

}  // namespace ced::v41::fwd
