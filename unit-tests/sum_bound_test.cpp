// The summation bounds of the sound gate (compare/sum_bound.hpp, docs/sound-bounds.md) hold for every
// order we can evaluate and are tight: an adversarial order reaches nearly all of the fp32 bound (so a
// bound half as wide fails a legitimate sum), and a tensor-core accumulator leaves the fp32 bound (so the
// declared model matters). Exact sums by integer arithmetic; the seed is printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "compare/sum_bound.hpp"
#include "model/error.hpp"

using namespace ced::bounds;

namespace {

constexpr uint32_t kSeed = 20261205;

float bf16(float x) {  // round to nearest even bf16, kept as a float
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b += 0x7fff + ((b >> 16) & 1);
  b &= 0xffff0000u;
  float y;
  std::memcpy(&y, &b, 4);
  return y;
}

// Products of two bf16 values (exact in fp32), with magnitudes over a few binades and both signs.
std::vector<float> bf16_products(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = bf16(d(g)) * bf16(d(g));
  return x;
}

// The exact sum: every term is an integer multiple of 2^-60 below 2^20, so a 128-bit integer holds the sum.
double exact_sum(const std::vector<float>& x) {
  __int128 s = 0;
  for (float v : x) s += static_cast<__int128>(std::ldexp(static_cast<double>(v), 60));
  return std::ldexp(static_cast<double>(s), -60);
}

double abs_sum(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += std::fabs(static_cast<double>(v));
  return s;
}

float forward(const std::vector<float>& x) {
  float s = 0;
  for (float v : x) s += v;
  return s;
}
float reverse(const std::vector<float>& x) {
  float s = 0;
  for (auto it = x.rbegin(); it != x.rend(); ++it) s += *it;
  return s;
}
float pairwise(const float* x, size_t n) {
  if (n == 1) return x[0];
  return pairwise(x, n / 2) + pairwise(x + n / 2, n - n / 2);
}
float blocked(const std::vector<float>& x, size_t block) {  // split-K: blocks summed, then the partials
  float s = 0;
  for (size_t b = 0; b < x.size(); b += block) {
    float p = 0;
    for (size_t i = b; i < std::min(x.size(), b + block); ++i) p += x[i];
    s += p;
  }
  return s;
}
float lanes(const std::vector<float>& x, size_t width) {  // a vector ISA's lanes, then their tree
  std::vector<float> l(width, 0.f);
  for (size_t i = 0; i < x.size(); ++i) l[i % width] += x[i];
  return pairwise(l.data(), width);
}

// A narrow accumulator of `bits` significant bits that truncates (toward zero) after every add, promoted
// to an fp32 sum every `interval` terms: Hopper's FP8 tensor cores as DeepGEMM drives them.
double truncate(double x, int bits) {
  if (x == 0) return 0;
  int e = 0;
  std::frexp(x, &e);
  const double s = std::ldexp(1.0, e - bits);
  return std::trunc(x / s) * s;
}
float tensor_core(const std::vector<float>& x, int bits, size_t interval) {
  float s = 0;
  for (size_t b = 0; b < x.size(); b += interval) {
    double p = 0;
    for (size_t i = b; i < std::min(x.size(), b + interval); ++i) p = truncate(p + truncate(x[i], bits), bits);
    s += static_cast<float>(p);
  }
  return s;
}

TEST(SumBound, EveryFp32OrderOfBf16ProductsLiesWithinTheFp32Bound) {
  std::printf("seed %u\n", kSeed);
  const std::vector<std::pair<const char*, std::function<float(const std::vector<float>&)>>> orders = {
      {"forward", forward},
      {"reverse", reverse},
      {"pairwise", [](const std::vector<float>& x) { return pairwise(x.data(), x.size()); }},
      {"blocked 32", [](const std::vector<float>& x) { return blocked(x, 32); }},
      {"blocked 128", [](const std::vector<float>& x) { return blocked(x, 128); }},
      {"8 lanes", [](const std::vector<float>& x) { return lanes(x, 8); }},
      {"16 lanes", [](const std::vector<float>& x) { return lanes(x, 16); }}};
  double worst = 0;
  for (int64_t n : {1, 2, 31, 32, 33, 127, 128, 129, 512, 1000, 4096, 7168}) {
    for (uint32_t k = 0; k < 3; ++k) {
      const auto x = bf16_products(n, kSeed + k);
      const double s = exact_sum(x), b = sum_error_bound(n, abs_sum(x), AccumulationModel::fp32());
      for (const auto& [name, sum] : orders) {
        const double err = std::fabs(static_cast<double>(sum(x)) - s);
        EXPECT_LE(err, b) << name << " n = " << n << " seed " << kSeed + k;
        if (b > 0) worst = std::max(worst, err / b);
      }
    }
  }
  std::printf("largest fraction of the bound used by a random sum: %.3g\n", worst);
}

// Each add rounds up by almost half a spacing: the error grows by nearly u per term, the bound's own rate.
TEST(SumBound, AnAdversarialFp32SumUsesNearlyAllOfItsBoundSoHalfTheBoundFailsALegitimateSum) {
  for (int64_t n : {2, 129, 4096}) {
    std::vector<float> x(static_cast<size_t>(n), std::ldexp(1.f + 0x1p-10f, -24));
    x[0] = 1.f;
    const double err = std::fabs(static_cast<double>(forward(x)) - exact_sum(x));
    const double b = sum_error_bound(n, abs_sum(x), AccumulationModel::fp32());
    std::printf("n = %lld: error %.4g, bound %.4g (%.4f of it)\n", static_cast<long long>(n), err, b, err / b);
    EXPECT_LE(err, b);
    EXPECT_GT(err, 0.99 * b) << n;
  }
}

TEST(SumBound, ATensorCoreAccumulatorLiesWithinItsModelAndOutsideTheFp32One) {
  const AccumulationModel tc = AccumulationModel::tensor_core(14, 128);
  EXPECT_EQ(tc.name(), "tensor-core(14 bits, 128)");
  bool outside_fp32 = false;
  for (int64_t n : {1, 127, 128, 129, 1000, 7168}) {
    for (uint32_t k = 0; k < 3; ++k) {
      const auto x = bf16_products(n, kSeed + 10 + k);
      const double s = exact_sum(x), a = abs_sum(x);
      const double err = std::fabs(static_cast<double>(tensor_core(x, 14, 128)) - s);
      EXPECT_LE(err, sum_error_bound(n, a, tc)) << "n = " << n;
      outside_fp32 |= err > sum_error_bound(n, a, AccumulationModel::fp32());
    }
  }
  EXPECT_TRUE(outside_fp32) << "a 14-bit accumulator never left the fp32 bound: the model would not matter";
}

TEST(SumBound, InexactFp32ProductsWidenTheBoundByTheirRounding) {
  const double exact = sum_error_bound(100, 1.0, AccumulationModel::fp32(), true);
  const double rounded = sum_error_bound(100, 1.0, AccumulationModel::fp32(), false);
  EXPECT_GT(rounded, exact);
  EXPECT_NEAR(rounded, exact + 0x1p-24, 1e-12);
  EXPECT_EQ(sum_error_bound(1, 5.0, AccumulationModel::fp32()), 0.0);  // one exact term: no rounding
  EXPECT_EQ(sum_error_bound(0, 0.0, AccumulationModel::fp32()), 0.0);
}

TEST(SumBound, AdmissibleResultsAreBothRoundingsOfAnIntervalThatStraddlesABoundary) {
  // 1 + 2^-8 is the midpoint between bf16's 1 and 1 + 2^-7: any error admits both.
  const Interval i = admissible(1.0 + 0x1p-8, 1e-6, 0, 8);
  EXPECT_TRUE(i.contains(1.0));
  EXPECT_TRUE(i.contains(1.0 + 0x1p-7));
  EXPECT_FALSE(i.contains(1.0 + 0x1p-6));
  EXPECT_FALSE(i.contains(1.0 - 0x1p-8));
  // An exact bf16 value with no error admits itself alone.
  const Interval e = admissible(-1.5, 0, 0, 8);
  EXPECT_EQ(e.lo, -1.5);
  EXPECT_EQ(e.hi, -1.5);
}

TEST(SumBound, ImpossibleModelsAndBoundsAreRefused) {
  EXPECT_THROW(gamma(1 << 24, 0x1p-24), ced::InputError);
  EXPECT_THROW(AccumulationModel::tensor_core(1, 128), ced::InputError);
  EXPECT_THROW(AccumulationModel::tensor_core(14, 0), ced::InputError);
  EXPECT_THROW(sum_error_bound(3, -1.0, AccumulationModel::fp32()), ced::InputError);
  EXPECT_THROW(sum_error_bound(-1, 1.0, AccumulationModel::fp32()), ced::InputError);
  // The message names k, then u.
  try {
    gamma(1 << 24, 0x1p-24);
  } catch (const ced::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("gamma(16777216, 5.96"), std::string::npos) << e.what();
  }
}

// The tensor-core bound as derived (docs/sound-bounds.md §3): a chunk's error γ_c(u_a) plus the fp32 sum of
// the chunks' partials, each as large as (1 + γ_c(u_a)) times its terms.
TEST(SumBound, TheTensorCoreBoundIsItsDerivationTermForTerm) {
  const double ua = 0x1p-13, inner = gamma(128, ua);
  EXPECT_DOUBLE_EQ(sum_error_bound(512, 1.0, AccumulationModel::tensor_core(14, 128)),
                   inner + gamma(3, 0x1p-24) * (1 + inner));
}

}  // namespace
