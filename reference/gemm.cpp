// docs/spec.md §3.9: the order-preserving product, its ISA paths and the
// run-time choice between them.
#include "reference/gemm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "model/error.hpp"

#pragma GCC push_options
#pragma GCC target("sse2")
#define CED_GEMM_NS sse2
#define CED_GEMM_ROWS 4
#define CED_GEMM_VECTORS 2
#define CED_GEMM_BYTES 16
#include "reference/gemm_isa.inc"
#undef CED_GEMM_NS
#undef CED_GEMM_BYTES
#undef CED_GEMM_ROWS
#undef CED_GEMM_VECTORS
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2")
#define CED_GEMM_NS avx2
#define CED_GEMM_ROWS 4
#define CED_GEMM_VECTORS 2
#define CED_GEMM_BYTES 32
#include "reference/gemm_isa.inc"
#undef CED_GEMM_NS
#undef CED_GEMM_BYTES
#undef CED_GEMM_ROWS
#undef CED_GEMM_VECTORS
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
// 8 rows x 1 vector: one 64-byte row of the W strip per k, so a 256-deep strip
// (16 KiB) stays in a 32 KiB L1 beside the X panel; the 4 x 2 tile of the
// narrower paths streams 32 KiB strips from L2. Measured on an AMD EPYC
// (Zen 4, bench/gemm_benchmark, one core): f64 35 -> 46 GFLOP/s, f32 70 -> 88.
#define CED_GEMM_NS avx512
#define CED_GEMM_ROWS 8
#define CED_GEMM_VECTORS 1
#define CED_GEMM_BYTES 64
#include "reference/gemm_isa.inc"
#undef CED_GEMM_NS
#undef CED_GEMM_BYTES
#undef CED_GEMM_ROWS
#undef CED_GEMM_VECTORS
#pragma GCC pop_options

namespace ced::ref::gemm {
namespace {

// The definition of the order (docs/spec.md §3.9), one element after another.
template <class T, Plant P>
void naive(const T* X, int64_t n, int64_t k, const T* W, int64_t m, T* Y, bool parallel) {
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      T s = 0;
      for (int64_t step = 0; step < k; ++step) {
        const int64_t kk = P == Plant::PanelsDescending ? k - 1 - step : step;
        if constexpr (P == Plant::Fused) s = std::fma(X[i * k + kk], W[kk * m + j], s);
        else s += X[i * k + kk] * W[kk * m + j];
      }
      Y[i * m + j] = s;
    }
}

template <class T>
using Fn = void (*)(const T*, int64_t, int64_t, const T*, int64_t, T*, bool);

template <class T, Plant P>
Fn<T> pick(Isa isa) {
  switch (isa) {
    case Isa::Naive: return naive<T, P>;
    case Isa::Sse2: return sse2::product<T, P>;
    case Isa::Avx2: return avx2::product<T, P>;
    case Isa::Avx512: return avx512::product<T, P>;
  }
  return naive<T, P>;
}

constexpr Isa kAll[] = {Isa::Naive, Isa::Sse2, Isa::Avx2, Isa::Avx512};

// -1: not chosen yet; otherwise an Isa.
std::atomic<int> g_active{-1};

Isa widest() {
  Isa best = Isa::Naive;
  for (Isa i : kAll)
    if (isa_supported(i)) best = i;
  return best;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Naive: return "naive";
    case Isa::Sse2: return "sse2";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

std::optional<Isa> parse_isa(const std::string& name) {
  for (Isa i : kAll)
    if (name == isa_name(i)) return i;
  return std::nullopt;
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Naive: return true;
    case Isa::Sse2: return __builtin_cpu_supports("sse2");
    case Isa::Avx2: return __builtin_cpu_supports("avx2");
    case Isa::Avx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa i : kAll)
    if (isa_supported(i)) out.push_back(i);
  return out;
}

void force_isa(std::optional<Isa> isa) {
  if (isa && !isa_supported(*isa))
    throw InputError(fmt::format("gemm: this CPU does not run the {} path", isa_name(*isa)));
  g_active.store(isa ? int(*isa) : -1);
}

Isa active_isa() {
  const int a = g_active.load();
  if (a >= 0) return Isa(a);
  Isa chosen = widest();
  if (const char* env = std::getenv("CED_GEMM_ISA"); env && *env) {
    const auto named = parse_isa(env);
    if (!named) throw InputError(fmt::format("CED_GEMM_ISA={}: not one of naive, sse2, avx2, avx512", env));
    if (!isa_supported(*named)) throw InputError(fmt::format("CED_GEMM_ISA={}: this CPU does not run it", env));
    chosen = *named;
  }
  g_active.store(int(chosen));
  return chosen;
}

template <class T>
void gemm_with(Isa isa, Plant plant, const T* X, int64_t n, int64_t k, const T* W, int64_t m, T* Y, bool parallel) {
  if (n <= 0 || m <= 0) return;
  if (k <= 0) {
    std::fill(Y, Y + n * m, T(0));
    return;
  }
  Fn<T> f = plant == Plant::Fused ? pick<T, Plant::Fused>(isa)
            : plant == Plant::PanelsDescending ? pick<T, Plant::PanelsDescending>(isa)
                                               : pick<T, Plant::None>(isa);
  f(X, n, k, W, m, Y, parallel);
}

template <class T>
void gemm(const T* X, int64_t n, int64_t k, const T* W, int64_t m, T* Y, bool parallel) {
  gemm_with(active_isa(), Plant::None, X, n, k, W, m, Y, parallel);
}

template void gemm_with<float>(Isa, Plant, const float*, int64_t, int64_t, const float*, int64_t, float*, bool);
template void gemm_with<double>(Isa, Plant, const double*, int64_t, int64_t, const double*, int64_t, double*, bool);
template void gemm<float>(const float*, int64_t, int64_t, const float*, int64_t, float*, bool);
template void gemm<double>(const double*, int64_t, int64_t, const double*, int64_t, double*, bool);

}  // namespace ced::ref::gemm
