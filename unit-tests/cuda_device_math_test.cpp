// Host tests of optimized/lab/device_math.cuh: the per-element maths and the
// serial selection routines the CUDA kernels run, compiled here by the host
// compiler. Brute-force references use std::sort with the spec's order.
// Random cases print their seed; CED_TEST_SEED replays one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "optimized/lab/device_math.cuh"

namespace {

using namespace ced::cuda;

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("CED_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : 20240611ULL;
    std::printf("CED_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// Scores drawn from a few values so that ties (and −0 against +0) are common.
std::vector<float> tie_heavy_scores(std::mt19937_64& rng, int64_t n) {
  static const float values[] = {-1.0f, -0.0f, 0.0f, 0.0f, 0.5f, 0.5f, 1.0f, 2.0f};
  std::uniform_int_distribution<int> pick(0, 7);
  std::vector<float> s(static_cast<size_t>(n));
  for (auto& v : s) v = values[pick(rng)];
  return s;
}

// docs/spec.md §3.4 brute force: sort candidate ids by (score desc, id desc), keep k, pad −1.
std::vector<int32_t> brute_topk(const std::vector<float>& scores, const std::vector<int64_t>& eligible, int64_t k) {
  std::vector<int64_t> ids = eligible;
  std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
    const float sa = scores[size_t(a)], sb = scores[size_t(b)];
    if (sa != sb) return sa > sb;
    return a > b;
  });
  std::vector<int32_t> out(static_cast<size_t>(k), -1);
  for (int64_t i = 0; i < k && i < static_cast<int64_t>(ids.size()); ++i) out[size_t(i)] = int32_t(ids[size_t(i)]);
  return out;
}

// docs/spec.md §3.4 candidate pool by brute force: the pinned block first, then the others by (max score desc, id desc).
std::vector<int32_t> brute_pool(const std::vector<float>& scores, int64_t n_vis, int64_t bs, int64_t ctb) {
  std::vector<int32_t> out(static_cast<size_t>(ctb), -1);
  if (n_vis == 0) return out;
  const int64_t nb = (n_vis + bs - 1) / bs, pinned = (n_vis - 1) / bs;
  std::vector<float> bscore(static_cast<size_t>(nb), -INFINITY);
  for (int64_t j = 0; j < n_vis; ++j) bscore[size_t(j / bs)] = std::max(bscore[size_t(j / bs)], scores[size_t(j)]);
  std::vector<int64_t> others;
  for (int64_t b = 0; b < nb; ++b)
    if (b != pinned) others.push_back(b);
  const auto ranked = brute_topk(bscore, others, ctb - 1);
  out[0] = int32_t(pinned);
  for (int64_t i = 0; i + 1 < ctb; ++i) out[size_t(i + 1)] = ranked[size_t(i)];
  return out;
}

// ---- top-k order -----------------------------------------------------------

TEST(CudaDeviceMath, TopkPredicateOrdersHigherScoreFirst) {
  EXPECT_TRUE(topk_before(2.0f, 0, 1.0f, 5));
  EXPECT_FALSE(topk_before(1.0f, 5, 2.0f, 0));
}

TEST(CudaDeviceMath, TopkPredicateOrdersEqualScoresByLargerIdFirst) {
  EXPECT_TRUE(topk_before(1.0f, 7, 1.0f, 3));
  EXPECT_FALSE(topk_before(1.0f, 3, 1.0f, 7));
}

TEST(CudaDeviceMath, NegativeZeroTiesWithPositiveZero) {
  // −0 = +0: the larger id ranks first whichever zero it carries.
  EXPECT_TRUE(topk_before(-0.0f, 9, 0.0f, 2));
  EXPECT_FALSE(topk_before(0.0f, 2, -0.0f, 9));
  EXPECT_TRUE(topk_before(0.0f, 9, -0.0f, 2));
  EXPECT_FALSE(topk_before(-0.0f, 2, 0.0f, 9));
}

TEST(CudaDeviceMath, TopkPredicateIsIrreflexive) {
  EXPECT_FALSE(topk_before(0.5f, 4, 0.5f, 4));
  EXPECT_FALSE(topk_before(-0.0f, 4, 0.0f, 4));
}

TEST(CudaDeviceMath, NaNScoresRankBelowEveryNumber) {
  EXPECT_TRUE(topk_before(-1e30f, 0, NAN, 5));
  EXPECT_FALSE(topk_before(NAN, 5, -1e30f, 0));
  EXPECT_TRUE(topk_before(NAN, 5, NAN, 2));  // NaNs tie: larger id first
  EXPECT_TRUE(route_before(-1e30f, 3, NAN, 0));
  const std::vector<float> scores = {NAN, 1.0f, NAN, -2.0f};
  std::vector<int32_t> got(4);
  select_topk_query(scores.data(), 4, nullptr, 1, 1, 4, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{1, 3, 2, 0}));
  // A NaN never becomes a block's score while the block has a number.
  std::vector<float> bscores(2);
  std::vector<int32_t> pool(2);
  candidate_pool_query(scores.data(), 4, 2, 2, bscores.data(), pool.data());
  EXPECT_EQ(bscores[0], 1.0f);
  EXPECT_EQ(bscores[1], -2.0f);
}

TEST(CudaDeviceMath, ReluZeroesNegativeAndNaNDots) {
  EXPECT_EQ(relu(-3.0f), 0.0f);
  EXPECT_EQ(relu(2.5f), 2.5f);
  EXPECT_EQ(relu(NAN), 0.0f);
}

// ---- selection -------------------------------------------------------------

TEST(CudaDeviceMath, SelectTopkMatchesSortedOrderUnderTies) {
  std::mt19937_64 rng(test_seed());
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n_vis = std::uniform_int_distribution<int64_t>(0, 40)(rng);
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 45)(rng);
    // Entries beyond n_vis exist in the score row but are not visible.
    const auto scores = tie_heavy_scores(rng, n_vis + 5);
    std::vector<int64_t> eligible(static_cast<size_t>(n_vis));
    std::iota(eligible.begin(), eligible.end(), 0);
    std::vector<int32_t> got(static_cast<size_t>(k), 123);
    select_topk_query(scores.data(), n_vis, nullptr, 1, 1, k, got.data());
    ASSERT_EQ(got, brute_topk(scores, eligible, k)) << "trial " << trial << " n_vis " << n_vis << " k " << k;
  }
}

TEST(CudaDeviceMath, SelectTopkInsidePoolTakesOnlyVisibleEntriesOfPoolBlocks) {
  std::mt19937_64 rng(test_seed() + 1);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t bs = std::uniform_int_distribution<int64_t>(1, 5)(rng);
    const int64_t ctb = std::uniform_int_distribution<int64_t>(1, 6)(rng);
    const int64_t n_vis = std::uniform_int_distribution<int64_t>(0, 30)(rng);
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 12)(rng);
    const auto scores = tie_heavy_scores(rng, n_vis + bs);
    const auto pool = brute_pool(scores, n_vis, bs, ctb);
    std::vector<int64_t> eligible;
    for (int32_t b : pool)
      if (b >= 0)
        for (int64_t j = int64_t(b) * bs; j < (int64_t(b) + 1) * bs && j < n_vis; ++j) eligible.push_back(j);
    std::vector<int32_t> got(static_cast<size_t>(k), 123);
    select_topk_query(scores.data(), n_vis, pool.data(), bs, ctb, k, got.data());
    ASSERT_EQ(got, brute_topk(scores, eligible, k)) << "trial " << trial;
  }
}

// docs/spec.md §9.1: with out_scores the selection is unchanged, each chosen
// entry's score is its own (bitwise), −1 slots are NaN, and slot k holds the
// score of the (k+1)-th entry in rank order (NaN when there is none).
TEST(CudaDeviceMath, SelectTopkScoresAreTheChosenOnesThenTheBestLeftOut) {
  std::mt19937_64 rng(test_seed() + 2);
  for (int trial = 0; trial < 300; ++trial) {
    const bool pooled = trial % 2 == 1;
    const int64_t bs = pooled ? std::uniform_int_distribution<int64_t>(1, 5)(rng) : 1;
    const int64_t ctb = pooled ? std::uniform_int_distribution<int64_t>(1, 6)(rng) : 1;
    const int64_t n_vis = std::uniform_int_distribution<int64_t>(0, 30)(rng);
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 12)(rng);
    const auto scores = tie_heavy_scores(rng, n_vis + bs);
    std::vector<int64_t> eligible;
    std::vector<int32_t> pool;
    if (pooled) {
      pool = brute_pool(scores, n_vis, bs, ctb);
      for (int32_t b : pool)
        if (b >= 0)
          for (int64_t j = int64_t(b) * bs; j < (int64_t(b) + 1) * bs && j < n_vis; ++j) eligible.push_back(j);
    } else {
      for (int64_t j = 0; j < n_vis; ++j) eligible.push_back(j);
    }
    std::vector<int32_t> plain(size_t(k), 123), got(size_t(k), 123);
    std::vector<float> sc(size_t(k + 1), 7.0f);
    const int32_t* p = pooled ? pool.data() : nullptr;
    select_topk_query(scores.data(), n_vis, p, bs, ctb, k, plain.data());
    select_topk_query(scores.data(), n_vis, p, bs, ctb, k, got.data(), sc.data());
    ASSERT_EQ(got, plain) << "trial " << trial;
    const auto order = brute_topk(scores, eligible, k + 1);  // k + 1 slots, −1 padded
    for (int64_t t = 0; t < k; ++t) {
      if (got[size_t(t)] < 0) {
        EXPECT_TRUE(std::isnan(sc[size_t(t)])) << "trial " << trial << " slot " << t;
      } else {
        const float want = scores[size_t(got[size_t(t)])];
        EXPECT_EQ(std::memcmp(&sc[size_t(t)], &want, sizeof(float)), 0) << "trial " << trial << " slot " << t;
      }
    }
    if (order[size_t(k)] < 0) {
      EXPECT_TRUE(std::isnan(sc[size_t(k)])) << "trial " << trial;
    } else {
      const float want = scores[size_t(order[size_t(k)])];
      EXPECT_EQ(std::memcmp(&sc[size_t(k)], &want, sizeof(float)), 0) << "trial " << trial;
    }
  }
}

TEST(CudaDeviceMath, SelectTopkPadsWithMinusOneWhenFewerEligible) {
  const std::vector<float> scores = {0.0f, 1.0f};
  std::vector<int32_t> got(4, 123);
  select_topk_query(scores.data(), 2, nullptr, 1, 1, 4, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{1, 0, -1, -1}));
  select_topk_query(scores.data(), 0, nullptr, 1, 1, 4, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{-1, -1, -1, -1}));
}

TEST(CudaDeviceMath, SelectTopkBreaksZeroTiesTowardLargerIds) {
  // ReLU makes exact zeros common: all-zero scores (of either sign) select the newest entries.
  const std::vector<float> scores = {0.0f, -0.0f, 0.0f, -0.0f, 0.0f};
  std::vector<int32_t> got(3);
  select_topk_query(scores.data(), 5, nullptr, 1, 1, 3, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{4, 3, 2}));
}

// ---- candidate pool ----------------------------------------------------------

TEST(CudaDeviceMath, CandidatePoolPinsTheNewestBlockFirstEvenWhenItScoresLowest) {
  // 7 visible entries in blocks of 2: blocks 0..3, block 3 holds entry 6 only.
  const std::vector<float> scores = {5, 1, 4, 4, 3, 0, -9, 100};  // entry 7 is not visible
  std::vector<float> bscores(4);
  std::vector<int32_t> pool(3);
  candidate_pool_query(scores.data(), 7, 2, 3, bscores.data(), pool.data());
  EXPECT_EQ(pool, (std::vector<int32_t>{3, 0, 1}));
  EXPECT_EQ(bscores, (std::vector<float>{5, 4, 3, -9}));
}

TEST(CudaDeviceMath, CandidatePoolMatchesBruteForceUnderTies) {
  std::mt19937_64 rng(test_seed() + 2);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t bs = std::uniform_int_distribution<int64_t>(1, 5)(rng);
    const int64_t ctb = std::uniform_int_distribution<int64_t>(1, 8)(rng);
    const int64_t n_vis = std::uniform_int_distribution<int64_t>(0, 40)(rng);
    const auto scores = tie_heavy_scores(rng, n_vis + bs);
    std::vector<float> bscores(static_cast<size_t>(pool_n_blocks(n_vis, bs) + 1));
    std::vector<int32_t> got(static_cast<size_t>(ctb), 123);
    candidate_pool_query(scores.data(), n_vis, bs, ctb, bscores.data(), got.data());
    ASSERT_EQ(got, brute_pool(scores, n_vis, bs, ctb)) << "trial " << trial;
  }
}

TEST(CudaDeviceMath, CandidatePoolIsEmptyWithoutVisibleEntries) {
  std::vector<float> scores = {1.0f}, bscores(1);
  std::vector<int32_t> pool(3, 123);
  candidate_pool_query(scores.data(), 0, 2, 3, bscores.data(), pool.data());
  EXPECT_EQ(pool, (std::vector<int32_t>{-1, -1, -1}));
}

TEST(CudaDeviceMath, PoolPinnedBlockHoldsTheNewestVisibleEntry) {
  EXPECT_EQ(pool_pinned_block(0, 8), -1);
  EXPECT_EQ(pool_pinned_block(1, 8), 0);
  EXPECT_EQ(pool_pinned_block(8, 8), 0);
  EXPECT_EQ(pool_pinned_block(9, 8), 1);
}

TEST(CudaDeviceMath, PoolSizeIsCappedByTopkBlocks) {
  EXPECT_EQ(pool_n_blocks(17, 8), 3);
  EXPECT_EQ(pool_size(17, 8, 2), 2);
  EXPECT_EQ(pool_size(17, 8, 16), 3);
  EXPECT_EQ(pool_size(0, 8, 16), 0);
  EXPECT_EQ(pool_block_of(15, 8), 1);
}

// ---- visibility and windows --------------------------------------------------

TEST(CudaDeviceMath, EntryBecomesVisibleOnceItsBlockIsComplete) {
  EXPECT_FALSE(entry_visible(0, 2, 0));
  EXPECT_TRUE(entry_visible(0, 2, 1));
  EXPECT_FALSE(entry_visible(1, 2, 2));
  EXPECT_TRUE(entry_visible(1, 2, 3));
  EXPECT_TRUE(entry_visible(5, 1, 5));
  EXPECT_FALSE(entry_visible(6, 1, 5));
}

TEST(CudaDeviceMath, NVisibleCountsExactlyTheVisibleEntries) {
  for (int64_t r = 1; r <= 4; ++r)
    for (int64_t p = 0; p < 40; ++p) {
      int64_t count = 0;
      for (int64_t j = 0; j < 40; ++j) count += entry_visible(j, r, p) ? 1 : 0;
      ASSERT_EQ(n_visible(p, r), count) << "r " << r << " p " << p;
      ASSERT_EQ(n_complete_entries(p + 1, r), count);
    }
}

TEST(CudaDeviceMath, WindowHoldsWPositionsIncludingTheQuery) {
  const int64_t W = 4;
  for (int64_t p = 0; p < 20; ++p) {
    const int64_t lo = window_lo(0, p, W);
    EXPECT_EQ(p - lo + 1, std::min<int64_t>(p + 1, W)) << "p " << p;
  }
}

TEST(CudaDeviceMath, WindowNeverStartsBeforeTheFirstEvaluatedPosition) {
  EXPECT_EQ(window_lo(10, 11, 4), 10);  // truncated: max(s, p − W + 1)
  EXPECT_EQ(window_lo(10, 13, 4), 10);
  EXPECT_EQ(window_lo(10, 14, 4), 11);
}

// ---- RoPE ----------------------------------------------------------------------

TEST(CudaDeviceMath, RopeAngleFollowsSpecFormula) {
  EXPECT_EQ(rope_angle(0, 3, 8, 10000.0), 0.0);
  EXPECT_DOUBLE_EQ(rope_angle(3, 1, 8, 10000.0), 3.0 * std::pow(10000.0, -2.0 / 8.0));
  EXPECT_DOUBLE_EQ(rope_angle(7, 0, 8, 10000.0), 7.0);
}

TEST(CudaDeviceMath, RopeRotatesAdjacentPairByTheta) {
  const double th = 0.7;
  float a = 2.0f, b = -1.0f;
  rope_rotate_pair(a, b, float(std::cos(th)), float(std::sin(th)));
  EXPECT_NEAR(a, 2.0 * std::cos(th) + 1.0 * std::sin(th), 1e-6);
  EXPECT_NEAR(b, 2.0 * std::sin(th) - 1.0 * std::cos(th), 1e-6);
}

TEST(CudaDeviceMath, InverseRopeUndoesRope) {
  const double th = 2.3;
  const float c = float(std::cos(th)), s = float(std::sin(th));
  float a = 0.25f, b = 3.0f;
  rope_rotate_pair(a, b, c, s);
  rope_unrotate_pair(a, b, c, s);
  EXPECT_NEAR(a, 0.25f, 1e-6);
  EXPECT_NEAR(b, 3.0f, 1e-6);
}

TEST(CudaDeviceMath, RopeRotatesTheLastRopeDims) { EXPECT_EQ(rope_offset(16, 8), 8); }

// ---- routing -------------------------------------------------------------------

TEST(CudaDeviceMath, RouterScoreIsSqrtOfSoftplus) {
  for (double step = -30.0; step <= 30.0; step += 0.37) {
    const float x = static_cast<float>(step);
    const double want = std::sqrt(std::log1p(std::exp(static_cast<double>(x))));
    // A few float roundings (expf, log1pf, sqrtf): 1e-6 relative.
    EXPECT_NEAR(router_score(x), want, 1e-6 * want) << "x " << x;
  }
}

TEST(CudaDeviceMath, SoftplusDoesNotOverflowForLargeLogits) {
  EXPECT_EQ(softplus(200.0f), 200.0f);
  EXPECT_GT(softplus(-50.0f), 0.0f);
}

TEST(CudaDeviceMath, RouteSelectPicksLargestScorePlusBias) {
  const std::vector<float> s = {1.0f, 2.0f, 3.0f, 0.5f}, bias = {0.0f, 0.0f, -2.5f, 3.0f};
  std::vector<int32_t> chosen(2);
  std::vector<float> w(2);
  route_select(s.data(), bias.data(), 4, 2, 1.5f, chosen.data(), w.data());
  EXPECT_EQ(chosen, (std::vector<int32_t>{3, 1}));  // 3.5, 2.0 (expert 2: 0.5)
  EXPECT_FLOAT_EQ(w[0], 0.5f / 2.5f * 1.5f);
  EXPECT_FLOAT_EQ(w[1], 2.0f / 2.5f * 1.5f);
}

TEST(CudaDeviceMath, RouteTiesGoToTheLowerExpert) {
  const std::vector<float> s = {1.0f, 1.0f, 1.0f, 1.0f}, bias = {0.0f, 0.0f, 0.0f, 0.0f};
  std::vector<int32_t> chosen(3);
  std::vector<float> w(3);
  route_select(s.data(), bias.data(), 4, 3, 1.0f, chosen.data(), w.data());
  EXPECT_EQ(chosen, (std::vector<int32_t>{0, 1, 2}));
}

TEST(CudaDeviceMath, RouteWeightsSumToTheScalingFactor) {
  std::mt19937_64 rng(test_seed() + 3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> s(8), bias(8);
    for (int e = 0; e < 8; ++e) {
      s[size_t(e)] = router_score(g(rng));
      bias[size_t(e)] = 0.1f * g(rng);
    }
    std::vector<int32_t> chosen(3);
    std::vector<float> w(3);
    route_select(s.data(), bias.data(), 8, 3, 1.5f, chosen.data(), w.data());
    EXPECT_NEAR(w[0] + w[1] + w[2], 1.5f, 1e-5f);
    std::vector<int32_t> sorted = chosen;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) << "distinct experts";
  }
}

TEST(CudaDeviceMath, SiluMatchesDefinition) {
  for (double x = -10.0; x <= 10.0; x += 0.5)
    EXPECT_NEAR(silu(float(x)), x / (1.0 + std::exp(-x)), 1e-5) << "x " << x;
}

// ---- compressor, index score, attention softmax -------------------------------------

TEST(CudaDeviceMath, CompressChannelIsSoftmaxWeightedSum) {
  // Two tokens, rows 3 floats apart (one channel of a [t, 3] matrix).
  const std::vector<float> c = {1.0f, 0, 0, 5.0f, 0, 0}, z = {0.0f, 0, 0, std::log(3.0f), 0, 0};
  EXPECT_NEAR(compress_channel(c.data(), z.data(), 3, 2), 0.25 * 1.0 + 0.75 * 5.0, 1e-6);
}

TEST(CudaDeviceMath, CompressChannelWithEqualGatesIsTheMean) {
  const std::vector<float> c = {1.0f, 2.0f, 6.0f}, z = {0.3f, 0.3f, 0.3f};
  EXPECT_NEAR(compress_channel(c.data(), z.data(), 1, 3), 3.0, 1e-6);
}

TEST(CudaDeviceMath, IndexScoreIsWeightedReluOfDots) {
  // 2 heads of dim 2: dots (1·1 + 2·1 = 3) and (−1·1 + 0 = −1 → ReLU 0).
  const std::vector<float> iq = {1.0f, 2.0f, -1.0f, 0.0f}, w = {0.5f, 4.0f}, key = {1.0f, 1.0f};
  EXPECT_FLOAT_EQ(index_score(iq.data(), w.data(), key.data(), 2, 2), 1.5f);
}

TEST(CudaDeviceMath, SinkJoinsTheDenominatorWithoutAValue) {
  std::vector<float> logits = {1.0f, 2.0f, 0.5f};
  const float sink = 1.5f;
  softmax_with_sink(logits.data(), 3, sink);
  const double den = std::exp(1.0) + std::exp(2.0) + std::exp(0.5) + std::exp(1.5);
  EXPECT_NEAR(logits[0], std::exp(1.0) / den, 1e-6);
  EXPECT_NEAR(logits[1], std::exp(2.0) / den, 1e-6);
  EXPECT_NEAR(logits[0] + logits[1] + logits[2], 1.0 - std::exp(1.5) / den, 1e-6);
}

TEST(CudaDeviceMath, SinkSoftmaxIsStableForLargeLogits) {
  std::vector<float> logits = {1000.0f, 1000.0f};
  softmax_with_sink(logits.data(), 2, -1000.0f);
  EXPECT_NEAR(logits[0], 0.5f, 1e-6);
  EXPECT_NEAR(logits[1], 0.5f, 1e-6);
}

}  // namespace
