#pragma once
// What the v41 decode and CED tests share: the printed, replayable seed, v41-tiny's random checkpoint of
// that seed (as `ced export` writes it), and a prompt drawn from it.
#include <cstdint>
#include <vector>

#include "models/v41/checkpoint.hpp"
#include "unit-tests/test_seed.hpp"

namespace ced::v41::testing {

inline uint64_t test_seed() {
  static const uint64_t seed = test::replayable_seed("v41 test", 41);
  return seed;
}

inline const V41Checkpoint& tiny_checkpoint() {
  static const V41Checkpoint ck = make_v41_random_checkpoint(v41_builtin_config("v41-tiny"), test_seed());
  return ck;
}

// n ids in [0, vocab) from the seed and a salt (SplitMix64's finaliser over a counter).
inline std::vector<int64_t> prompt(int64_t n, int64_t vocab, uint64_t salt) {
  std::vector<int64_t> t;
  uint64_t x = test_seed() * 0x9E3779B97F4A7C15ull + salt;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
    t.push_back(static_cast<int64_t>(x % static_cast<uint64_t>(vocab)));
  }
  return t;
}

}  // namespace ced::v41::testing
