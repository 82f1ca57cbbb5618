// docs/sound-bounds.md §5-§7: the admissible results of a linear layer and an RMSNorm hold every
// legitimate implementation (orders, blockings, formulations nobody tuned them to) at lengths around the
// release's constants, and are tight: halved, they fail a legitimate implementation (an adversarial input
// whose every addition rounds the same way), and a simulated narrow accumulator leaves the fp32 model.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compare/op_bounds.hpp"
#include "model/error.hpp"
#include "unit-tests/legit_orders.hpp"

using namespace ced::bounds;
using namespace ced::testing;

namespace {

// The lengths around the release's constants (W = 128, index_topk × ratio, head_dim 512, the groups of
// 128 a tensor core promotes at) and small ones.
const std::vector<int64_t> kLengths{1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 1024};

}  // namespace

TEST(LinearBounds, EveryFp32OrderAtEveryLengthIsAdmissibleInFp32AndAfterABf16Cast) {
  const std::vector<std::pair<const char*, Sum>> orders{
      {"forward", forward}, {"reversed", reversed}, {"pairwise", pairwise}, {"8 lanes", lanes8}, {"blocked 64", blocked64}};
  int64_t judged = 0;
  for (int64_t K : kLengths)
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      std::mt19937 g(seed * 1000 + static_cast<uint32_t>(K));
      const int64_t M = 3, Nout = 5;
      const auto x = random_bf16(static_cast<size_t>(M * K), g), w = random_bf16(static_cast<size_t>(Nout * K), g, 0.05);
      const auto f32 = linear_bounds(x, M, K, w, Nout, {}, 24), b16 = linear_bounds(x, M, K, w, Nout, {}, 8);
      for (const auto& [name, sum] : orders) {
        const auto y = linear_with(sum, x, M, K, w, Nout);
        std::vector<double> cast(y.size());
        for (size_t i = 0; i < y.size(); ++i) cast[i] = bf16(static_cast<float>(y[i]));
        const BoundJudgement a = judge_within(y, f32), b = judge_within(cast, b16);
        EXPECT_EQ(a.outside, 0) << name << " K = " << K << " seed " << seed << ": fp32 result outside";
        EXPECT_EQ(b.outside, 0) << name << " K = " << K << " seed " << seed << ": bf16 result outside";
        judged += a.n + b.n;
      }
    }
  EXPECT_EQ(judged, static_cast<int64_t>(kLengths.size()) * 3 * 5 * 2 * 15);
}

TEST(LinearBounds, ATruncatingNarrowAccumulatorIsAdmissibleUnderItsOwnModelAndNotUnderFp32) {
  BoundModel narrow;
  narrow.accumulation = AccumulationModel::tensor_core(14, 128);
  int64_t outside_fp32 = 0;
  for (int64_t K : {128, 129, 256, 512, 1024})
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      std::mt19937 g(seed + static_cast<uint32_t>(K));
      // Positive terms: truncation loses in one direction, as a narrow accumulator does on such sums.
      auto x = random_bf16(static_cast<size_t>(2 * K), g), w = random_bf16(static_cast<size_t>(4 * K), g);
      for (double& v : x) v = std::fabs(v);
      for (double& v : w) v = std::fabs(v);
      const auto y = linear_with([](const std::vector<float>& p) { return tensor_core(p, 14, 128); }, x, 2, K, w, 4);
      EXPECT_EQ(judge_within(y, linear_bounds(x, 2, K, w, 4, narrow, 24)).outside, 0) << "K = " << K;
      outside_fp32 += judge_within(y, linear_bounds(x, 2, K, w, 4, {}, 24)).outside;
    }
  EXPECT_GT(outside_fp32, 0) << "the fp32 model admitted every result of a 14-bit accumulator";
}

// x = [1, a, a, ...], w = 1: a is just under half an fp32 spacing of 1, so a forward sum loses every one
// of them and errs by (K − 1)·a, 99.6 % of γ_{K−1}·Σ|x|. Legitimate, and outside a bound half as wide.
TEST(LinearBounds, HalvedTheyFailAnAdversarialButLegitimateSum) {
  const int64_t K = 1024;
  std::vector<double> x(static_cast<size_t>(K), 0x1p-24 * 255 / 256), w(static_cast<size_t>(K), 1.0);
  x[0] = 1;
  const auto y = linear_with(forward, x, 1, K, w, 1);
  ASSERT_EQ(y[0], 1.0);
  EXPECT_EQ(judge_within(y, linear_bounds(x, 1, K, w, 1, {}, 24)).outside, 0);
  BoundModel halved;
  halved.scale = 0.5;
  EXPECT_EQ(judge_within(y, linear_bounds(x, 1, K, w, 1, halved, 24)).outside, 1);
  EXPECT_GT(judge_within(y, linear_bounds(x, 1, K, w, 1, {}, 24)).max_use, 0.95);
}

TEST(RmsnormBounds, EveryLegitimateFormulationAtEveryWidthIsAdmissibleBeforeAndAfterTheCast) {
  for (int64_t n : {64, 127, 128, 256, 512, 1024, 4096})
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      std::mt19937 g(seed * 7 + static_cast<uint32_t>(n));
      const int64_t rows = 6;
      auto x = random_bf16(static_cast<size_t>(rows * n), g);
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] *= 0x1p-20;  // a row whose mean eps moves
      const auto w = random_bf16(static_cast<size_t>(n), g, 2);
      for (double eps : {1e-6, 1e-20}) {
        const auto f32 = rmsnorm_bounds(x, n, w, eps, {}, 24), b16 = rmsnorm_bounds(x, n, w, eps, {}, 8);
        for (const Rms& f : kRmsImplementations) {
          EXPECT_EQ(judge_within(rmsnorm_with(f, x, n, w, eps, false), f32).outside, 0) << f.name << " n = " << n << " eps " << eps;
          EXPECT_EQ(judge_within(rmsnorm_with(f, x, n, w, eps, true), b16).outside, 0) << f.name << " n = " << n << " eps " << eps;
        }
      }
    }
}

// A row [1, a, a, ...] with a² just under half an fp32 spacing of 1: a forward sum of squares loses
// every a², so the norm's scale errs by almost all of its bound; halved, the bound fails it.
TEST(RmsnormBounds, HalvedTheyFailAnAdversarialButLegitimateSumOfSquares) {
  const int64_t n = 4096;
  std::vector<double> x(static_cast<size_t>(n), 0x1p-12 * 255 / 256);
  x[0] = 1;
  std::mt19937 g(5);
  const auto w = random_bf16(static_cast<size_t>(n), g);
  const Rms torch = kRmsImplementations.front();
  BoundModel halved;
  halved.scale = 0.5;
  const auto y = rmsnorm_with(torch, x, n, w, 1e-6, false);
  EXPECT_EQ(judge_within(y, rmsnorm_bounds(x, n, w, 1e-6, {}, 24)).outside, 0);
  EXPECT_GT(judge_within(y, rmsnorm_bounds(x, n, w, 1e-6, halved, 24)).outside, n / 2);
  // The other direction: a² just over half a spacing, so every addition rounds up and the sum errs high
  // by almost its bound; the norm's scale is then low, and the upper end of the mean must allow for it.
  std::vector<double> up(static_cast<size_t>(n), 0x1p-12 * 257 / 256);
  up[0] = 1;
  EXPECT_EQ(judge_within(rmsnorm_with(torch, up, n, w, 1e-6, false), rmsnorm_bounds(up, n, w, 1e-6, {}, 24)).outside, 0);
  EXPECT_GT(judge_within(rmsnorm_with(torch, up, n, w, 1e-6, false), rmsnorm_bounds(up, n, w, 1e-6, halved, 24)).outside, n / 2);
  const auto cast = rmsnorm_with(torch, x, n, w, 1e-6, true);
  EXPECT_EQ(judge_within(cast, rmsnorm_bounds(x, n, w, 1e-6, {}, 8)).outside, 0);
  EXPECT_GT(judge_within(cast, rmsnorm_bounds(x, n, w, 1e-6, halved, 8)).outside, 0)
      << "no bf16 result of the adversarial row left the halved intervals";
}

TEST(OpBounds, AResultOneBf16StepFromTheOnlyAdmissibleValueFailsAndANanFailsEverywhere) {
  std::mt19937 g(11);
  const int64_t n = 256;
  const auto x = random_bf16(static_cast<size_t>(2 * n), g), w = random_bf16(static_cast<size_t>(n), g);
  const auto b = rmsnorm_bounds(x, n, w, 1e-6, {}, 8);
  auto y = rmsnorm_with(kRmsImplementations.front(), x, n, w, 1e-6, true);
  ASSERT_EQ(judge_within(y, b).outside, 0);
  size_t i = 0;  // an element whose interval admits one bf16 value only
  while (b[i].admissible.lo != b[i].admissible.hi) ++i;
  y[i] = std::nextafter(static_cast<float>(y[i]), 1e9f);  // not bf16, and not admissible
  y[i + 1] = std::numeric_limits<double>::quiet_NaN();
  const BoundJudgement j = judge_within(y, b);
  EXPECT_EQ(j.outside, 2);
  EXPECT_EQ(j.first_outside, static_cast<int64_t>(i));
  EXPECT_GT(j.outside_by, 0);
}

TEST(OpBounds, RoundingToTheGridIsNearestEvenInwardAndOutwardAsNamed) {
  // bf16 spacing at 1 is 2^-7: 1 + 2^-8 is a tie, to the even 1; 1 + 3·2^-8 a tie to the even 1 + 2^-6.
  EXPECT_EQ(rounded_nearest(1 + 0x1p-8, 1 + 3 * 0x1p-8, 8).lo, 1.0);
  EXPECT_EQ(rounded_nearest(1 + 0x1p-8, 1 + 3 * 0x1p-8, 8).hi, 1 + 0x1p-6);
  EXPECT_EQ(rounded_inward(1 + 0x1p-9, 1 + 0x1p-6 + 0x1p-9, 8).lo, 1 + 0x1p-7);
  EXPECT_EQ(rounded_inward(1 + 0x1p-9, 1 + 0x1p-6 + 0x1p-9, 8).hi, 1 + 0x1p-6);
  // No bf16 value strictly inside (1, 1 + 2^-7): inward falls back to outward.
  EXPECT_EQ(rounded_inward(1 + 0x1p-9, 1 + 0x1p-8, 8).lo, 1.0);
  EXPECT_EQ(rounded_inward(1 + 0x1p-9, 1 + 0x1p-8, 8).hi, 1 + 0x1p-7);
  EXPECT_EQ(significant_bits(1.0), 1);
  EXPECT_EQ(significant_bits(1.5), 2);
  EXPECT_EQ(significant_bits(0.0), 0);
  EXPECT_EQ(significant_bits(1 + 0x1p-7), 8);  // the widest bf16 significand
  EXPECT_EQ(significant_bits(std::numeric_limits<double>::infinity()), 64);
}

TEST(OpBounds, ABoundModelIsNamedAsAUserWritesItAndAnythingElseIsRefused) {
  EXPECT_EQ(parse_bound_model("fp32").name(), "fp32, functions within 2 ulps");
  const BoundModel hopper = parse_bound_model("tensor-core:14:128", 1);
  EXPECT_EQ(hopper.accumulation.kind, AccumulationModel::Kind::tensor_core);
  EXPECT_EQ(hopper.accumulation.accumulator_bits, 14);
  EXPECT_EQ(hopper.accumulation.promotion_interval, 128);
  EXPECT_EQ(hopper.function_ulps, 1);
  for (const char* bad : {"fp16", "tensor-core:14", "tensor-core:14:128x", "tensor-core:40:128", "tensor-core:14:0", ""})
    EXPECT_THROW(parse_bound_model(bad), ced::InputError) << bad;
  EXPECT_THROW(parse_bound_model("fp32", 0.25), ced::InputError);
}

TEST(LinearBounds, OverIntervalInputsTheyHoldEveryPointOfTheIntervalsInEveryOrderAndEqualThePointBoundsOnPoints) {
  std::mt19937 g(21);
  const int64_t M = 4, K = 257, Nout = 6;
  const auto x = random_bf16(static_cast<size_t>(M * K), g), w = random_bf16(static_cast<size_t>(Nout * K), g, 0.1);
  // Points: the same intervals as the point overload.
  const auto point = linear_bounds(x, M, K, w, Nout, {}, 24), same = linear_bounds(x, x, M, K, w, Nout, {}, 24);
  for (size_t i = 0; i < point.size(); ++i) {
    EXPECT_EQ(point[i].admissible.lo, same[i].admissible.lo) << i;
    EXPECT_EQ(point[i].admissible.hi, same[i].admissible.hi) << i;
  }
  // Each input one bf16 step wide: any bf16 values inside, summed in any order, are admissible.
  std::vector<double> lo(x.size()), hi(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    lo[i] = x[i];
    hi[i] = bf16(static_cast<float>(std::nextafter(static_cast<float>(x[i]), 1e9f) + std::fabs(x[i]) * 0x1p-8));
  }
  const auto b = linear_bounds(lo, hi, M, K, w, Nout, {}, 24);
  for (int pick = 0; pick < 3; ++pick) {
    std::vector<double> v(x.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = pick == 0 ? lo[i] : pick == 1 ? hi[i] : (g() % 2 ? lo[i] : hi[i]);
    for (const Sum& order : {Sum(forward), Sum(reversed), Sum(pairwise), Sum(lanes8)})
      EXPECT_EQ(judge_within(linear_with(order, v, M, K, w, Nout), b).outside, 0) << "pick " << pick;
  }
}
