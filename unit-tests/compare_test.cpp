// docs/spec.md §8: the comparison engine and tolerance policies. Expected values are
// computed by hand in the comments next to them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "compare/compare.hpp"
#include "compare/policy.hpp"

using namespace ced;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kDenormMin = std::numeric_limits<double>::denorm_min();

// Random tests print their seed; CED_SEED replays one.
uint64_t test_seed() {
  uint64_t seed = 20261129;
  if (const char* s = std::getenv("CED_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::cout << "seed: " << seed << " (set CED_SEED to replay)\n";
  return seed;
}

std::vector<double> random_values(std::mt19937_64& rng, size_t n, double scale) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TensorCompare cmp(const std::vector<double>& t, const std::vector<double>& r, Thresholds th = {},
                  TensorDtype dtype = TensorDtype::F64) {
  return compare_tensors(t, r, {static_cast<int64_t>(t.size())}, th, dtype);
}

std::string input_error_of(auto&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

bool has_violation(const Verdict& v, const std::string& name) {
  for (const auto& x : v.violations)
    if (x.threshold == name) return true;
  return false;
}

}  // namespace

// ---------------------------------------------------------------- tensors

TEST(CompareTensors, MetricsOfASmallTensorMatchHandComputedValues) {
  // t = [[1, 2], [3, 4]], r = [[1, 2], [3, 5]]: d = [0, 0, 0, -1].
  const std::vector<double> t = {1, 2, 3, 4}, r = {1, 2, 3, 5};
  Thresholds th;
  th.atol = 0.5;
  const auto c = compare_tensors(t, r, {2, 2}, th, TensorDtype::F64);
  EXPECT_EQ(c.n, 4);
  EXPECT_TRUE(c.all_finite());
  EXPECT_EQ(c.max_abs_err, 1.0);
  EXPECT_EQ(c.max_abs.flat, 3);
  EXPECT_EQ(c.max_abs.index, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(c.max_abs.t, 4.0);
  EXPECT_EQ(c.max_abs.r, 5.0);
  EXPECT_DOUBLE_EQ(c.max_rel_err, 0.2);                          // 1 / 5
  EXPECT_DOUBLE_EQ(c.rel_l2, 1.0 / std::sqrt(39.0));             // ||r||^2 = 1 + 4 + 9 + 25
  EXPECT_DOUBLE_EQ(c.nmse, 1.0 / 39.0);
  EXPECT_DOUBLE_EQ(c.cosine, 34.0 / std::sqrt(30.0 * 39.0));     // <t,r> = 1 + 4 + 9 + 20, ||t||^2 = 30
  EXPECT_EQ(c.max_ulp, uint64_t{1} << 50);                       // ulp(4) = 2^-50 in f64
  EXPECT_EQ(c.max_ulp_at.flat, 3);
  EXPECT_EQ(c.mismatches, 1);                                    // 1 > 0.5
  EXPECT_EQ(c.first_mismatch.index, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(c.min_passing_atol, 1.0);
  // The same values in f32: ulp(4) = 2^-21.
  EXPECT_EQ(compare_tensors(t, r, {2, 2}, th, TensorDtype::F32).max_ulp, uint64_t{1} << 21);
}

TEST(CompareTensors, NaNNeverPasses) {
  const std::vector<double> t = {1, kNaN, 3, kNaN}, r = {1, 2, 3, 4};
  Thresholds th;
  th.atol = kInf;  // even an infinite tolerance
  const auto c = cmp(t, r, th);
  EXPECT_EQ(c.t_nonfinite.nan, 2);
  EXPECT_EQ(c.t_nonfinite.first_nan, 1);
  EXPECT_EQ(c.r_nonfinite.nan, 0);
  EXPECT_EQ(c.nan_pairs, 2);
  EXPECT_EQ(c.mismatches, 2);
  EXPECT_EQ(c.first_mismatch.flat, 1);
  EXPECT_EQ(c.max_abs_err, 0.0);  // over the non-NaN pairs
  Comparison cc;
  cc.tensor = c;
  const auto v = judge("runs/a/logits", th, cc);
  EXPECT_FALSE(v.pass);
  EXPECT_TRUE(has_violation(v, "nan"));
  // Without any threshold the NaN still fails.
  Comparison bare;
  bare.tensor = cmp(t, r);
  EXPECT_FALSE(judge("x", Thresholds{}, bare).pass);
}

TEST(CompareTensors, NaNAtTheSamePlaceInBothIsReportedAndFails) {
  const std::vector<double> t = {kNaN, 1}, r = {kNaN, 1};
  const auto c = cmp(t, r);
  EXPECT_EQ(c.t_nonfinite.nan, 1);
  EXPECT_EQ(c.r_nonfinite.nan, 1);
  EXPECT_EQ(c.r_nonfinite.first_nan, 0);
  EXPECT_EQ(c.mismatches, 1);
  Comparison cc;
  cc.tensor = c;
  EXPECT_FALSE(judge("x", Thresholds{}, cc).pass);
}

TEST(CompareTensors, InfMismatchIsReportedAndFailsButIdenticalInfinitiesAreEqual) {
  const std::vector<double> t = {kInf, -kInf, 1, 2}, r = {kInf, -kInf, kInf, 2};
  Thresholds th;
  th.rtol = 1;  // rtol * |Inf| must not excuse the mismatch
  const auto c = cmp(t, r, th);
  EXPECT_EQ(c.t_nonfinite.inf, 2);
  EXPECT_EQ(c.r_nonfinite.inf, 3);
  EXPECT_EQ(c.r_nonfinite.first_inf, 0);
  EXPECT_EQ(c.inf_mismatches, 1);
  EXPECT_EQ(c.first_inf_mismatch, 2);
  EXPECT_EQ(c.max_abs_err, kInf);
  EXPECT_EQ(c.max_abs.flat, 2);
  EXPECT_EQ(c.mismatches, 1);  // only element 2
  EXPECT_EQ(c.min_passing_atol, kInf);
  EXPECT_EQ(c.finite_pairs, 1);
  EXPECT_EQ(c.rel_l2, 0.0);  // norms cover the finite pairs: [2] vs [2]
  EXPECT_EQ(c.cosine, 1.0);
  Comparison cc;
  cc.tensor = c;
  const auto v = judge("x", th, cc);
  EXPECT_FALSE(v.pass);
  EXPECT_TRUE(has_violation(v, "inf_mismatch"));

  const auto same = cmp({kInf, -kInf}, {kInf, -kInf});
  EXPECT_EQ(same.max_abs_err, 0.0);
  EXPECT_EQ(same.max_ulp, 0u);
  EXPECT_EQ(same.mismatches, 0);
  EXPECT_EQ(same.t_nonfinite.inf, 2);  // still reported
}

TEST(CompareTensors, TwoAllZeroTensorsCompareEqual) {
  const std::vector<double> z = {0, 0, -0.0, 0};
  const auto c = compare_tensors(z, z, {2, 2}, {}, TensorDtype::F32);
  EXPECT_EQ(c.max_abs_err, 0.0);
  EXPECT_EQ(c.max_rel_err, 0.0);
  EXPECT_EQ(c.max_rel.flat, -1);  // no r != 0
  EXPECT_EQ(c.zero_ref_nonzero, 0);
  EXPECT_EQ(c.rel_l2, 0.0);
  EXPECT_EQ(c.nmse, 0.0);
  EXPECT_EQ(c.cosine, 1.0);
  EXPECT_EQ(c.max_ulp, 0u);
  EXPECT_EQ(c.mismatches, 0);
  EXPECT_EQ(c.min_passing_atol, 0.0);
}

TEST(CompareTensors, AllZeroReferenceGivesInfiniteRelL2NotNaN) {
  const auto c = cmp({0, 3}, {0, 0});
  EXPECT_EQ(c.rel_l2, kInf);
  EXPECT_EQ(c.nmse, kInf);
  EXPECT_EQ(c.cosine, 0.0);  // exactly one zero vector
  EXPECT_EQ(c.zero_ref_nonzero, 1);
  EXPECT_EQ(c.max_rel.flat, -1);
  EXPECT_EQ(c.max_abs_err, 3.0);
  // And the other way round: t zero, r not.
  const auto d = cmp({0, 0}, {0, 3});
  EXPECT_EQ(d.rel_l2, 1.0);  // ||0 - r|| / ||r||
  EXPECT_EQ(d.nmse, 1.0);
  EXPECT_EQ(d.cosine, 0.0);
  EXPECT_EQ(d.max_rel_err, 1.0);
}

TEST(CompareTensors, MaxRelErrorSkipsZeroReferenceAndCountsItSeparately) {
  // r = 0 at [0]: |t - r| / |r| undefined there; [1]: |3 - 2| / 2 = 0.5.
  const auto c = cmp({1e-3, 3}, {0, 2});
  EXPECT_EQ(c.max_rel_err, 0.5);
  EXPECT_EQ(c.max_rel.flat, 1);
  EXPECT_EQ(c.zero_ref_nonzero, 1);
  EXPECT_EQ(c.max_abs_err, 1.0);
}

TEST(CompareTensors, SmallestPassingAtolPassesAndAnythingSmallerFails) {
  // Hand case: rtol = 0.01; excess = |t - r| - 0.01 |r| = [0.5 - 0.01, 0.2 - 0.1] -> 0.49.
  Thresholds th;
  th.rtol = 0.01;
  const auto c = cmp({1.5, 10.2}, {1, 10}, th);
  EXPECT_DOUBLE_EQ(c.min_passing_atol, 0.49);

  // Random case: exact at the boundary, in both directions.
  std::mt19937_64 rng(test_seed());
  const auto r = random_values(rng, 1000, 3.0);
  auto t = r;
  const auto noise = random_values(rng, 1000, 1e-4);
  for (size_t i = 0; i < t.size(); ++i) t[i] += noise[i];
  for (double rtol : {0.0, 1e-5, 1e-3}) {
    Thresholds probe;
    probe.rtol = rtol;
    const double a = cmp(t, r, probe).min_passing_atol;
    ASSERT_GT(a, 0.0) << "rtol " << rtol;
    Thresholds at = probe, below = probe;
    at.atol = a;
    below.atol = std::nextafter(a, 0.0);
    EXPECT_EQ(cmp(t, r, at).mismatches, 0) << "rtol " << rtol;
    EXPECT_GE(cmp(t, r, below).mismatches, 1) << "rtol " << rtol;
  }
}

TEST(CompareTensors, UlpDistanceOfNegativeAndPositiveZeroIsZero) {
  for (auto d : {TensorDtype::F64, TensorDtype::F32, TensorDtype::BF16}) {
    EXPECT_EQ(ulp_distance(-0.0, 0.0, d), 0u) << dtype_name(d);
    const auto c = compare_tensors(std::vector<double>{-0.0}, std::vector<double>{0.0}, {1}, {}, d);
    EXPECT_EQ(c.max_ulp, 0u);
    EXPECT_EQ(c.max_abs_err, 0.0);
  }
}

TEST(CompareTensors, UlpDistanceCountsInTheDeclaredDtype) {
  const double next64 = std::nextafter(1.0, 2.0);
  EXPECT_EQ(ulp_distance(1.0, next64, TensorDtype::F64), 1u);
  EXPECT_EQ(ulp_distance(1.0, next64, TensorDtype::F32), 0u);  // both round to 1.0f
  const double next32 = 1.0 + std::ldexp(1.0, -23);
  EXPECT_EQ(ulp_distance(1.0, next32, TensorDtype::F32), 1u);
  EXPECT_EQ(ulp_distance(1.0, next32, TensorDtype::F64), uint64_t{1} << 29);  // 2^-23 / 2^-52
  EXPECT_EQ(ulp_distance(1.0, 1.0 + std::ldexp(1.0, -7), TensorDtype::BF16), 1u);
  // Across zero through the denormals: -denorm_min, -0, +0, denorm_min.
  EXPECT_EQ(ulp_distance(-kDenormMin, kDenormMin, TensorDtype::F64), 2u);
  EXPECT_EQ(ulp_distance(std::numeric_limits<double>::max(), kInf, TensorDtype::F64), 1u);
  // The extreme distance does not overflow: -Inf to +Inf.
  EXPECT_EQ(ulp_distance(-kInf, kInf, TensorDtype::F64), 2 * uint64_t{0x7FF0000000000000});
  EXPECT_EQ(ulp_distance(1.0, 2.0, TensorDtype::F64), ulp_distance(2.0, 1.0, TensorDtype::F64));
  EXPECT_EQ(ulp_distance(kNaN, 1.0, TensorDtype::F64), std::numeric_limits<uint64_t>::max());
}

TEST(CompareTensors, MetricsAreFiniteForHugeRanges) {
  // ||r||^2 = 2.5e601 overflows a naive sum; ||d|| / ||r|| = 5e290 / 5e300.
  // Tolerances: rounding 4e300 + 5e290 moves d by ~1e-6 of itself.
  {
    const auto c = cmp({3e300, 4e300 + 5e290}, {3e300, 4e300});
    EXPECT_NEAR(c.rel_l2, 1e-10, 1e-16);
    EXPECT_NEAR(c.nmse, 1e-20, 1e-26);
    EXPECT_NEAR(c.cosine, 1.0, 1e-15);  // a few ulp of 1
  }
  // The same at 1e-300, where the squares underflow.
  {
    const auto c = cmp({3e-300, 4e-300 + 5e-310}, {3e-300, 4e-300});
    EXPECT_NEAR(c.rel_l2, 1e-10, 1e-16);
    EXPECT_NEAR(c.nmse, 1e-20, 1e-26);
  }
  // Both ends at once, identical: 0, 1, never inf/inf.
  {
    const auto c = cmp({1e300, 1e-300, -1e300}, {1e300, 1e-300, -1e300});
    EXPECT_EQ(c.rel_l2, 0.0);
    EXPECT_EQ(c.nmse, 0.0);
    EXPECT_EQ(c.cosine, 1.0);
  }
  // Denormals: r = [3u, 4u], t = [0, 4u] with u = denorm_min: ||d|| / ||r|| = 3/5, cos = 16/20.
  {
    const auto c = cmp({0, 4 * kDenormMin}, {3 * kDenormMin, 4 * kDenormMin});
    EXPECT_DOUBLE_EQ(c.rel_l2, 0.6);
    EXPECT_DOUBLE_EQ(c.nmse, 0.36);
    EXPECT_DOUBLE_EQ(c.cosine, 0.8);
    EXPECT_EQ(c.max_abs_err, 3 * kDenormMin);
    EXPECT_EQ(c.max_rel_err, 1.0);
    EXPECT_EQ(c.max_ulp, 3u);
  }
  // A difference that overflows double: |t - r| = 2e308 is reported as Inf,
  // but the norms and the relative error stay exact: d = 2r.
  {
    const auto c = cmp({1e308}, {-1e308});
    EXPECT_EQ(c.max_abs_err, kInf);
    EXPECT_DOUBLE_EQ(c.max_rel_err, 2.0);
    EXPECT_DOUBLE_EQ(c.rel_l2, 2.0);
    EXPECT_DOUBLE_EQ(c.nmse, 4.0);
    EXPECT_EQ(c.cosine, -1.0);
  }
}

TEST(CompareTensors, MetricsAreNeverNaNWhateverTheValues) {
  // Random mixes of zeros of both signs, denormals, huge values and infinities.
  std::mt19937_64 rng(test_seed());
  const double pool[] = {0.0, -0.0, kDenormMin, -3 * kDenormMin, 1e-310, 1e-300, 1.0, -2.5, 1e300, -1e308,
                         std::numeric_limits<double>::max(), kInf, -kInf};
  std::uniform_int_distribution<size_t> pick(0, std::size(pool) - 1);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<double> t(5), r(5);
    for (auto& x : t) x = pool[pick(rng)];
    for (auto& x : r) x = pool[pick(rng)];
    Thresholds th;
    th.rtol = trial % 2 ? 1e-3 : 0.0;
    for (auto dtype : {TensorDtype::F64, TensorDtype::F32, TensorDtype::BF16}) {
      const auto c = cmp(t, r, th, dtype);
      for (double m : {c.max_abs_err, c.max_rel_err, c.rel_l2, c.nmse, c.cosine, c.min_passing_atol})
        ASSERT_FALSE(std::isnan(m)) << trial << "\n" << summary(c);
      ASSERT_GE(c.cosine, -1.0);
      ASSERT_LE(c.cosine, 1.0);
    }
    const auto l = compare_logits(t, r, {1, 5});
    ASSERT_FALSE(std::isnan(l.max_kl) || std::isnan(l.mean_kl)) << trial;
  }
}

TEST(CompareTensors, CosineAndAbsErrorAreSymmetric) {
  std::mt19937_64 rng(test_seed());
  for (double scale : {1e-300, 1e-5, 1.0, 1e150, 1e300}) {
    const auto a = random_values(rng, 257, scale);
    const auto b = random_values(rng, 257, scale);
    Thresholds th;
    th.atol = 0.5 * scale;  // atol only: the mismatch criterion is symmetric
    const auto ab = cmp(a, b, th, TensorDtype::F32), ba = cmp(b, a, th, TensorDtype::F32);
    EXPECT_EQ(ab.cosine, ba.cosine) << scale;
    EXPECT_EQ(ab.max_abs_err, ba.max_abs_err) << scale;
    EXPECT_EQ(ab.max_abs.flat, ba.max_abs.flat) << scale;
    EXPECT_EQ(ab.max_ulp, ba.max_ulp) << scale;
    EXPECT_EQ(ab.mismatches, ba.mismatches) << scale;
    EXPECT_EQ(ab.min_passing_atol, ba.min_passing_atol) << scale;
    EXPECT_TRUE(std::isfinite(ab.rel_l2) && std::isfinite(ab.nmse)) << scale;
  }
}

TEST(CompareTensors, EmptyTensorsCompareEqual) {
  const std::vector<double> none;
  const auto c = compare_tensors(none, none, {0, 3}, {}, TensorDtype::F32);
  EXPECT_EQ(c.n, 0);
  EXPECT_EQ(c.rel_l2, 0.0);
  EXPECT_EQ(c.cosine, 1.0);
  EXPECT_EQ(c.max_abs.flat, -1);
}

TEST(CompareTensors, ShapeOrSizeMismatchIsAnInputError) {
  const std::vector<double> a = {1, 2, 3}, b = {1, 2};
  EXPECT_THROW(compare_tensors(a, b, {3}, {}, TensorDtype::F64), InputError);
  EXPECT_THROW(compare_tensors(a, a, {2, 2}, {}, TensorDtype::F64), InputError);
  Thresholds bad;
  bad.atol = -1;
  EXPECT_THROW(compare_tensors(a, a, {3}, bad, TensorDtype::F64), InputError);
  EXPECT_THROW(parse_tensor_dtype("f16"), InputError);
  EXPECT_EQ(parse_tensor_dtype("bf16"), TensorDtype::BF16);
}

// ---------------------------------------------------------------- logits

TEST(CompareLogits, KLIsZeroForIdenticalLogits) {
  std::mt19937_64 rng(test_seed());
  auto x = random_values(rng, 4 * 11, 5.0);
  x[3] = -kInf;  // a masked token is probability 0 on both sides
  const auto c = compare_logits(x, x, {4, 11});
  for (double kl : c.kl) EXPECT_EQ(kl, 0.0);
  EXPECT_EQ(c.mean_kl, 0.0);
  EXPECT_EQ(c.max_kl, 0.0);
  EXPECT_EQ(c.top1_agree, 4);
  EXPECT_EQ(c.top1_fraction, 1.0);
  EXPECT_EQ(c.topk, 5);
  EXPECT_EQ(c.topk_overlap, 1.0);
}

TEST(CompareLogits, KLMatchesHandComputedValue) {
  // Row 0: p_r = [1/2, 1/2], p_t = [1/4, 3/4]:
  //   KL = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3).   Row 1: identical, 0.
  const double l3 = std::log(3.0);
  const std::vector<double> t = {0, l3, 1, 2}, r = {0, 0, 1, 2};
  const auto c = compare_logits(t, r, {2, 2});
  EXPECT_NEAR(c.kl[0], 0.5 * std::log(4.0 / 3.0), 1e-15);  // a few ulp of the logs
  EXPECT_EQ(c.kl[1], 0.0);
  EXPECT_NEAR(c.mean_kl, 0.25 * std::log(4.0 / 3.0), 1e-15);
  EXPECT_EQ(c.max_kl_row, 0);
  EXPECT_EQ(c.topk, 2);  // min(5, V)
}

TEST(CompareLogits, KLIsStableForHugeLogits) {
  // Shifting both rows by 1e5 (exp overflows naively) leaves the KL unchanged.
  const double s = 1e5, l3 = std::log(3.0);
  const auto c = compare_logits(std::vector<double>{s, s + l3}, std::vector<double>{s, s}, {1, 2});
  EXPECT_NEAR(c.kl[0], 0.5 * std::log(4.0 / 3.0), 1e-10);  // l3 is rounded at ulp(1e5) ~ 1.5e-11
}

TEST(CompareLogits, KLIsInfiniteNotNaNWhereTheTensorRulesOutAReferenceToken) {
  const auto c = compare_logits(std::vector<double>{0, -kInf}, std::vector<double>{0, 0}, {1, 2});
  EXPECT_EQ(c.kl[0], kInf);
  EXPECT_EQ(c.mean_kl, kInf);
  const auto n = compare_logits(std::vector<double>{0, kNaN}, std::vector<double>{0, 0}, {1, 2});
  EXPECT_EQ(n.kl[0], kInf);  // undefined counts as failing
}

TEST(CompareLogits, Top1TiesRankTheLargerIndexFirst) {
  // Row 0: t ties at 0 and 1 -> 1; r ties at 1 and 2 -> 2: disagree.
  // Row 1: t ties at 0 and 1 -> 1; r ties at 0 and 1 (with -0 == +0) -> 1: agree.
  const std::vector<double> t = {5, 5, 1, 0.0, 0.0, -1}, r = {1, 5, 5, 0.0, -0.0, -1};
  const auto c = compare_logits(t, r, {2, 3});
  EXPECT_EQ(c.top1_agree, 1);
  EXPECT_EQ(c.top1_fraction, 0.5);
  EXPECT_EQ(c.first_top1_disagreement, 0);
}

TEST(CompareLogits, Top5OverlapCountsCommonIndices) {
  // top5(t) = {0..4}, top5(r) = {2..6}: 3 in common -> 3/5.
  const std::vector<double> t = {7, 6, 5, 4, 3, 2, 1}, r = {1, 2, 3, 4, 5, 6, 7};
  const auto c = compare_logits(t, r, {1, 7});
  EXPECT_DOUBLE_EQ(c.topk_overlap, 0.6);
  EXPECT_EQ(c.min_topk_overlap_row, 0);
  EXPECT_EQ(c.top1_agree, 0);
  EXPECT_THROW(compare_logits(t, r, {7}), InputError);
}

// ---------------------------------------------------------------- selections

TEST(CompareSelections, JaccardOfDisjointSelectionsIsZero) {
  const std::vector<int64_t> t = {0, 1, 2}, r = {3, 4, 5};
  const auto c = compare_selections(t, r, {1, 3}, {});
  EXPECT_EQ(c.jaccard[0], 0.0);
  EXPECT_EQ(c.min_jaccard, 0.0);
  EXPECT_EQ(c.differing, 6);
  EXPECT_FALSE(c.scored);
}

TEST(CompareSelections, JaccardIgnoresOrderAndPaddingAndTwoEmptySetsAgree) {
  // Row 0: {3, 1} vs {1, 3}: 1.  Row 1: {1, 2} vs {2, 3, 4}: 1/4.  Row 2: {} vs {}: 1.
  const std::vector<int64_t> t = {3, 1, -1, 1, 2, -1, -1, -1, -1};
  const std::vector<int64_t> r = {1, 3, -1, 2, 3, 4, -1, -1, -1};
  const auto c = compare_selections(t, r, {3, 3}, {});
  EXPECT_EQ(c.jaccard, (std::vector<double>{1.0, 0.25, 1.0}));
  EXPECT_DOUBLE_EQ(c.mean_jaccard, 2.25 / 3);
  EXPECT_EQ(c.min_jaccard, 0.25);
  EXPECT_EQ(c.min_jaccard_row, 1);
  EXPECT_EQ(c.differing, 3);  // 1 only in t, 3 and 4 only in r
  EXPECT_EQ(c.differing_rows, 1);
}

TEST(CompareSelections, NearTieDifferenceIsClassifiedAsNearTie) {
  // Reference scores; r selects {10, 20, 30}, its k-th score is 3.0.
  // t selects 40 (score 2.999) instead of 30: gaps 0 (30) and 0.001 (40).
  SelectionScores s;
  s.score = [](int64_t, int64_t e) {
    switch (e) {
      case 10: return 5.0;
      case 20: return 4.0;
      case 30: return 3.0;
      case 40: return 2.999;
      default: return 1.0;
    }
  };
  Thresholds th;
  th.near_tie = 0.01;
  const auto c = compare_selections(std::vector<int64_t>{10, 20, 40}, std::vector<int64_t>{10, 20, 30}, {1, 3}, th, &s);
  EXPECT_TRUE(c.scored);
  EXPECT_EQ(c.near_ties, 2);
  EXPECT_EQ(c.real_disagreements, 0);
  EXPECT_NEAR(c.worst_gap, 0.001, 1e-12);  // 3.0 - 2.999 in double
  EXPECT_EQ(c.worst_gap_entry, 40);
  ASSERT_EQ(c.listed.size(), 2u);
  EXPECT_EQ(c.listed[0].entry, 30);
  EXPECT_FALSE(c.listed[0].in_t);
  EXPECT_EQ(c.listed[0].gap, 0.0);
  EXPECT_TRUE(c.listed[1].in_t);
  Comparison cc;
  cc.selection = c;
  EXPECT_TRUE(judge("runs/a/layers/4/topk", th, cc).pass);
}

TEST(CompareSelections, FarBelowTheKthScoreIsARealDisagreement) {
  // t selects 50 (score 1.0): gap |1.0 - 3.0| = 2 > 0.01.
  SelectionScores s;
  s.score = [](int64_t, int64_t e) { return e == 10 ? 5.0 : e == 20 ? 4.0 : e == 30 ? 3.0 : 1.0; };
  Thresholds th;
  th.near_tie = 0.01;
  const auto c = compare_selections(std::vector<int64_t>{10, 20, 50}, std::vector<int64_t>{10, 20, 30}, {1, 3}, th, &s);
  EXPECT_EQ(c.near_ties, 1);  // 30 itself sits at the k-th score
  EXPECT_EQ(c.real_disagreements, 1);
  EXPECT_EQ(c.worst_gap, 2.0);
  EXPECT_EQ(c.worst_gap_row, 0);
  EXPECT_EQ(c.worst_gap_entry, 50);
  Comparison cc;
  cc.selection = c;
  const auto v = judge("runs/a/layers/4/topk", th, cc);
  EXPECT_FALSE(v.pass);
  EXPECT_TRUE(has_violation(v, "near_tie"));
}

TEST(CompareSelections, DuplicateOrNegativeEntriesAreInvalidAndFail) {
  const auto c = compare_selections(std::vector<int64_t>{1, 1, -2}, std::vector<int64_t>{1, 2, -1}, {1, 3}, {});
  EXPECT_EQ(c.invalid_t, 2);
  EXPECT_EQ(c.invalid_r, 0);
  EXPECT_DOUBLE_EQ(c.jaccard[0], 0.5);  // {1} vs {1, 2}
  Comparison cc;
  cc.selection = c;
  EXPECT_TRUE(has_violation(judge("x", Thresholds{}, cc), "invalid_selection"));
}

// ---------------------------------------------------------------- policies

namespace {
const char* kPolicy = R"(# test policy
[[rule]]
pattern = "runs/*/logits"
reason = "logits: f32 accumulation"
rtol = 1e-4
atol = 1e-5
max_kl = 1e-8

[[rule]]
pattern = "runs/*/layers/4/out"
reason = "layer 4 is special"
max_rel_l2 = 1e-3

[[rule]]
pattern = "runs/*/layers/*/out"
reason = "activations"
max_rel_l2 = 1e-6
min_cosine = 0.99999
)";
}  // namespace

TEST(Policy, FirstMatchingRuleWins) {
  const Policy p = parse_policy_toml(kPolicy, "policy.toml");
  ASSERT_EQ(p.rules.size(), 3u);
  EXPECT_EQ(p.rule_for("runs/ced/layers/4/out").reason, "layer 4 is special");
  EXPECT_EQ(p.rule_for("runs/ced/layers/5/out").reason, "activations");
  EXPECT_EQ(p.rule_for("runs/full/logits").reason, "logits: f32 accumulation");
  EXPECT_EQ(p.rules[1].origin, "policy.toml:9");
  const Thresholds th = p.thresholds_for("runs/ced/layers/4/out");
  EXPECT_EQ(th.max_rel_l2, 1e-3);
  EXPECT_FALSE(th.min_cosine.has_value());
}

TEST(Policy, UnmatchedTensorIsAnError) {
  const Policy p = parse_policy_toml(kPolicy, "policy.toml");
  EXPECT_EQ(p.match("runs/ced/layers/4/topk"), nullptr);
  const auto msg = input_error_of([&] { p.rule_for("runs/ced/layers/4/topk"); });
  EXPECT_NE(msg.find("runs/ced/layers/4/topk"), std::string::npos) << msg;
  Comparison cc;
  EXPECT_THROW(judge(p, "inputs/tokens", cc), InputError);
}

TEST(Policy, PolicyWithoutReasonIsRejected) {
  const auto msg = input_error_of([] {
    parse_policy_toml("[[rule]]\npattern = \"runs/*/logits\"\natol = 1e-5\n", "p.toml");
  });
  EXPECT_NE(msg.find("reason"), std::string::npos) << msg;
  EXPECT_NE(msg.find("p.toml:1"), std::string::npos) << msg;
  EXPECT_THROW(parse_policy_toml("[[rule]]\npattern = \"x\"\nreason = \"\"\n", "p.toml"), InputError);
}

TEST(Policy, UnknownKeyIsRejectedWithFileAndLine) {
  const auto msg = input_error_of([] {
    parse_policy_toml("[[rule]]\npattern = \"x\"\nreason = \"r\"\nmax_rel_l3 = 1\n", "p.toml");
  });
  EXPECT_NE(msg.find("max_rel_l3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("p.toml:4"), std::string::npos) << msg;
  const auto top = input_error_of([] { parse_policy_toml("version = 1\n", "q.toml"); });
  EXPECT_NE(top.find("version"), std::string::npos) << top;
  EXPECT_NE(top.find("q.toml:1"), std::string::npos) << top;
}

TEST(Policy, MalformedRulesAreRejected) {
  // [rule] (a table) instead of [[rule]].
  EXPECT_THROW(parse_policy_toml("[rule]\npattern = \"x\"\nreason = \"r\"\n", "p"), InputError);
  // Out of range, wrong type, no pattern, no rules, not TOML.
  EXPECT_THROW(parse_policy_toml("[[rule]]\npattern = \"x\"\nreason = \"r\"\nmin_cosine = 2\n", "p"), InputError);
  EXPECT_THROW(parse_policy_toml("[[rule]]\npattern = \"x\"\nreason = \"r\"\natol = -1\n", "p"), InputError);
  EXPECT_THROW(parse_policy_toml("[[rule]]\npattern = \"x\"\nreason = \"r\"\natol = \"1\"\n", "p"), InputError);
  EXPECT_THROW(parse_policy_toml("[[rule]]\nreason = \"r\"\n", "p"), InputError);
  EXPECT_THROW(parse_policy_toml("", "p"), InputError);
  EXPECT_THROW(parse_policy_toml("[[rule]\n", "p"), InputError);
  // alpha without calibrate; calibrate with atol.
  EXPECT_THROW(parse_policy_toml("[[rule]]\npattern = \"x\"\nreason = \"r\"\nalpha = 2\n", "p"), InputError);
  EXPECT_THROW(parse_policy_toml("[[rule]]\npattern = \"x\"\nreason = \"r\"\ncalibrate = true\nalpha = 2\natol = 1\n", "p"),
               InputError);
  EXPECT_THROW(load_policy_file("/nonexistent/policy.toml"), InputError);
}

TEST(Policy, GlobStarStaysInsideOneNameButDoubleStarCrossesSlashes) {
  EXPECT_TRUE(glob_match("runs/*/logits", "runs/ced/logits"));
  EXPECT_FALSE(glob_match("runs/*/logits", "runs/a/b/logits"));
  EXPECT_TRUE(glob_match("runs/**/out", "runs/a/layers/3/out"));
  EXPECT_TRUE(glob_match("runs/*/layers/?/out", "runs/x/layers/7/out"));
  EXPECT_FALSE(glob_match("runs/*/layers/?/out", "runs/x/layers/17/out"));
  EXPECT_TRUE(glob_match("**", "anything/at/all"));
  EXPECT_FALSE(glob_match("runs/*", "runs/a/logits"));
  EXPECT_TRUE(glob_match("runs/*", "runs/"));
  EXPECT_FALSE(glob_match("runs", "runs/a"));
}

TEST(Policy, SelfCalibratingRuleScalesTheReferenceError) {
  const Policy p = parse_policy_toml(R"([[rule]]
pattern = "runs/*/layers/*/out"
reason = "4x the f32 reference's own error"
calibrate = true
alpha = 4
floor = 1e-7
abs_floor = 1e-6
rtol = 0
)",
                                     "cal.toml");
  // The caller measures the reference in f32 against the reference in f64.
  const auto ref = cmp({1, 2}, {1, 2.00002});  // max_abs = 2e-5
  const Calibration cal = calibration_of(ref);
  EXPECT_NEAR(cal.max_abs, 2e-5, 1e-15);  // 2.00002 - 2 in double
  const Thresholds th = p.thresholds_for("runs/ced/layers/3/out", cal);
  EXPECT_DOUBLE_EQ(*th.max_rel_l2, 4 * cal.rel_l2 + 1e-7);  // alpha * rel_l2 + floor
  EXPECT_DOUBLE_EQ(*th.atol, 4 * cal.max_abs + 1e-6);       // alpha * max_abs + abs_floor
  EXPECT_EQ(*th.rtol, 0.0);
  // Hand values: 4 * 1e-6 + 1e-7 and 4 * 2e-5 + 1e-6.
  const Thresholds hand = p.rules[0].effective("t", Calibration{1e-6, 2e-5});
  EXPECT_DOUBLE_EQ(*hand.max_rel_l2, 4.1e-6);
  EXPECT_DOUBLE_EQ(*hand.atol, 8.1e-5);
  // Without the calibration it cannot be applied.
  EXPECT_THROW(p.thresholds_for("runs/ced/layers/3/out"), InputError);
  EXPECT_THROW(p.rules[0].effective("t", Calibration{kNaN, 0}), InputError);
}

TEST(Policy, VerdictListsEachViolatedThresholdWithMeasuredValueAndLimit) {
  const Policy p = parse_policy_toml(kPolicy, "policy.toml");
  const std::string name = "runs/ced/layers/5/out";
  const Thresholds th = p.thresholds_for(name);
  // d = [0, 0, 0, -1]: rel_l2 = 1/sqrt(39) > 1e-6 and cosine 0.9940 < 0.99999.
  Comparison cc;
  cc.tensor = compare_tensors(std::vector<double>{1, 2, 3, 4}, std::vector<double>{1, 2, 3, 5}, {4}, th,
                              TensorDtype::F32);
  const Verdict v = judge(p, name, cc);
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.reason, "activations");
  ASSERT_EQ(v.violations.size(), 2u);
  EXPECT_EQ(v.violations[0].threshold, "max_rel_l2");
  EXPECT_DOUBLE_EQ(v.violations[0].measured, 1.0 / std::sqrt(39.0));
  EXPECT_EQ(v.violations[0].limit, 1e-6);
  EXPECT_EQ(v.violations[1].threshold, "min_cosine");
  const auto lines = v.lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "FAIL runs/ced/layers/5/out (rule runs/*/layers/*/out: activations)");
  EXPECT_EQ(lines[1], "  max_rel_l2: measured 0.160128 > limit 1e-06");
  EXPECT_EQ(lines[2].rfind("  min_cosine: measured 0.99", 0), 0u) << lines[2];
  EXPECT_NE(lines[2].find("< limit 0.99999"), std::string::npos) << lines[2];

  // Identical tensors pass with a one-line verdict.
  Comparison same;
  same.tensor = compare_tensors(std::vector<double>{1, 2}, std::vector<double>{1, 2}, {2}, th, TensorDtype::F32);
  const Verdict ok = judge(p, name, same);
  EXPECT_TRUE(ok.pass);
  EXPECT_EQ(ok.lines().size(), 1u);
}

TEST(Policy, AtolViolationReportsTheSmallestPassingAtol) {
  Thresholds th;
  th.atol = 0.1;
  Comparison cc;
  cc.tensor = cmp({1, 2.5}, {1, 2}, th);
  const auto v = judge("x", th, cc);
  ASSERT_EQ(v.violations.size(), 1u);
  EXPECT_EQ(v.violations[0].threshold, "atol");
  EXPECT_EQ(v.violations[0].measured, 0.5);
  EXPECT_EQ(v.violations[0].limit, 0.1);
}

TEST(Policy, ThresholdsOfAnotherKindAreListedAsUnchecked) {
  Thresholds th;
  th.max_kl = 1e-6;
  th.min_jaccard = 0.9;
  Comparison cc;
  cc.tensor = cmp({1}, {1}, th);
  const auto v = judge("runs/a/layers/3/out", th, cc);
  EXPECT_TRUE(v.pass);
  EXPECT_EQ(v.unchecked.size(), 2u);
  EXPECT_EQ(v.lines().size(), 2u);
}

TEST(Policy, JudgeRejectsACompareMadeWithOtherTolerances) {
  Thresholds th;
  th.atol = 1e-3;
  Comparison cc;
  cc.tensor = cmp({1}, {1});  // atol 0
  EXPECT_THROW(judge("x", th, cc), std::logic_error);
}

TEST(Policy, LogitsThresholdsAreJudgedOnTheLogitsMetrics) {
  // KL = 1/2 ln(4/3) ~ 0.1438 > 1e-8; top-1 agrees (index 1 in both).
  Thresholds th;
  th.max_kl = 1e-8;
  th.min_top1 = 1;
  Comparison cc;
  cc.logits = compare_logits(std::vector<double>{0, std::log(3.0)}, std::vector<double>{0, 0}, {1, 2});
  const auto v = judge("runs/a/logits", th, cc);
  ASSERT_EQ(v.violations.size(), 1u);
  EXPECT_EQ(v.violations[0].threshold, "max_kl");
  EXPECT_NEAR(v.violations[0].measured, 0.5 * std::log(4.0 / 3.0), 1e-15);
}

// ---------------------------------------------------------------- formatting

TEST(Format, SummaryReportsNonFiniteCountsBeforeAnyNorm) {
  const auto c = compare_tensors(std::vector<double>{1, kNaN, 3, 4}, std::vector<double>{1, 2, 3, 5}, {2, 2}, {},
                                 TensorDtype::F32);
  const std::string s = summary(c);
  EXPECT_EQ(s.find('\n'), std::string::npos);
  const auto nan = s.find("nan=1 first [0,1]");
  ASSERT_NE(nan, std::string::npos) << s;
  EXPECT_LT(nan, s.find("max_abs=1 at [1,1] (t=4 r=5)")) << s;
  EXPECT_LT(s.find("max_abs"), s.find("rel_l2")) << s;
  EXPECT_NE(summary(compare_logits(std::vector<double>{0, 1}, std::vector<double>{0, 1}, {1, 2})).find("top1 1/1"),
            std::string::npos);
  EXPECT_NE(summary(compare_selections(std::vector<int64_t>{1}, std::vector<int64_t>{2}, {1, 1}, {})).find("min=0"),
            std::string::npos);
}

TEST(Format, JsonRendersNonFiniteNumbersAsStrings) {
  EXPECT_EQ(json_number(kInf), "\"inf\"");
  EXPECT_EQ(json_number(-kInf), "\"-inf\"");
  EXPECT_EQ(json_number(kNaN), "\"nan\"");
  const std::string j = to_json(cmp({0, 3}, {0, 0}));  // rel_l2 = +Inf
  EXPECT_NE(j.find(R"("rel_l2":"inf")"), std::string::npos) << j;
  EXPECT_EQ(j.find("nan,"), std::string::npos) << j;
  EXPECT_EQ(j.front(), '{');
  EXPECT_EQ(j.back(), '}');
}

TEST(Format, JsonDoublesRoundTrip) {
  for (double v : {0.1, 1.0 / 3.0, 1e300, -2.5e-308, kDenormMin, 123456789.123456789, -0.0}) {
    const std::string s = json_number(v);
    EXPECT_EQ(std::strtod(s.c_str(), nullptr), v) << s;
  }
  EXPECT_EQ(json_number(0.1), "0.1");
}

TEST(Format, JsonStringsAreEscaped) {
  EXPECT_EQ(json_string("a\"b\\c\nd\x01"), R"("a\"b\\c\nd\u0001")");
  EXPECT_EQ(json_string("runs/ced/logits"), R"("runs/ced/logits")");
  Verdict v;
  v.tensor = "t\"1";
  v.pass = false;
  v.violations.push_back({"max_nmse", kInf, 1e-6, "why"});
  EXPECT_EQ(to_json(v),
            R"({"tensor":"t\"1","pattern":"","reason":"","pass":false,"violations":[{"threshold":"max_nmse",)"
            R"("measured":"inf","limit":1e-06,"detail":"why"}],"unchecked":[]})");
}

TEST(Format, EveryComparisonRendersAsOneJsonObject) {
  SelectionScores s;
  s.score = [](int64_t, int64_t e) { return static_cast<double>(e); };
  const auto sel = compare_selections(std::vector<int64_t>{1, 2}, std::vector<int64_t>{1, 3}, {1, 2}, {}, &s);
  const std::string js = to_json(sel);
  EXPECT_NE(js.find(R"("listed":[{"row":0,"entry":3,"in":"r","score":3,"gap":2,"near_tie":false})"), std::string::npos)
      << js;
  const std::string jl = to_json(compare_logits(std::vector<double>{0, 1}, std::vector<double>{0, 1}, {1, 2}));
  EXPECT_NE(jl.find(R"("max_kl":0)"), std::string::npos) << jl;
}
