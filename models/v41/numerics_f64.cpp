// docs/v41.md §3.8: the quantize-dequantize functions in double, the f64 regime's quantization
// points. The grids and tie rules are §2.2 and §2.4's; only the arithmetic around them is double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "models/v41/numerics.hpp"

namespace ced::v41 {
namespace {

// v rounded to a multiple of step (a power of two, so v / step is exact), ties to even.
double round_to_step(double v, double step) { return std::nearbyint(v / step) * step; }

double block_amax(const double* x, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(x[i]);
    if (std::isnan(a)) return a;
    m = std::max(m, a);
  }
  return m;
}

int64_t rows_of(size_t n, int64_t K, int64_t block, const char* fn) {
  if (K <= 0 || K % block != 0 || n % static_cast<size_t>(K) != 0)
    throw std::invalid_argument(std::string("v41 ") + fn + ": " + std::to_string(n) +
                                " values are not whole rows of K = " + std::to_string(K) + " (a multiple of " +
                                std::to_string(block) + ")");
  return static_cast<int64_t>(n / static_cast<size_t>(K));
}

// torch's clamp_min: NaN stays NaN.
double floor_at(double amax, double floor) { return std::isnan(amax) ? amax : std::max(amax, floor); }

}  // namespace

double e4m3_round_f64(double v) {
  if (std::isnan(v)) return v;
  const double m = std::min(std::fabs(v), 448.0);
  int e = 0;
  std::frexp(m, &e);  // m = f · 2^e, f in [0.5, 1): the binade [2^(e-1), 2^e)
  const double step = m < 0x1p-6 ? 0x1p-9 : std::ldexp(1.0, e - 1 - 3);
  return std::copysign(std::min(round_to_step(m, step), 448.0), v);
}

double e2m1_round_f64(double v) {
  if (std::isnan(v)) return std::copysign(0.0, v);
  const double m = std::min(std::fabs(v), 6.0);
  // codes 0..4 are the multiples of 0.5 up to 2, 4..6 those of 1 up to 4, 6..7 those of 2 up to 6;
  // a tie between two codes is a tie between two multiples, and nearbyint's even multiple is the even code.
  const double step = m < 2.0 ? 0.5 : (m < 4.0 ? 1.0 : 2.0);
  return std::copysign(round_to_step(m, step), v);
}

double ue8m0_scale_f64(double amax, double max_inv) {
  int e = 0;
  const double f = std::frexp(amax * max_inv, &e);  // p = f · 2^e
  return std::ldexp(1.0, f == 0.5 ? e - 1 : e);     // 2^ceil(log2 p)
}

void act_qdq_f64(std::span<double> x, int64_t K) {
  const int64_t rows = rows_of(x.size(), K, kFp8Block, "act_qdq_f64");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < K; b += kFp8Block) {
      double* p = x.data() + r * K + b;
      const double s = ue8m0_scale_f64(floor_at(block_amax(p, kFp8Block), 1e-4), 1.0 / 448.0);
      for (int64_t i = 0; i < kFp8Block; ++i) p[i] = e4m3_round_f64(p[i] / s) * s;
    }
}

void fp4_qdq_ue8m0_32_f64(std::span<double> x, int64_t K) {
  const int64_t rows = rows_of(x.size(), K, kFp4Block, "fp4_qdq_ue8m0_32_f64");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < K; b += kFp4Block) {
      double* p = x.data() + r * K + b;
      const double s = ue8m0_scale_f64(floor_at(block_amax(p, kFp4Block), 6.0 * 0x1p-126), 1.0 / 6.0);
      for (int64_t i = 0; i < kFp4Block; ++i) p[i] = e2m1_round_f64(std::clamp(p[i] / s, -6.0, 6.0)) * s;
    }
}

void fp4_qdq_e4m3_16_f64(std::span<double> x, int64_t K) {
  const int64_t rows = rows_of(x.size(), K, kFp4KvBlock, "fp4_qdq_e4m3_16_f64");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < K; b += kFp4KvBlock) {
      double* p = x.data() + r * K + b;
      const double s = e4m3_round_f64(floor_at(block_amax(p, kFp4KvBlock), 6.0 * 0x1p-9) / 6.0);
      for (int64_t i = 0; i < kFp4KvBlock; ++i) p[i] = e2m1_round_f64(std::clamp(p[i] / s, -6.0, 6.0)) * s;
    }
}

}  // namespace ced::v41
