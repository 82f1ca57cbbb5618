// docs/v41.md §8: linear, RMSNorm, RoPE/YaRN, the quantization points and torch's top-k.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <utility>

#include <immintrin.h>  // declares the AVX-512 builtins
#include <omp.h>

#include "reference/v41/forward_ops.hpp"
#include "reference/v41/lanes.hpp"

namespace ced::v41::fwd {

namespace {

// The linear kernels (lanes.hpp): a lane is one output column, a register block kRows rows. The
// weights are packed in column blocks of kPack lanes (64 bytes), which the AVX-512 kernels read as
// one vector and the others as two; a kernel of Bytes-wide vectors (VecB) runs Cols vectors of
// columns side by side, vector j at column j · lanes. Each output is its own sum whatever the
// width, so the width changes only how many outputs are computed at once.
constexpr int64_t kRows = 4;    // rows per register block (x rows are padded to a multiple)
constexpr int64_t kPanel = 64;  // rows per parallel work item at most: a weight column block is reused across them
template <typename T>
constexpr int64_t kPack = 64 / sizeof(T);
template <typename T, int64_t Bytes>
using VecB [[gnu::vector_size(Bytes)]] = T;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Where vector j of a run of column blocks starts at row k of a [rows, kPack] block layout (the
// blocks rows · kPack apart).
template <typename T, int64_t Bytes>
constexpr int64_t vector_at(int64_t j, int64_t k, int64_t rows) {
  constexpr int64_t L = Bytes / sizeof(T), per_block = kPack<T> / L;
  return (j / per_block) * rows * kPack<T> + k * kPack<T> + (j % per_block) * L;
}

// acc + x · w in one rounding (AVX-512's fused multiply-add), for products that are exact: then the
// same bits as the product rounded and then the sum. A release code's value times another's is
// exact (at most 8 significant bits, the exponents well inside fp32's normal range). The builtin
// is expanded only where this is inlined, into AVX-512 code (hence no intrinsic, whose own target
// would not inline into the templates; and no ABI concern, as nothing is passed by value).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
[[gnu::always_inline]] inline void fused_add(VecB<float, 64>& acc, float x, const VecB<float, 64>& w) {
  VecB<float, 64> xb;
  for (int64_t l = 0; l < 16; ++l) xb[l] = x;
#if defined(__clang__)
  // clang checks the builtin's target feature on this function, not where it is inlined: the libFuzzer
  // build (clang) takes the fused multiply-add a lane at a time, the same single rounding.
  for (int64_t l = 0; l < 16; ++l) acc[l] = std::fma(xb[l], w[l], acc[l]);
#else
  acc = __builtin_ia32_vfmaddps512_mask(xb, w, acc, static_cast<__mmask16>(0xFFFF), _MM_FROUND_CUR_DIRECTION);
#endif
}
#pragma GCC diagnostic pop

// acc[j][r] += x[r, k] · wt[k, lane] for k in [k0, k1), in k order, for the kRows rows at x (K apart)
// and Cols vectors of columns (Cols · kRows sums in flight); wt [K, kPack] per column block. Fused:
// in one rounding (fused_add), for exact products.
template <typename T, int64_t Bytes, int64_t Cols, bool Fused = false>
[[gnu::always_inline]] inline void accumulate_block(const T* x, int64_t K, const T* wt, int64_t k0, int64_t k1,
                                                    VecB<T, Bytes> (&acc)[Cols][kRows]) {
  for (int64_t k = k0; k < k1; ++k)
#pragma GCC unroll 2
    for (int64_t j = 0; j < Cols; ++j) {
      VecB<T, Bytes> w;
      std::memcpy(&w, wt + vector_at<T, Bytes>(j, k, K), sizeof w);
#pragma GCC unroll 4
      for (int64_t r = 0; r < kRows; ++r) {
        if constexpr (Fused)
          fused_add(acc[j][r], x[r * K + k], w);
        else
          acc[j][r] = acc[j][r] + x[r * K + k] * w;
      }
    }
}

// The Cols · kRows sums into y, its rows np apart.
template <typename T, int64_t Bytes, int64_t Cols>
[[gnu::always_inline]] inline void store_block(const VecB<T, Bytes> (&acc)[Cols][kRows], int64_t np, T* y) {
  constexpr int64_t L = Bytes / sizeof(T);
  for (int64_t j = 0; j < Cols; ++j)
    for (int64_t r = 0; r < kRows; ++r) std::memcpy(y + r * np + j * L, &acc[j][r], sizeof acc[j][r]);
}

// y[r, lane] = Σ_k x[r, k] · wt[k, lane] for the kRows rows at x and Cols vectors of columns, in k
// order; y rows np apart.
template <typename T, int64_t Bytes, int64_t Cols>
[[gnu::always_inline]] inline void dot_block(const T* x, int64_t K, const T* wt, int64_t np, T* y) {
  VecB<T, Bytes> acc[Cols][kRows] = {};
  accumulate_block<T, Bytes, Cols>(x, K, wt, 0, K, acc);
  store_block<T, Bytes, Cols>(acc, np, y);
}

// The release's block-scaled product for kRows rows and Cols vectors of columns: per 32-block b of
// K, part = Σ_block ac·wc (in k order; the products of codes' values are exact, so AVX-512 fuses
// them into the sum), then acc += (part · xs[r, b]) · ws[b, lane], in b order; wc [K, kPack] and
// ws [K / 32, kPack] per column block; y rows np apart.
template <int64_t Bytes, int64_t Cols>
[[gnu::always_inline]] inline void block_scaled_block(const float* ac, const float* xs, int64_t K, const float* wc,
                                                      const float* ws, int64_t np, float* y) {
  const int64_t nb = K / kFp8Block;
  VecB<float, Bytes> acc[Cols][kRows] = {};
  for (int64_t b = 0; b < nb; ++b) {
    VecB<float, Bytes> part[Cols][kRows] = {};
    accumulate_block<float, Bytes, Cols, Bytes == 64>(ac, K, wc, b * kFp8Block, (b + 1) * kFp8Block, part);
#pragma GCC unroll 2
    for (int64_t j = 0; j < Cols; ++j) {
      VecB<float, Bytes> s;
      std::memcpy(&s, ws + vector_at<float, Bytes>(j, b, nb), sizeof s);
#pragma GCC unroll 4
      for (int64_t r = 0; r < kRows; ++r) acc[j][r] = acc[j][r] + (part[j][r] * xs[r * nb + b]) * s;
    }
  }
  store_block<float, Bytes, Cols>(acc, np, y);
}

// One panel of rows [m0, m1) (a multiple of kRows) over every column block, two vectors of columns
// at a time (one at the end when a single one is left: AVX-512 on an odd number of blocks).
template <typename T, int64_t Bytes>
[[gnu::always_inline]] inline void dot_panel(const T* x, int64_t m0, int64_t m1, int64_t K, const T* wt, int64_t np,
                                             T* y) {
  constexpr int64_t L = Bytes / sizeof(T);
  for (int64_t o = 0; o < np; o += 2 * L)
    for (int64_t m = m0; m < m1; m += kRows) {
      if (o + L < np)
        dot_block<T, Bytes, 2>(x + m * K, K, wt + o * K, np, y + m * np + o);
      else
        dot_block<T, Bytes, 1>(x + m * K, K, wt + o * K, np, y + m * np + o);
    }
}
template <int64_t Bytes>
[[gnu::always_inline]] inline void block_scaled_panel(const float* ac, const float* xs, int64_t m0, int64_t m1,
                                                      int64_t K, const float* wc, const float* ws, int64_t np,
                                                      float* y) {
  constexpr int64_t L = Bytes / sizeof(float);
  const int64_t nb = K / kFp8Block;
  for (int64_t o = 0; o < np; o += 2 * L)
    for (int64_t m = m0; m < m1; m += kRows) {
      const float *a = ac + m * K, *s = xs + m * nb, *w = wc + o * K, *v = ws + o * nb;
      if (o + L < np)
        block_scaled_block<Bytes, 2>(a, s, K, w, v, np, y + m * np + o);
      else
        block_scaled_block<Bytes, 1>(a, s, K, w, v, np, y + m * np + o);
    }
}

// The entry points: 64-byte vectors for AVX-512 (where the CPU has it, has_avx512), else the 32-byte
// ones (V41_KERNEL: compiled for AVX2 and the baseline, chosen at load). The OpenMP loop stays
// outside, as its outlined body would not be cloned.
bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
#define V41_KERNEL_512 [[gnu::target("avx512f")]]
V41_KERNEL void dot_panel_t(const float* x, int64_t m0, int64_t m1, int64_t K, const float* wt, int64_t np,
                            float* y) {
  dot_panel<float, 32>(x, m0, m1, K, wt, np, y);
}
V41_KERNEL void dot_panel_t(const double* x, int64_t m0, int64_t m1, int64_t K, const double* wt, int64_t np,
                            double* y) {
  dot_panel<double, 32>(x, m0, m1, K, wt, np, y);
}
template <typename T>
V41_KERNEL_512 void dot_panel_512(const T* x, int64_t m0, int64_t m1, int64_t K, const T* wt, int64_t np, T* y) {
  dot_panel<T, 64>(x, m0, m1, K, wt, np, y);
}
V41_KERNEL void block_scaled_panel_t(const float* ac, const float* xs, int64_t m0, int64_t m1, int64_t K,
                                     const float* wc, const float* ws, int64_t np, float* y) {
  block_scaled_panel<32>(ac, xs, m0, m1, K, wc, ws, np, y);
}
V41_KERNEL_512 void block_scaled_panel_512(const float* ac, const float* xs, int64_t m0, int64_t m1, int64_t K,
                                           const float* wc, const float* ws, int64_t np, float* y) {
  block_scaled_panel<64>(ac, xs, m0, m1, K, wc, ws, np, y);
}

// Runs panel(m0, m1) over the padded rows Mp in panels of at most kPanel rows (fewer when that
// leaves a thread idle), one thread per panel, in parallel past kParallelWork. The panel
// size changes only which rows share a pass over the weights, never an output's value.
template <typename Panel>
void for_panels(int64_t Mp, int64_t work, Panel panel) {
  const int64_t threads = work > kParallelWork ? omp_get_max_threads() : 1;
  const int64_t size = std::min(kPanel, round_up((Mp + threads - 1) / threads, kRows));
  const int64_t panels = (Mp + size - 1) / size;
#pragma omp parallel for schedule(static) if (work > kParallelWork)
  for (int64_t p = 0; p < panels; ++p) panel(p * size, std::min(Mp, (p + 1) * size));
}

// Rows [M, K] as T, padded with zero rows to a multiple of kRows (the padding rows are dropped).
template <typename T>
std::vector<T> padded_rows(std::span<const double> X, int64_t M, int64_t K) {
  std::vector<T> x(static_cast<size_t>(round_up(M, kRows) * K), T(0));
  std::copy_n(X.begin(), M * K, x.begin());
  return x;
}

// Where (k, o) of a [K, np] matrix lies in the packed layout: column blocks of kPack lanes, each
// [K, kPack] contiguous, so that a kernel reads its block's weights in one stream.
template <typename T>
size_t packed_at(int64_t k, int64_t o, int64_t K) {
  const int64_t lane = o % kPack<T>;
  return static_cast<size_t>((o - lane) * K + k * kPack<T> + lane);
}

// W [Nout, K] as T, transposed and packed (zero columns past Nout).
template <typename T>
std::vector<T> transposed(std::span<const double> W, int64_t Nout, int64_t K, int64_t np) {
  std::vector<T> t(static_cast<size_t>(K * np), T(0));
  for (int64_t o = 0; o < Nout; ++o)
    for (int64_t k = 0; k < K; ++k) t[packed_at<T>(k, o, K)] = static_cast<T>(W[static_cast<size_t>(o * K + k)]);
  return t;
}

V41Linear::Packed pack_plain(const Arith& a, std::span<const double> W, int64_t Nout, int64_t K) {
  V41Linear::Packed p;
  p.f64 = !a.emulate;
  p.np = round_up(Nout, p.f64 ? kPack<double> : kPack<float>);
  if (p.f64)
    p.w64 = transposed<double>(W, Nout, K, p.np);
  else
    p.w32 = transposed<float>(W, Nout, K, p.np);
  return p;
}

// The release regime's FP8/FP4 linear: each weight's code value w / ws (exact: w is the code times
// a power of two, and the quotient is an FP8 or FP4 value, so fp32 holds it) and each (block, o)'s
// scale, transposed.
V41Linear::Packed pack_codes(const V41Linear& w) {
  const int64_t K = w.in, N = w.out, nb = K / kFp8Block, tiles_in = (K + 31) / 32;
  V41Linear::Packed p;
  p.codes = true;
  p.np = round_up(N, kPack<float>);
  p.w32.assign(static_cast<size_t>(K * p.np), 0.0f);
  p.scale.assign(static_cast<size_t>(nb * p.np), 0.0f);
  for (int64_t o = 0; o < N; ++o)
    for (int64_t b = 0; b < nb; ++b) {
      const double ws = w.kind == V41Linear::Kind::Fp8Tiles ? w.scale[static_cast<size_t>((o / 32) * tiles_in + b)]
                                                            : w.scale[static_cast<size_t>(o * nb + b)];
      p.scale[packed_at<float>(b, o, nb)] = static_cast<float>(ws);  // a power of two: exact
      for (int64_t k = b * kFp8Block; k < (b + 1) * kFp8Block; ++k)
        p.w32[packed_at<float>(k, o, K)] = static_cast<float>(w.w[static_cast<size_t>(o * K + k)] / ws);
    }
  return p;
}

// The scale act_quant and fp4_qdq_ue8m0_32 (numerics.hpp) give a 32-block of fp32 values v:
// ue8m0_scale(amax, max_inv) with the amax as they have it (a NaN in the block makes it a NaN, to
// which ue8m0_scale gives every NaN the same scale), floored at `floor`.
constexpr int64_t kBlockVecs = kFp8Block / kLanes<float>;
static_assert(kFp4Block == kFp8Block);
[[gnu::always_inline]] inline float block_scale(const Vec<float> (&v)[kBlockVecs], float floor, float max_inv) {
  using U = Vec<uint32_t>;
  Vec<float> m = {};
  U nan = {};
  for (int64_t i = 0; i < kBlockVecs; ++i) {
    U u;
    std::memcpy(&u, &v[i], sizeof u);
    u &= 0x7FFFFFFFu;
    nan |= (U)(u > 0x7F800000u);
    Vec<float> a;
    std::memcpy(&a, &u, sizeof a);
    m = a > m ? a : m;
  }
  float amax = 0.0f;
  bool any_nan = false;
  for (int64_t l = 0; l < kLanes<float>; ++l) {
    amax = std::max(amax, m[l]);
    any_nan = any_nan || nan[l] != 0;
  }
  if (any_nan) amax = std::numeric_limits<float>::quiet_NaN();
  else if (amax < floor) amax = floor;
  return ue8m0_scale(amax, max_inv);
}

// act_quant of `blocks` 32-blocks of bf16 values X as block_scaled_panel reads them: ac the values
// of the e4m3 codes of x / s (e4m3_value_lanes), xs the blocks' scales s.
V41_KERNEL void quantize_rows(const double* X, int64_t blocks, float* ac, float* xs) {
  constexpr int64_t L = kLanes<float>;
  for (int64_t b = 0; b < blocks; ++b) {
    Vec<float> v[kBlockVecs];
    for (int64_t i = 0; i < kBlockVecs; ++i) load_lanes<float>(v[i], X + b * kFp8Block + i * L);
    const float scale = block_scale(v, kFp8AmaxFloor, kFp8MaxInv);
    xs[b] = scale;
    for (int64_t i = 0; i < kBlockVecs; ++i) {
      Vec<float> q = v[i] / scale;
      e4m3_value_lanes(q);
      std::memcpy(ac + b * kFp8Block + i * L, &q, sizeof q);
    }
  }
}

// f32_from_e2m1(e2m1_from_f32(clamp_e2m1(x))) on lanes (numerics.cpp): |x| against the midpoints
// with the same tie rule, the sign of x (a NaN fails every test: ±0; past 6 the clamp changes
// nothing, as 6 is the code above 5 anyway).
[[gnu::always_inline]] inline void e2m1_value_lanes(Vec<float>& x) {
  using U = Vec<uint32_t>;
  U u;
  std::memcpy(&u, &x, sizeof u);
  const U sign = u & 0x80000000u, au = u & 0x7FFFFFFFu;
  Vec<float> a, v = {};
  std::memcpy(&a, &au, sizeof a);
  auto step = [&](auto above, float to) { v = above ? Vec<float>{} + to : v; };
  step(a > 0.25f, 0.5f);
  step(a >= 0.75f, 1.0f);
  step(a > 1.25f, 1.5f);
  step(a >= 1.75f, 2.0f);
  step(a > 2.5f, 3.0f);
  step(a >= 3.5f, 4.0f);
  step(a > 5.0f, 6.0f);
  std::memcpy(&u, &v, sizeof u);
  u |= sign;
  std::memcpy(&x, &u, sizeof x);
}

// act_qdq (FP8, e4m3 codes) and fp4_qdq_ue8m0_32 (FP4, e2m1 codes) of `blocks` 32-blocks of fp32
// values X in place: x = bf16(value(code of x / s) · s), s the block's scale.
template <bool Fp4>
[[gnu::always_inline]] inline void qdq_rows(double* X, int64_t blocks) {
  constexpr int64_t L = kLanes<float>;
  for (int64_t b = 0; b < blocks; ++b) {
    Vec<float> v[kBlockVecs];
    for (int64_t i = 0; i < kBlockVecs; ++i) load_lanes<float>(v[i], X + b * kFp8Block + i * L);
    const float scale = Fp4 ? block_scale(v, kFp4AmaxFloor, kFp4MaxInv) : block_scale(v, kFp8AmaxFloor, kFp8MaxInv);
    for (int64_t i = 0; i < kBlockVecs; ++i) {
      Vec<float> q = v[i] / scale;
      if constexpr (Fp4)
        e2m1_value_lanes(q);
      else
        e4m3_value_lanes(q);
      q = q * scale;
      bf_lanes<float>(q);
      store_lanes<float>(X + b * kFp8Block + i * L, q);
    }
  }
}
V41_KERNEL void fp8_qdq_rows(double* X, int64_t blocks) { qdq_rows<false>(X, blocks); }
V41_KERNEL void fp4_qdq_rows(double* X, int64_t blocks) { qdq_rows<true>(X, blocks); }

bool uses_codes(const Arith& a, const V41Linear& w) { return a.release && w.kind != V41Linear::Kind::Plain; }

V41Linear::Packed pack_for(const Arith& a, const V41Linear& w) {
  return uses_codes(a, w) ? pack_codes(w) : pack_plain(a, w.w, w.out, w.in);
}

bool packed_for(const Arith& a, const V41Linear& w) {
  const V41Linear::Packed& p = w.packed;
  return p.np > 0 && p.codes == uses_codes(a, w) && p.f64 == (!p.codes && !a.emulate);
}

// Y from the kernels' output y [Mp, np] (its padding dropped), a vector of columns at a time; T is
// float exactly when the regime emulates fp32, so bf_lanes and bf_of are Arith::bf.
template <typename T>
[[gnu::always_inline]] inline void write_rows(const T* y, int64_t M, int64_t Nout, int64_t np, double* Y,
                                              bool out_bf16) {
  constexpr int64_t L = kLanes<T>;
  for (int64_t m = 0; m < M; ++m) {
    const T* src = y + m * np;
    double* dst = Y + m * Nout;
    int64_t o = 0;
    for (; o + L <= Nout; o += L) {
      Vec<T> v;
      std::memcpy(&v, src + o, sizeof v);
      if (out_bf16) bf_lanes<T>(v);
      store_lanes<T>(dst + o, v);
    }
    for (; o < Nout; ++o) dst[o] = out_bf16 ? bf_of<T>(src[o]) : src[o];
  }
}
V41_KERNEL void write_rows_t(const float* y, int64_t M, int64_t Nout, int64_t np, double* Y, bool out_bf16) {
  write_rows(y, M, Nout, np, Y, out_bf16);
}
V41_KERNEL void write_rows_t(const double* y, int64_t M, int64_t Nout, int64_t np, double* Y, bool out_bf16) {
  write_rows(y, M, Nout, np, Y, out_bf16);
}

template <typename T>
void run_plain(std::span<const double> X, int64_t M, int64_t K, const std::vector<T>& wt, int64_t Nout, int64_t np,
               std::span<double> Y, bool out_bf16) {
  const std::vector<T> x = padded_rows<T>(X, M, K);
  const int64_t Mp = round_up(M, kRows);
  std::vector<T> y(static_cast<size_t>(Mp * np));
  for_panels(Mp, M * K * Nout,
             [&](int64_t m0, int64_t m1) {
               if (has_avx512())
                 dot_panel_512(x.data(), m0, m1, K, wt.data(), np, y.data());
               else
                 dot_panel_t(x.data(), m0, m1, K, wt.data(), np, y.data());
             });
  write_rows_t(y.data(), M, Nout, np, Y.data(), out_bf16);
}

// Y [M, Nout] = X [M, K] through a packed linear.
void run_packed(std::span<const double> X, int64_t M, int64_t K, int64_t Nout,
                const V41Linear::Packed& p, std::span<double> Y, bool out_bf16) {
  if (p.f64) return run_plain(X, M, K, p.w64, Nout, p.np, Y, out_bf16);
  if (!p.codes) return run_plain(X, M, K, p.w32, Nout, p.np, Y, out_bf16);
  // act_quant per 32: the codes' values and the scales per row (the padding rows zero).
  const int64_t nb = K / kFp8Block, Mp = round_up(M, kRows);
  std::vector<float> ac(static_cast<size_t>(Mp * K), 0.0f), xs(static_cast<size_t>(Mp * nb), 0.0f);
  std::vector<float> y(static_cast<size_t>(Mp * p.np));
  quantize_rows(X.data(), M * nb, ac.data(), xs.data());
  for_panels(Mp, M * K * Nout, [&](int64_t m0, int64_t m1) {
    if (has_avx512())
      block_scaled_panel_512(ac.data(), xs.data(), m0, m1, K, p.w32.data(), p.scale.data(), p.np, y.data());
    else
      block_scaled_panel_t(ac.data(), xs.data(), m0, m1, K, p.w32.data(), p.scale.data(), p.np, y.data());
  });
  write_rows_t(y.data(), M, Nout, p.np, Y.data(), out_bf16);
}

}  // namespace

void linear(const Arith& a, std::span<const double> X, int64_t M, int64_t K, std::span<const double> W,
            int64_t Nout, std::span<double> Y, bool out_bf16) {
  run_packed(X, M, K, Nout, pack_plain(a, W, Nout, K), Y, out_bf16);
}

void linear_w(const Arith& a, std::span<const double> X, int64_t M, const V41Linear& w, std::span<double> Y,
              bool out_bf16) {
  if (packed_for(a, w)) return run_packed(X, M, w.in, w.out, w.packed, Y, out_bf16);
  run_packed(X, M, w.in, w.out, pack_for(a, w), Y, out_bf16);
}

void pack_linear(const Arith& a, V41Linear& w) { w.packed = pack_for(a, w); }

void pack_layer_linears(const Arith& a, V41LayerWeights& w) {
  for (V41Linear* l : {&w.wq_a, &w.wq_b, &w.wkv, &w.wo_b, &w.compressor_wkv, &w.compressor_wgate, &w.indexer_wq_b,
                       &w.indexer_weights_proj, &w.indexer_wk, &w.engram_wkv, &w.shared.w1, &w.shared.w2, &w.shared.w3})
    pack_linear(a, *l);
  for (V41ExpertWeights& e : w.experts)
    for (V41Linear* l : {&e.w1, &e.w2, &e.w3}) pack_linear(a, *l);
}

namespace {

// ss[r] = Σ_i x[r, i]² in i order, one rounding per op, for kSquareRows rows at a time (x rows n
// apart) so that their sums run side by side; T as in write_rows.
constexpr int64_t kSquareRows = 8;
template <typename T>
[[gnu::always_inline]] inline void sum_squares(const double* x, int64_t rows, int64_t n, double* ss) {
  for (int64_t r0 = 0; r0 < rows; r0 += kSquareRows) {
    const int64_t nr = std::min(kSquareRows, rows - r0);
    T acc[kSquareRows] = {};
    const double* p = x + r0 * n;
    if (nr == kSquareRows) {
      for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 8
        for (int64_t r = 0; r < kSquareRows; ++r) {
          const T v = static_cast<T>(p[r * n + i]);
          acc[r] = acc[r] + v * v;
        }
    } else {
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t i = 0; i < n; ++i) {
          const T v = static_cast<T>(p[r * n + i]);
          acc[r] = acc[r] + v * v;
        }
    }
    for (int64_t r = 0; r < nr; ++r) ss[r0 + r] = acc[r];
  }
}
V41_KERNEL void sum_squares_f32(const double* x, int64_t rows, int64_t n, double* ss) {
  sum_squares<float>(x, rows, n, ss);
}
V41_KERNEL void sum_squares_f64(const double* x, int64_t rows, int64_t n, double* ss) {
  sum_squares<double>(x, rows, n, ss);
}

// x[r, i] = bf16(w[i] · (x[r, i] · rs[r])), a vector of i at a time.
template <typename T>
[[gnu::always_inline]] inline void scale_rows(double* x, int64_t rows, int64_t n, const double* w, const double* rs) {
  constexpr int64_t L = kLanes<T>;
  for (int64_t r = 0; r < rows; ++r) {
    double* p = x + r * n;
    const T s = static_cast<T>(rs[r]);
    int64_t i = 0;
    for (; i + L <= n; i += L) {
      Vec<T> v, wv;
      load_lanes<T>(v, p + i);
      load_lanes<T>(wv, w + i);
      v = wv * (v * s);
      bf_lanes<T>(v);
      store_lanes<T>(p + i, v);
    }
    for (; i < n; ++i) p[i] = bf_of<T>(static_cast<T>(w[i]) * (static_cast<T>(p[i]) * s));
  }
}
V41_KERNEL void scale_rows_f32(double* x, int64_t rows, int64_t n, const double* w, const double* rs) {
  scale_rows<float>(x, rows, n, w, rs);
}
V41_KERNEL void scale_rows_f64(double* x, int64_t rows, int64_t n, const double* w, const double* rs) {
  scale_rows<double>(x, rows, n, w, rs);
}

}  // namespace

void row_sum_squares(const Arith& a, std::span<const double> x, int64_t n, std::span<double> ss) {
  (a.emulate ? sum_squares_f32 : sum_squares_f64)(x.data(), static_cast<int64_t>(ss.size()), n, ss.data());
}

void rmsnorm(const Arith& a, std::span<double> x, int64_t n, std::span<const double> w, double eps) {
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  const double e = a.c(eps);
  std::vector<double> rs(static_cast<size_t>(rows));
  row_sum_squares(a, x, n, rs);
  for (double& v : rs) v = a.rsqrt(a.add(a.div(v, static_cast<double>(n)), e));
  (a.emulate ? scale_rows_f32 : scale_rows_f64)(x.data(), rows, n, w.data(), rs.data());
}

RopeTable rope_table(const Arith& a, int64_t rope_head_dim, int64_t N, int64_t original_seq_len, double theta,
                     double factor, int64_t beta_fast, int64_t beta_slow) {
  const int64_t d = rope_head_dim, half = d / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const double ex = a.div(static_cast<double>(2 * i), static_cast<double>(d));
    const double p = a.emulate ? std::pow(static_cast<float>(theta), static_cast<float>(ex)) : std::pow(theta, ex);
    f[static_cast<size_t>(i)] = a.div(1.0, p);
  }
  if (original_seq_len > 0) {
    // corrected_dim, low and high in python's double arithmetic, as precompute_freqs_cis has them.
    auto corrected = [&](double rotations) {
      return static_cast<double>(d) * std::log(static_cast<double>(original_seq_len) / (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(theta));
    };
    const double low = std::max(std::floor(corrected(static_cast<double>(beta_fast))), 0.0);
    const double high = std::min(std::ceil(corrected(static_cast<double>(beta_slow))), static_cast<double>(d - 1));
    const double span = a.c(std::max(high - low, 1e-3));
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp(a.div(a.sub(static_cast<double>(i), low), span), 0.0, 1.0);
      const double smooth = a.sub(1.0, ramp);
      double& fi = f[static_cast<size_t>(i)];
      fi = a.add(a.mul(a.div(fi, a.c(factor)), a.sub(1.0, smooth)), a.mul(fi, smooth));
    }
  }
  RopeTable t;
  t.half = half;
  t.cos.resize(static_cast<size_t>(N * half));
  t.sin.resize(static_cast<size_t>(N * half));
  for (int64_t p = 0; p < N; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double ang = a.mul(static_cast<double>(p), f[static_cast<size_t>(i)]);
      t.cos[static_cast<size_t>(p * half + i)] = a.cos(ang);
      t.sin[static_cast<size_t>(p * half + i)] = a.sin(ang);
    }
  return t;
}

RopeTable layer_rope(const Arith& a, const V41Config& c, const LayerPlan& lp, int64_t N, V41Fault fault) {
  if (fault == V41Fault::one_rope_theta)
    return rope_table(a, c.rope_head_dim, N, 0, c.rope_theta, c.rope_factor, c.beta_fast, c.beta_slow);
  return rope_table(a, c.rope_head_dim, N, lp.yarn ? c.original_seq_len : 0, lp.rope_theta, c.rope_factor, c.beta_fast,
                    c.beta_slow);
}

void apply_rope(const Arith& a, double* x, int64_t d, const RopeTable& t, int64_t pos, bool inverse) {
  double* v = x + (d - 2 * t.half);
  for (int64_t i = 0; i < t.half; ++i) {
    const double c = t.cos[static_cast<size_t>(pos * t.half + i)], s = t.sin[static_cast<size_t>(pos * t.half + i)];
    const double x0 = v[2 * i], x1 = v[2 * i + 1];
    // (x0 + i x1)(c + i s), or by the conjugate (c - i s); each product rounded, then the sum.
    const double re = inverse ? a.add(a.mul(x0, c), a.mul(x1, s)) : a.sub(a.mul(x0, c), a.mul(x1, s));
    const double im = inverse ? a.sub(a.mul(x1, c), a.mul(x0, s)) : a.add(a.mul(x0, s), a.mul(x1, c));
    v[2 * i] = a.bf(re);
    v[2 * i + 1] = a.bf(im);
  }
}

namespace {
template <typename Fn32, typename Fn64>
void qdq(const Arith& a, std::span<double> x, int64_t K, Fn32 f32, Fn64 f64) {
  if (!a.emulate) return f64(x, K);
  std::vector<float> v(x.begin(), x.end());
  f32(std::span<float>(v), K);
  std::copy(v.begin(), v.end(), x.begin());
}

// The per-32 quantizers on fp32 values run as vector kernels (the same bits as act_qdq and
// fp4_qdq_ue8m0_32, V41Kernels); a shape those refuse goes to them for their error.
bool whole_blocks(std::span<double> x, int64_t K) {
  return K > 0 && K % kFp8Block == 0 && x.size() % static_cast<size_t>(K) == 0;
}
}  // namespace

void qdq_fp8_32(const Arith& a, std::span<double> x, int64_t K) {
  if (a.emulate && whole_blocks(x, K))
    return fp8_qdq_rows(x.data(), static_cast<int64_t>(x.size()) / kFp8Block);
  qdq(a, x, K, act_qdq, act_qdq_f64);
}
void qdq_fp4_32(const Arith& a, std::span<double> x, int64_t K) {
  if (a.emulate && whole_blocks(x, K))
    return fp4_qdq_rows(x.data(), static_cast<int64_t>(x.size()) / kFp4Block);
  qdq(a, x, K, fp4_qdq_ue8m0_32, fp4_qdq_ue8m0_32_f64);
}
void qdq_fp4_e4m3_16(const Arith& a, std::span<double> x, int64_t K) {
  qdq(a, x, K, fp4_qdq_e4m3_16, fp4_qdq_e4m3_16_f64);
}

namespace {
template <typename T>
std::vector<int64_t> topk_as(std::span<const double> values, int64_t k, bool sorted) {
  using Elem = std::pair<T, int64_t>;
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<Elem> q(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) q[static_cast<size_t>(j)] = {static_cast<T>(values[static_cast<size_t>(j)]), j};
  auto above = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  if (k > 0) {
    if (k * 64 <= n) {
      std::partial_sort(q.begin(), q.begin() + k, q.end(), above);
    } else {
      std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), above);
      if (sorted) std::sort(q.begin(), q.begin() + (k - 1), above);
    }
  }
  std::vector<int64_t> out(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) out[static_cast<size_t>(j)] = q[static_cast<size_t>(j)].second;
  return out;
}
}  // namespace

std::vector<int64_t> torch_topk(std::span<const double> values, int64_t k, bool sorted, bool as_fp32) {
  return as_fp32 ? topk_as<float>(values, k, sorted) : topk_as<double>(values, k, sorted);
}

}  // namespace ced::v41::fwd
