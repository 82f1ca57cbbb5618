#pragma once
// The v41 family's number formats and the quantizers the release applies (docs/v41.md §2, §3).
//
// Every function here is exact integer or IEEE-754 fp32 arithmetic with its rounding points stated;
// none depends on the rounding mode being other than the default (nearest, ties to even), nor on
// the build host. Values said to be "bf16 values" are floats that a bf16 holds exactly: the release
// quantizes bf16 tensors, so the quantizers take them in fp32, as the release's kernels widen them.
#include <cstddef>
#include <bit>
#include <cstdint>
#include <span>

namespace ced::v41 {

// ---- bf16 (docs/v41.md §2.1) -------------------------------------------------------------------

// fp32 -> bf16 bits: round to nearest, ties to even (an overflow becomes ±inf, as IEEE says). A NaN
// stays a NaN: its sign and top payload bits are kept and the quiet bit is set, so a NaN whose
// payload lies only in the low 16 bits does not turn into an infinity.
// Inline: the reference rounds to bf16 after most of its ops.
inline uint16_t bf16_from_f32(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  // Round to nearest even on the 16 dropped bits: add just under half, plus the kept lsb.
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}
inline float f32_from_bf16(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }  // exact
inline float round_bf16(float x) { return f32_from_bf16(bf16_from_f32(x)); }

// Two tensors the same bit for bit (a NaN equals the same NaN; 0 and -0 differ): what "bitwise" means in every
// v41 verdict and claim.
inline bool same_bits(std::span<const double> a, std::span<const double> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint64_t>(a[i]) != std::bit_cast<uint64_t>(b[i])) return false;
  return true;
}

// ---- float8 e4m3fn (docs/v41.md §2.2) ----------------------------------------------------------

inline constexpr float kE4m3Max = 448.0f;
// fp32 -> e4m3fn code: saturate to ±448 first, then round to nearest, ties to even (the CUDA
// satfinite conversion; also ±inf -> ±448). NaN -> 0x7F with the sign bit kept. -0 -> 0x80.
uint8_t e4m3_from_f32(float x);
float f32_from_e4m3(uint8_t code);  // exact; 0x7F and 0xFF are NaN

// ---- e8m0 (docs/v41.md §2.3) -------------------------------------------------------------------

// e8m0 byte b -> 2^(b-127); 255 is NaN; 0 is 2^-127 (an fp32 subnormal, exact).
float f32_from_e8m0(uint8_t b);
// fp32 -> e8m0 byte, torch's float8_e8m0fnu cast: the fp32 exponent field, plus one when the
// mantissa is at least half (a normal x) or more than half (a subnormal x) of the way to the next
// power of two; the sign is ignored; NaN, ±inf and anything that rounds past 2^127 give 255 (NaN).
// Exact for a power of two, which is every scale the release computes.
uint8_t e8m0_from_f32(float x);

// The ue8m0 scale rule: 2^ceil(log2(amax * max_inv)), with the product one fp32 rounding and the
// ceiling taken from its bits (biased exponent - 127, plus 1 when the mantissa is not zero). The
// result's bits are ((ceil + 127) << 23) in 32-bit arithmetic, as the kernel builds them.
float ue8m0_scale(float amax, float max_inv);
// The kernels' reciprocals, fp32 constants (1/448 -> 0x3B124925, 1/6 -> 0x3E2AAAAB).
inline constexpr float kFp8MaxInv = 1.0f / 448.0f;
inline constexpr float kFp4MaxInv = 1.0f / 6.0f;

// ---- e2m1 and packed FP4 (docs/v41.md §2.4) ----------------------------------------------------

inline constexpr float kE2m1Max = 6.0f;
// fp32 -> 4-bit e2m1 code: magnitude codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign
// (so -0 and small negatives give 8). Round to nearest, ties to the even code: 0.25 -> 0, 0.75 -> 1,
// 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4. Magnitudes above 6 give 6; a NaN gives ±0.
uint8_t e2m1_from_f32(float x);
float f32_from_e2m1(uint8_t code);  // exact; code 8 is -0.0; only the low 4 bits are read

// Two codes per byte, the even element in the low nibble. codes: [2n], bytes: [n].
void pack_fp4(std::span<const uint8_t> codes, std::span<uint8_t> bytes);
void unpack_fp4(std::span<const uint8_t> bytes, std::span<uint8_t> codes);

// ---- quantize-dequantize of activations (docs/v41.md §3.1-§3.3) --------------------------------

inline constexpr int64_t kFp8Block = 32;      // act_quant: one scale per 32 along the row
inline constexpr int64_t kFp4Block = 32;      // index queries and keys
inline constexpr int64_t kFp4KvBlock = 16;    // the compressed latent
inline constexpr float kFp8AmaxFloor = 1e-4f;                  // fp32(1e-4)
inline constexpr float kFp4AmaxFloor = 6.0f * 0x1p-126f;       // 6 * 2^-126
inline constexpr float kFp4KvAmaxFloor = 6.0f * 0x1p-9f;       // 6 * 2^-9

// act_quant (docs/v41.md §3.1): FP8 e4m3 with one ue8m0 scale per 32 along each row.
// x: [rows, K] bf16 values, K % 32 == 0. codes: [rows, K] e4m3 codes; scales: [rows, K/32] fp32
// powers of two. Per block: amax = max |x| (exact; a NaN propagates), floored at fp32(1e-4);
// s = ue8m0_scale(amax, fp32(1/448)); code = e4m3_from_f32(x / s) (one fp32 division, exact for
// a power of two unless the quotient is subnormal; saturation at ±448).
void act_quant(std::span<const float> x, int64_t K, std::span<uint8_t> codes, std::span<float> scales);
// The same, dequantized in place: x <- bf16(f32(code) * s). The fp32 product and the bf16 cast are
// exact (at most 4 significant bits times a power of two), so the result is the QDQ value.
void act_qdq(std::span<float> x, int64_t K);

// FP4 e2m1 per 32 with a ue8m0 scale, in place (docs/v41.md §3.2): the index queries and keys.
// x: [rows, K] bf16 values, K % 32 == 0. Per block: amax floored at 6 * 2^-126;
// s = ue8m0_scale(amax, fp32(1/6)); v = clamp(x / s, -6, 6) (one fp32 division);
// x <- bf16(e2m1(code(v)) * s) (exact).
void fp4_qdq_ue8m0_32(std::span<float> x, int64_t K);

// FP4 e2m1 per 16 with an e4m3 scale, in place (docs/v41.md §3.3): the compressed latent.
// x: [rows, K] bf16 values, K % 16 == 0. Per block: amax floored at 6 * 2^-9;
// s = f32(e4m3_from_f32(amax / 6)) (one fp32 division by 6, then RNE to e4m3, saturating);
// v = clamp(x / s, -6, 6) (one fp32 division, inexact in general: s is not a power of two);
// x <- bf16(e2m1(code(v)) * s) (exact: at most 6 significant bits).
void fp4_qdq_e4m3_16(std::span<float> x, int64_t K);

// ---- stored weights (docs/v41.md §3.4, §3.5) ---------------------------------------------------

// An FP8 weight [out, in] of e4m3 codes with one e8m0 scale per 32x32 tile, scales
// [ceil(out/32), ceil(in/32)]. w: [out, in] <- f32(code) * 2^(b-127), one fp32 product (exact
// unless it leaves the fp32 range).
void dequant_fp8_weight(std::span<const uint8_t> codes, std::span<const uint8_t> scales, int64_t out,
                        int64_t in, std::span<float> w);
// A routed expert's FP4 weight: packed e2m1 [out, in/2] (low nibble the even element) with one e8m0
// scale per 32 along K, scales [out, in/32]; in % 32 == 0. w: [out, in] <- e2m1(code) * 2^(b-127).
void dequant_fp4_weight(std::span<const uint8_t> packed, std::span<const uint8_t> scales, int64_t out,
                        int64_t in, std::span<float> w);

// ---- the same quantizers in double (docs/v41.md §3.8): the f64 regime's quantization points ------

// The nearest e4m3fn value of v, ties to the even code, |v| saturated at 448 (NaN stays NaN).
double e4m3_round_f64(double v);
// The nearest e2m1 value of v, ties to the even code, |v| saturated at 6; the sign of zero is kept.
double e2m1_round_f64(double v);
// 2^ceil(log2(amax * max_inv)), the product in double; amax > 0.
double ue8m0_scale_f64(double amax, double max_inv);
// act_qdq, fp4_qdq_ue8m0_32 and fp4_qdq_e4m3_16 with every step in double: the amax floors and
// constants as doubles (1e-4, 1/448, 1/6, 6 * 2^-126, 6 * 2^-9), x / s in double, the code's value
// times s. On bf16 inputs the first two agree with the fp32 functions except where x / s or amax / 448
// rounds differently in fp32; the third's scale amax / 6 is rounded once (to e4m3) instead of twice.
void act_qdq_f64(std::span<double> x, int64_t K);
void fp4_qdq_ue8m0_32_f64(std::span<double> x, int64_t K);
void fp4_qdq_e4m3_16_f64(std::span<double> x, int64_t K);

}  // namespace ced::v41
