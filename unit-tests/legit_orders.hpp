#pragma once
// Legitimate implementations nobody tuned the bounds to (docs/sound-bounds.md §8): fp32 sums in several
// orders, a truncating narrow accumulator, and RMSNorms written the ways libraries write them. The
// soundness tests judge each against the admissible results of compare/op_bounds.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace ced::testing {

inline float bf16(float x) {  // round to nearest even, to bf16's 8 significant bits
  uint32_t b = std::bit_cast<uint32_t>(x);
  b += 0x7fff + ((b >> 16) & 1);
  return std::bit_cast<float>(b & 0xffff0000u);
}

// Random bf16 values spread over four binades, signs mixed.
inline std::vector<double> random_bf16(size_t n, std::mt19937& g, double scale = 1) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = bf16(static_cast<float>(scale * u(g) * std::ldexp(1.0, static_cast<int>(g() % 4))));
  return v;
}

// A dot product of n terms in fp32, in one legitimate order.
using Sum = std::function<float(const std::vector<float>&)>;

inline float forward(const std::vector<float>& p) {
  float s = 0;
  for (float t : p) s += t;
  return s;
}
inline float reversed(const std::vector<float>& p) {
  float s = 0;
  for (size_t i = p.size(); i-- > 0;) s += p[i];
  return s;
}
inline float pairwise_of(const float* p, size_t n) {
  if (n == 1) return p[0];
  return pairwise_of(p, n / 2) + pairwise_of(p + n / 2, n - n / 2);
}
inline float pairwise(const std::vector<float>& p) { return p.empty() ? 0.0f : pairwise_of(p.data(), p.size()); }
inline float lanes8(const std::vector<float>& p) {  // a vector unit's 8 accumulators, then their sum
  float acc[8] = {};
  for (size_t i = 0; i < p.size(); ++i) acc[i % 8] += p[i];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}
inline float blocked64(const std::vector<float>& p) {  // split-K: blocks of 64, each forward, then the partials
  float total = 0;
  for (size_t b = 0; b < p.size(); b += 64) {
    float s = 0;
    for (size_t i = b; i < std::min(p.size(), b + 64); ++i) s += p[i];
    total += s;
  }
  return total;
}

// A narrow accumulator of `bits` significant bits that truncates, promoted to fp32 every `chunk` terms.
inline float truncate_to(float x, int bits) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  return std::bit_cast<float>(b & ~((1u << (24 - bits)) - 1));
}
inline float tensor_core(const std::vector<float>& p, int bits, size_t chunk) {
  float total = 0;
  for (size_t b = 0; b < p.size(); b += chunk) {
    float acc = 0;
    for (size_t i = b; i < std::min(p.size(), b + chunk); ++i) acc = truncate_to(acc + truncate_to(p[i], bits), bits);
    total += acc;
  }
  return total;
}

// y = x·wᵀ with a given order for every output.
inline std::vector<double> linear_with(const Sum& sum, const std::vector<double>& x, int64_t M, int64_t K,
                                const std::vector<double>& w, int64_t Nout) {
  std::vector<double> y(static_cast<size_t>(M * Nout));
  std::vector<float> p(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < Nout; ++j) {
      for (int64_t k = 0; k < K; ++k)
        p[static_cast<size_t>(k)] = static_cast<float>(x[static_cast<size_t>(m * K + k)] * w[static_cast<size_t>(j * K + k)]);
      y[static_cast<size_t>(m * Nout + j)] = sum(p);
    }
  return y;
}

// An RMSNorm as some implementation writes it: the sum of squares' order, how the mean and eps are
// formed, the reciprocal square root, and the order of the two products.
struct Rms {
  const char* name;
  Sum sum;
  bool mean_by_reciprocal;  // ss · fp32(1/n) instead of ss / n
  bool eps_in_f64;          // (mean + eps) in f64, then rounded, instead of eps rounded to fp32 first
  int rsqrt;                // 0: 1/sqrtf (torch's CPU), 1: correctly rounded, 2: two ulps high (CUDA's bound), 3: x / sqrtf
  bool weight_first;        // (w·x)·r instead of w·(x·r)
};

inline std::vector<double> rmsnorm_with(const Rms& f, const std::vector<double>& x, int64_t n, const std::vector<double>& w,
                                 double eps, bool cast) {
  std::vector<double> y(x.size());
  std::vector<float> sq(static_cast<size_t>(n));
  for (size_t r = 0; r < x.size() / static_cast<size_t>(n); ++r) {
    const double* row = x.data() + r * static_cast<size_t>(n);
    for (int64_t i = 0; i < n; ++i) sq[static_cast<size_t>(i)] = static_cast<float>(row[i]) * static_cast<float>(row[i]);
    const float ss = f.sum(sq);
    const float mean = f.mean_by_reciprocal ? ss * (1.0f / static_cast<float>(n)) : ss / static_cast<float>(n);
    const float t = f.eps_in_f64 ? static_cast<float>(static_cast<double>(mean) + eps) : mean + static_cast<float>(eps);
    float rs = 1.0f / std::sqrt(t);
    if (f.rsqrt == 1) rs = static_cast<float>(1 / std::sqrt(static_cast<double>(t)));
    if (f.rsqrt == 2) rs = std::nextafter(std::nextafter(static_cast<float>(1 / std::sqrt(static_cast<double>(t))), 2.0f), 2.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float xi = static_cast<float>(row[i]), wi = static_cast<float>(w[static_cast<size_t>(i)]);
      float v = f.rsqrt == 3 ? wi * (xi / std::sqrt(t)) : f.weight_first ? (wi * xi) * rs : wi * (xi * rs);
      y[r * static_cast<size_t>(n) + static_cast<size_t>(i)] = cast ? bf16(v) : v;
    }
  }
  return y;
}

inline const std::vector<Rms> kRmsImplementations{
    {"torch cpu", forward, false, false, 0, false},
    {"reversed, exact rsqrt, weight first", reversed, false, false, 1, true},
    {"pairwise, eps in f64, rsqrt 2 ulps high", pairwise, false, true, 2, false},
    {"8 lanes, 1/n, a division", lanes8, true, false, 3, false},
    {"blocked 64, 1/n, eps in f64, weight first", blocked64, true, true, 0, true},
};

}  // namespace ced::testing
