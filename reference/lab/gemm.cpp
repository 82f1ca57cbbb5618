// docs/spec.md §3.9: the order-preserving product, its ISA paths and the
// run-time choice between them.
#include "reference/lab/gemm.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "model/error.hpp"

#pragma GCC push_options
#pragma GCC target("sse2")
#define CED_GEMM_NS sse2
#define CED_GEMM_ROWS 4
#define CED_GEMM_SHORT_ROWS 4
#define CED_GEMM_VECTORS 2
#define CED_GEMM_BYTES 16
#include "reference/lab/gemm_isa.inc"
#undef CED_GEMM_NS
#undef CED_GEMM_BYTES
#undef CED_GEMM_ROWS
#undef CED_GEMM_SHORT_ROWS
#undef CED_GEMM_VECTORS
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2")
#define CED_GEMM_NS avx2
#define CED_GEMM_ROWS 4
#define CED_GEMM_SHORT_ROWS 4
#define CED_GEMM_VECTORS 2
#define CED_GEMM_BYTES 32
#include "reference/lab/gemm_isa.inc"
#undef CED_GEMM_NS
#undef CED_GEMM_BYTES
#undef CED_GEMM_ROWS
#undef CED_GEMM_SHORT_ROWS
#undef CED_GEMM_VECTORS
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
// A tall tile of 16 rows x 1 vector: each 64-byte row of the W strip loaded
// per k serves 16 rows, and the 256-deep strip (16 KiB) stays in L1 while the
// X panel streams from L2. A short one of 8 rows serves products of few rows
// (attention's 8 heads). Measured on an AMD EPYC (Zen 4, one core, the bench
// layer shapes): 8 rows 39-45 GFLOP/s in f64, 16 rows 42-50, on a par with
// the system dgemm with FMA (0.92-1.06x of it, docs/results/reference-speed-bench.md).
#define CED_GEMM_NS avx512
#define CED_GEMM_ROWS 16
#define CED_GEMM_SHORT_ROWS 8
#define CED_GEMM_VECTORS 1
#define CED_GEMM_BYTES 64
#include "reference/lab/gemm_isa.inc"
#undef CED_GEMM_NS
#undef CED_GEMM_BYTES
#undef CED_GEMM_ROWS
#undef CED_GEMM_SHORT_ROWS
#undef CED_GEMM_VECTORS
#pragma GCC pop_options

namespace ced::ref::gemm {
namespace {

// The definition of the order (docs/spec.md §3.9), one element after another.
template <class T, Plant P>
void naive(const Operands<T>& o, bool parallel, int64_t /*packed_bytes: no blocks*/) {
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < o.n; ++i)
    for (int64_t j = 0; j < o.m; ++j) {
      T s = o.accumulate ? o.Y[i * o.ldy + j] : T(0);
      for (int64_t step = 0; step < o.k; ++step) {
        const int64_t kk = P == Plant::PanelsDescending ? o.k - 1 - step : step;
        const T x = o.X[i * o.ldx + kk], w = o.W[kk * o.ldw + j];
        if constexpr (P == Plant::Fused) s = std::fma(x, w, s);
        else s += x * w;
      }
      o.Y[i * o.ldy + j] = s;
    }
}

template <class T>
using Fn = void (*)(const Operands<T>&, bool, int64_t);

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
void gemm_with(Isa isa, Plant plant, const Operands<T>& o, bool parallel, int64_t packed_bytes) {
  if (o.n <= 0 || o.m <= 0) return;
  if (o.k <= 0) {
    if (!o.accumulate)
      for (int64_t i = 0; i < o.n; ++i) std::fill(o.Y + i * o.ldy, o.Y + i * o.ldy + o.m, T(0));
    return;
  }
  Fn<T> f = plant == Plant::Fused ? pick<T, Plant::Fused>(isa)
            : plant == Plant::PanelsDescending ? pick<T, Plant::PanelsDescending>(isa)
                                               : pick<T, Plant::None>(isa);
  f(o, parallel, packed_bytes);
}

template <class T>
void gemm(const Operands<T>& o, bool parallel) {
  gemm_with(active_isa(), Plant::None, o, parallel, kPackedBytes);
}

template <class T>
void transpose_rows(const T* const* rows, int64_t count, int64_t dim, T* columns, int64_t ld) {
  switch (active_isa()) {
    case Isa::Naive:
      for (int64_t x = 0; x < dim; ++x)
        for (int64_t e = 0; e < count; ++e) columns[x * ld + e] = rows[e][x];
      return;
    case Isa::Sse2: return sse2::transpose_rows(rows, count, dim, columns, ld);
    case Isa::Avx2: return avx2::transpose_rows(rows, count, dim, columns, ld);
    case Isa::Avx512: return avx512::transpose_rows(rows, count, dim, columns, ld);
  }
}

template void transpose_rows<float>(const float* const*, int64_t, int64_t, float*, int64_t);
template void transpose_rows<double>(const double* const*, int64_t, int64_t, double*, int64_t);
template void gemm_with<float>(Isa, Plant, const Operands<float>&, bool, int64_t);
template void gemm_with<double>(Isa, Plant, const Operands<double>&, bool, int64_t);
template void gemm<float>(const Operands<float>&, bool);
template void gemm<double>(const Operands<double>&, bool);

}  // namespace ced::ref::gemm
