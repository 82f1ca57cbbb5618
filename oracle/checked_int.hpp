#pragma once
// Checked int64 arithmetic for the FLOP models (oracle/analytic_flops.cpp, oracle/v41_flops.cpp): a
// count that leaves int64 is an error (std::overflow_error, which the commands turn into an
// InputError naming the length), not a wrapped number.
#include <cstdint>
#include <stdexcept>

namespace ced::checked {

inline int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw std::overflow_error("flop model: int64 overflow");
  return r;
}
inline int64_t add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw std::overflow_error("flop model: int64 overflow");
  return r;
}

}  // namespace ced::checked
