#pragma once
// The two hashes every family's generated data and every digest start from: SplitMix64's output
// function and 64-bit FNV-1a. Shared so that a seed means the same stream wherever it is read.
#include <cstdint>
#include <string_view>

namespace ced {

inline constexpr uint64_t kSplitmix64Gamma = 0x9E3779B97F4A7C15ULL;

// SplitMix64's output for the state z (one step from z: the state advances by the gamma first).
constexpr uint64_t splitmix64(uint64_t z) {
  z += kSplitmix64Gamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// SplitMix64 as a stream: the next output, the state advanced.
constexpr uint64_t splitmix64_next(uint64_t& state) {
  const uint64_t r = splitmix64(state);
  state += kSplitmix64Gamma;
  return r;
}

constexpr uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (unsigned char b : s) h = (h ^ b) * 0x100000001B3ULL;
  return h;
}

}  // namespace ced
