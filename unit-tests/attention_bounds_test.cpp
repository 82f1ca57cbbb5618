// Softmax attention with a sink, bounded (docs/sound-bounds.md §12): every legitimate way of computing it
// (one pass or online in blocks, probabilities in fp32 or bf16, exp or exp2 with log2(e) folded in, sums in
// any order) lies inside, and a planted slip (the sink left out, a key dropped, a wrong scale) does not.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "compare/attention_bounds.hpp"
#include "model/error.hpp"
#include "legit_orders.hpp"

namespace {

using namespace ced::bounds;
using ced::testing::bf16;
using ced::testing::random_bf16;

struct Case {
  int64_t N = 3, H = 2, d = 64, k = 0, rows = 0;
  std::vector<double> q, kv, sink;
  std::vector<int32_t> idx;
  double scale = 0;
};

// A case whose scores spread over about ±8 (so a few keys dominate and many underflow far below), with
// some list entries −1 and some keys listed twice.
Case make_case(int64_t d, int64_t k, unsigned seed, double spread = 1) {
  std::mt19937 g(seed);
  Case c;
  c.d = d, c.k = k, c.rows = k + 7;
  c.q = random_bf16(static_cast<size_t>(c.N * c.H * d), g, spread * 2 / std::sqrt(static_cast<double>(d)));
  c.kv = random_bf16(static_cast<size_t>(c.rows * d), g, 1);
  c.sink = {-0.5, 2.0};
  c.idx.resize(static_cast<size_t>(c.N * k));
  for (auto& i : c.idx) i = g() % 9 == 0 ? -1 : static_cast<int32_t>(g() % static_cast<unsigned>(c.rows));
  c.scale = 1 / std::sqrt(static_cast<double>(d));
  return c;
}

struct Way {
  int64_t block = 0;            // 0: one pass (max first); else online softmax in blocks of this many keys
  bool bf16_p = true;           // probabilities rounded to bf16 before P·V
  bool bf16_den = false;        // ... and in the denominator too
  bool exp2 = false;            // exp2 of the score times scale·log2(e), folded in fp32
  bool reversed = false;        // every sum backwards
  bool drop_sink = false, drop_key = false;  // planted slips
  double scale_by = 1;          // a planted wrong scale
};

// One legitimate (or planted) implementation in fp32.
std::vector<double> attend(const Case& c, const Way& w) {
  std::vector<double> out(static_cast<size_t>(c.N * c.H * c.d));
  const float sc = static_cast<float>(c.scale * w.scale_by), l2e = 1.4426950408889634f;
  auto ex = [&](float x) { return w.exp2 ? std::exp2(x * l2e) : std::exp(x); };
  for (int64_t t = 0; t < c.N; ++t)
    for (int64_t h = 0; h < c.H; ++h) {
      std::vector<int32_t> keys;
      for (int64_t i = 0; i < c.k; ++i)
        if (int32_t j = c.idx[static_cast<size_t>(t * c.k + i)]; j >= 0) keys.push_back(j);
      if (w.drop_key && !keys.empty()) keys.erase(keys.begin() + static_cast<long>(keys.size() / 2));
      if (w.reversed) std::reverse(keys.begin(), keys.end());
      std::vector<float> s(keys.size());
      for (size_t j = 0; j < keys.size(); ++j) {
        std::vector<float> p(static_cast<size_t>(c.d));
        for (int64_t x = 0; x < c.d; ++x)
          p[static_cast<size_t>(x)] = static_cast<float>(c.q[static_cast<size_t>((t * c.H + h) * c.d + x)]) *
                                      static_cast<float>(c.kv[static_cast<size_t>(keys[j] * c.d + x)]);
        s[j] = (w.reversed ? ced::testing::reversed(p) : ced::testing::pairwise(p)) * sc;
      }
      const int64_t blk = w.block ? w.block : std::max<int64_t>(1, static_cast<int64_t>(keys.size()));
      float m = -1e30f, den = 0;
      std::vector<float> acc(static_cast<size_t>(c.d), 0.0f);
      for (size_t b = 0; b < keys.size(); b += static_cast<size_t>(blk)) {
        const size_t e = std::min(keys.size(), b + static_cast<size_t>(blk));
        float bm = m;
        for (size_t j = b; j < e; ++j) bm = std::max(bm, s[j]);
        const float r = ex(m - bm);
        m = bm;
        float psum = 0;
        for (float& a : acc) a *= r;
        for (size_t j = b; j < e; ++j) {
          const float p = ex(s[j] - m), pv = w.bf16_p ? bf16(p) : p;
          psum += w.bf16_den ? pv : p;
          for (int64_t x = 0; x < c.d; ++x)
            acc[static_cast<size_t>(x)] += pv * static_cast<float>(c.kv[static_cast<size_t>(keys[j] * c.d + x)]);
        }
        den = den * r + psum;
      }
      if (!w.drop_sink) den += ex(static_cast<float>(c.sink[static_cast<size_t>(h)]) - m);
      for (int64_t x = 0; x < c.d; ++x)
        out[static_cast<size_t>((t * c.H + h) * c.d + x)] = keys.empty() ? 0.0 : acc[static_cast<size_t>(x)] / den;
    }
  return out;
}

std::vector<BoundedValue> bounds_of(const Case& c, int out_bits, const BoundModel& m = {}) {
  return sparse_attention_bounds(c.q, c.N, c.H, c.d, c.kv, c.sink, c.idx, c.k, c.scale, m, out_bits);
}

// The widest interval in bf16 steps of max(|value|, its row's RMS), rows of n.
double widest_in_row_steps(const std::vector<BoundedValue>& b, int64_t n) {
  double widest = 0;
  for (size_t r = 0; r < b.size(); r += static_cast<size_t>(n)) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += b[r + static_cast<size_t>(i)].value * b[r + static_cast<size_t>(i)].value;
    const double rms = std::sqrt(ss / static_cast<double>(n));
    for (int64_t i = 0; i < n; ++i) {
      const BoundedValue& v = b[r + static_cast<size_t>(i)];
      const double step = std::ldexp(1.0, std::ilogb(std::max({std::fabs(v.value), rms, 0x1p-100})) - 7);
      widest = std::max(widest, (v.admissible.hi - v.admissible.lo) / step);
    }
  }
  return widest;
}

std::vector<double> to_bf16(std::vector<double> v) {
  for (double& x : v) x = bf16(static_cast<float>(x));
  return v;
}

TEST(AttentionBounds, EveryLegitimateWayAtTheReleasesWidthsAndListLengthsIsAdmissibleInFp32AndAfterTheCast) {
  const std::vector<Way> ways = {{64, true}, {0, false}, {16, true, true}, {64, true, false, true},
                                 {1, false, false, false, true}, {128, true, true, true, true}};
  for (int64_t d : {64, 512})
    for (int64_t k : {1, 63, 64, 65, 192})
      for (unsigned seed : {1u, 2u}) {
        const Case c = make_case(d, k, seed * 100 + static_cast<unsigned>(k));
        const auto b32 = bounds_of(c, 24), b16 = bounds_of(c, 8);
        for (size_t i = 0; i < ways.size(); ++i) {
          const auto y = attend(c, ways[i]);
          EXPECT_EQ(judge_within(y, b32).outside, 0) << "way " << i << " d " << d << " k " << k << " seed " << seed;
          const BoundJudgement j = judge_within(to_bf16(y), b16);
          EXPECT_EQ(j.outside, 0) << "way " << i << " d " << d << " k " << k;
          // Not vacuous: an output admits at most sixteen bf16 steps of its row's scale (the larger of its own
          // magnitude and its row's RMS, as the gate counts ulps), though a cancelling numerator admits more
          // than its own magnitude's (each probability's bf16 rounding may go either way,
          // docs/sound-bounds.md §12.2).
          EXPECT_LE(widest_in_row_steps(b16, c.d), 16) << "d " << d << " k " << k;  // the budget it replaced: 16
        }
      }
}

TEST(AttentionBounds, TheSinkLeftOutAKeyDroppedOrTheScaleOffByOnePercentFailAtTheirRows) {
  for (int64_t k : {64, 192}) {
    const Case c = make_case(512, k, 7);
    const auto b16 = bounds_of(c, 8);
    Way sinkless, dropped, scaled;
    sinkless.block = dropped.block = scaled.block = 64;
    sinkless.drop_sink = true;
    dropped.drop_key = true;
    scaled.scale_by = 1.01;
    EXPECT_GT(judge_within(to_bf16(attend(c, sinkless)), b16).outside, 0) << "k " << k;
    EXPECT_GT(judge_within(to_bf16(attend(c, dropped)), b16).outside, 0) << "k " << k;
    EXPECT_GT(judge_within(to_bf16(attend(c, scaled)), b16).outside, 0) << "k " << k;
  }
}

TEST(AttentionBounds, AQueryWithNoKeyAdmitsZeroAloneAndBadShapesAreRefused) {
  Case c = make_case(64, 4, 3);
  for (int64_t i = 0; i < c.k; ++i) c.idx[static_cast<size_t>(i)] = -1;  // row 0: no key
  const auto b = bounds_of(c, 8);
  for (int64_t x = 0; x < c.H * c.d; ++x) {
    EXPECT_EQ(b[static_cast<size_t>(x)].admissible.lo, 0);
    EXPECT_EQ(b[static_cast<size_t>(x)].admissible.hi, 0);
  }
  Case bad = c;
  bad.idx[0] = static_cast<int32_t>(bad.rows);
  EXPECT_THROW(bounds_of(bad, 8), ced::InputError);
  bad = c;
  bad.sink.pop_back();
  EXPECT_THROW(bounds_of(bad, 8), ced::InputError);
}

}  // namespace
