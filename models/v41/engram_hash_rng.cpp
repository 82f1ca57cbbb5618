// docs/v41.md §9.2: the Engram hash multipliers as engram.py derives them, NumPy's
// default_rng(10007 · layer).integers(0, bound, max_ngram_size, int64) · 2 + 1 with
// bound = max(1, (INT64_MAX // compressed_vocab) // 2): NumPy's SeedSequence (its entropy pool of four
// 32-bit words and its hash mixing), PCG64 (the 128-bit LCG with the XSL-RR output) seeded from it,
// and Generator.integers' bounded draw (Lemire's multiply-shift rejection on 64-bit draws).
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "model/error.hpp"
#include "models/v41/run_types.hpp"

namespace ced::v41 {
namespace {

constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  return value ^ (value >> kXShift);
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  return r ^ (r >> kXShift);
}

// SeedSequence(entropy).generate_state(n, uint32): the pool of four words mixed from the entropy's
// 32-bit words (least significant first; 0 is one word 0), then n words drawn from it cyclically.
std::vector<uint32_t> seed_sequence_state(uint64_t entropy, size_t n) {
  std::vector<uint32_t> words;
  do {
    words.push_back(static_cast<uint32_t>(entropy & 0xFFFFFFFFu));
    entropy >>= 32;
  } while (entropy > 0);
  std::array<uint32_t, 4> pool{};
  uint32_t h = kInitA;
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = hashmix(i < words.size() ? words[i] : 0u, h);
  for (size_t s = 0; s < pool.size(); ++s)
    for (size_t d = 0; d < pool.size(); ++d)
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], h));
  for (size_t s = pool.size(); s < words.size(); ++s)
    for (size_t d = 0; d < pool.size(); ++d) pool[d] = mix(pool[d], hashmix(words[s], h));
  std::vector<uint32_t> out(n);
  uint32_t hb = kInitB;
  for (size_t i = 0; i < n; ++i) {
    uint32_t v = pool[i % pool.size()] ^ hb;
    hb *= kMultB;
    v *= hb;
    out[i] = v ^ (v >> kXShift);
  }
  return out;
}

struct Pcg64 {
  using u128 = unsigned __int128;
  static constexpr u128 kMult = (static_cast<u128>(2549297995355413924ULL) << 64) + 4865540595714422341ULL;
  u128 state = 0, inc = 0;

  // default_rng(seed): four 64-bit words from the SeedSequence (pairs of 32-bit words, low first);
  // words 0, 1 the initial state (high, low), 2, 3 the stream; then PCG's setseq seeding.
  explicit Pcg64(uint64_t seed) {
    const auto w32 = seed_sequence_state(seed, 8);
    uint64_t w[4];
    for (int i = 0; i < 4; ++i) w[i] = static_cast<uint64_t>(w32[2 * i]) | (static_cast<uint64_t>(w32[2 * i + 1]) << 32);
    const u128 init_state = (static_cast<u128>(w[0]) << 64) | w[1], init_seq = (static_cast<u128>(w[2]) << 64) | w[3];
    inc = (init_seq << 1) | 1u;
    step();
    state += init_state;
    step();
  }
  void step() { state = state * kMult + inc; }
  uint64_t next() {
    step();
    const uint64_t x = static_cast<uint64_t>(state >> 64) ^ static_cast<uint64_t>(state);
    const unsigned rot = static_cast<unsigned>(state >> 122);
    return (x >> rot) | (x << ((64u - rot) & 63u));
  }
  // Generator.integers(0, rng + 1) for rng above 2^32 - 1: Lemire's bounded draw.
  uint64_t bounded(uint64_t rng) {
    const uint64_t excl = rng + 1;
    u128 m = static_cast<u128>(next()) * excl;
    uint64_t left = static_cast<uint64_t>(m);
    if (left < excl) {
      const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - rng) % excl;
      while (left < threshold) {
        m = static_cast<u128>(next()) * excl;
        left = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

}  // namespace

std::vector<std::vector<int64_t>> v41_engram_multipliers(const V41Config& c) {
  std::vector<std::vector<int64_t>> out;
  if (c.engram_layer_ids.empty()) return out;
  if (c.engram_compressed_vocab_size <= 0)
    throw InputError("v41 engram: engram_compressed_vocab_size must be positive to derive the hash multipliers");
  const int64_t bound = std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / c.engram_compressed_vocab_size) / 2);
  if (static_cast<uint64_t>(bound - 1) <= 0xFFFFFFFFu)
    throw InputError("v41 engram: a multiplier bound below 2^32 takes NumPy's 32-bit draw, which is not ported");
  for (int64_t layer : c.engram_layer_ids) {
    Pcg64 rng(static_cast<uint64_t>(10007 * layer));
    std::vector<int64_t> m;
    for (int64_t s = 0; s < c.engram_max_ngram_size; ++s)
      m.push_back(static_cast<int64_t>(rng.bounded(static_cast<uint64_t>(bound - 1))) * 2 + 1);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace ced::v41
