#pragma once
// The seed of a test binary's random inputs: CED_SEED when set (to replay a failure), else the binary's
// default; printed once, so every log says how to replay it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace ced::test {

inline uint64_t replayable_seed(const char* binary, uint64_t fallback) {
  const char* s = std::getenv("CED_SEED");
  const uint64_t v = s ? std::strtoull(s, nullptr, 10) : fallback;
  std::printf("%s seed %llu (set CED_SEED to replay)\n", binary, static_cast<unsigned long long>(v));
  return v;
}

}  // namespace ced::test
