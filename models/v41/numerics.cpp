// docs/v41.md §2 (codecs) and §3 (quantize-dequantize, stored weights).
#include "models/v41/numerics.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace ced::v41 {
namespace {

uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }
float float_of(uint32_t u) { return std::bit_cast<float>(u); }

void require(bool ok, const char* fn, const std::string& why) {
  if (!ok) throw std::invalid_argument(std::string("v41 ") + fn + ": " + why);
}

// Block row layout shared by the quantizers: x is [rows, K], blocks of `block` along K.
int64_t rows_of(size_t n, int64_t K, int64_t block, const char* fn) {
  require(K > 0 && K % block == 0, fn, "K = " + std::to_string(K) + " is not a positive multiple of " +
                                           std::to_string(block));
  require(n % static_cast<size_t>(K) == 0, fn,
          std::to_string(n) + " values are not whole rows of K = " + std::to_string(K));
  return static_cast<int64_t>(n / static_cast<size_t>(K));
}

// max |x| over a block; a NaN propagates (torch's amax does).
float block_amax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a)) return a;
    if (a > m) m = a;
  }
  return m;
}

// torch's clamp_min: a NaN stays a NaN.
float floor_at(float amax, float lo) { return std::isnan(amax) ? amax : (amax < lo ? lo : amax); }

// torch's clamp(v, -6, 6): a NaN stays a NaN (e2m1_from_f32 then gives ±0).
float clamp_e2m1(float v) {
  if (std::isnan(v)) return v;
  return v < -kE2m1Max ? -kE2m1Max : (v > kE2m1Max ? kE2m1Max : v);
}

constexpr float kE2m1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

// ---- bf16 ----


// ---- e4m3fn: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinity; S.1111.111 is NaN.

uint8_t e4m3_from_f32(float x) {
  const uint32_t u = bits_of(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7Fu);
  float a = std::fabs(x);
  if (a >= kE4m3Max) return static_cast<uint8_t>(sign | 0x7Eu);  // satfinite: 448 = 0x7E
  if (a < 0x1p-6f) {
    // Subnormal range, step 2^-9: the code is the RNE multiple of 2^-9 (a * 512 is exact). A
    // result of 8 is the smallest normal, whose code is also 8.
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f)));
  }
  // Normal: rebias the exponent (127 -> 7) and round the 23-bit mantissa to 3 bits, ties to even;
  // a carry out of the mantissa moves into the exponent, as it should. a < 448 keeps it <= 0x7E.
  const uint32_t v = bits_of(a) - ((127u - 7u) << 23);
  const uint32_t r = (v + 0x7FFFFu + ((v >> 20) & 1u)) >> 20;
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(r));
}

namespace {
float e4m3_value(uint8_t code) {
  const float sign = (code & 0x80u) ? -1.0f : 1.0f;
  const uint32_t e = (code >> 3) & 0xFu, m = code & 0x7u;
  if (e == 0xFu && m == 0x7u) return std::copysign(std::numeric_limits<float>::quiet_NaN(), sign);
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(8u + m), static_cast<int>(e) - 10);
}
}  // namespace

float f32_from_e4m3(uint8_t code) {
  // The 256 values once (ldexp per weight was a tenth of loading a checkpoint).
  static const std::array<float, 256> values = [] {
    std::array<float, 256> v{};
    for (int c = 0; c < 256; ++c) v[static_cast<size_t>(c)] = e4m3_value(static_cast<uint8_t>(c));
    return v;
  }();
  return values[code];
}

// ---- e8m0

float f32_from_e8m0(uint8_t b) {
  if (b == 0xFFu) return std::numeric_limits<float>::quiet_NaN();
  if (b == 0) return 0x1p-127f;
  return float_of(static_cast<uint32_t>(b) << 23);
}

uint8_t e8m0_from_f32(float x) {
  const uint32_t u = bits_of(x);
  uint32_t e = (u >> 23) & 0xFFu;
  if (e == 0xFFu) return 0xFFu;  // NaN, ±inf
  const uint32_t half = u & 0x400000u, rest = u & 0x3FFFFFu;
  // Nearest power of two in the linear sense; at exactly 1.5 * 2^e a normal x rounds up and a
  // subnormal one (no implicit bit) stays. An exponent of 255 after the carry is NaN.
  const bool normal = e != 0;
  if (half && (rest || normal)) ++e;
  return static_cast<uint8_t>(e);
}

float ue8m0_scale(float amax, float max_inv) {
  const float x = amax * max_inv;  // one fp32 rounding
  const uint32_t u = bits_of(x);
  const int32_t exponent = static_cast<int32_t>((u >> 23) & 0xFFu);
  const int32_t log2_ceil = exponent - 127 + ((u & 0x7FFFFFu) != 0 ? 1 : 0);
  return float_of(static_cast<uint32_t>(log2_ceil + 127) << 23);
}

// ---- e2m1

uint8_t e2m1_from_f32(float x) {
  const float m = std::fabs(x);
  // Midpoints between neighbouring codes and the tie rule: at 0.75, 1.75 and 3.5 the upper code
  // (2, 4, 6) is the even one; at 0.25, 1.25, 2.5 and 5 the lower one is. A NaN fails every test.
  uint8_t c = 0;
  if (m > 0.25f) c = 1;
  if (m >= 0.75f) c = 2;
  if (m > 1.25f) c = 3;
  if (m >= 1.75f) c = 4;
  if (m > 2.5f) c = 5;
  if (m >= 3.5f) c = 6;
  if (m > 5.0f) c = 7;
  return static_cast<uint8_t>(c | (std::signbit(x) ? 0x8u : 0x0u));
}

float f32_from_e2m1(uint8_t code) {
  const float v = kE2m1Values[code & 0x7u];
  return (code & 0x8u) ? -v : v;
}

void pack_fp4(std::span<const uint8_t> codes, std::span<uint8_t> bytes) {
  require(codes.size() == 2 * bytes.size(), "pack_fp4",
          std::to_string(codes.size()) + " codes for " + std::to_string(bytes.size()) + " bytes");
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>((codes[2 * i] & 0xFu) | ((codes[2 * i + 1] & 0xFu) << 4));
}

void unpack_fp4(std::span<const uint8_t> bytes, std::span<uint8_t> codes) {
  require(codes.size() == 2 * bytes.size(), "unpack_fp4",
          std::to_string(bytes.size()) + " bytes for " + std::to_string(codes.size()) + " codes");
  for (size_t i = 0; i < bytes.size(); ++i) {
    codes[2 * i] = bytes[i] & 0xFu;
    codes[2 * i + 1] = static_cast<uint8_t>(bytes[i] >> 4);
  }
}

// ---- quantize-dequantize

void act_quant(std::span<const float> x, int64_t K, std::span<uint8_t> codes, std::span<float> scales) {
  const int64_t rows = rows_of(x.size(), K, kFp8Block, "act_quant");
  const int64_t nb = K / kFp8Block;
  require(codes.size() == x.size(), "act_quant", "codes must be [rows, K]");
  require(scales.size() == static_cast<size_t>(rows * nb), "act_quant", "scales must be [rows, K/32]");
  for (int64_t b = 0; b < rows * nb; ++b) {
    const float* xb = x.data() + b * kFp8Block;
    const float s = ue8m0_scale(floor_at(block_amax(xb, kFp8Block), kFp8AmaxFloor), kFp8MaxInv);
    scales[static_cast<size_t>(b)] = s;
    for (int64_t i = 0; i < kFp8Block; ++i) codes[static_cast<size_t>(b * kFp8Block + i)] = e4m3_from_f32(xb[i] / s);
  }
}

void act_qdq(std::span<float> x, int64_t K) {
  const int64_t rows = rows_of(x.size(), K, kFp8Block, "act_qdq");
  for (int64_t b = 0; b < rows * (K / kFp8Block); ++b) {
    float* xb = x.data() + b * kFp8Block;
    const float s = ue8m0_scale(floor_at(block_amax(xb, kFp8Block), kFp8AmaxFloor), kFp8MaxInv);
    for (int64_t i = 0; i < kFp8Block; ++i) xb[i] = round_bf16(f32_from_e4m3(e4m3_from_f32(xb[i] / s)) * s);
  }
}

void fp4_qdq_ue8m0_32(std::span<float> x, int64_t K) {
  const int64_t rows = rows_of(x.size(), K, kFp4Block, "fp4_qdq_ue8m0_32");
  for (int64_t b = 0; b < rows * (K / kFp4Block); ++b) {
    float* xb = x.data() + b * kFp4Block;
    const float s = ue8m0_scale(floor_at(block_amax(xb, kFp4Block), kFp4AmaxFloor), kFp4MaxInv);
    for (int64_t i = 0; i < kFp4Block; ++i)
      xb[i] = round_bf16(f32_from_e2m1(e2m1_from_f32(clamp_e2m1(xb[i] / s))) * s);
  }
}

void fp4_qdq_e4m3_16(std::span<float> x, int64_t K) {
  const int64_t rows = rows_of(x.size(), K, kFp4KvBlock, "fp4_qdq_e4m3_16");
  for (int64_t b = 0; b < rows * (K / kFp4KvBlock); ++b) {
    float* xb = x.data() + b * kFp4KvBlock;
    const float s = f32_from_e4m3(e4m3_from_f32(floor_at(block_amax(xb, kFp4KvBlock), kFp4KvAmaxFloor) / kE2m1Max));
    for (int64_t i = 0; i < kFp4KvBlock; ++i)
      xb[i] = round_bf16(f32_from_e2m1(e2m1_from_f32(clamp_e2m1(xb[i] / s))) * s);
  }
}

// ---- stored weights

void dequant_fp8_weight(std::span<const uint8_t> codes, std::span<const uint8_t> scales, int64_t out,
                        int64_t in, std::span<float> w) {
  require(out > 0 && in > 0, "dequant_fp8_weight", "empty shape");
  const int64_t sr = (out + 31) / 32, sc = (in + 31) / 32;
  require(codes.size() == static_cast<size_t>(out * in), "dequant_fp8_weight", "codes must be [out, in]");
  require(w.size() == codes.size(), "dequant_fp8_weight", "w must be [out, in]");
  require(scales.size() == static_cast<size_t>(sr * sc), "dequant_fp8_weight",
          "scales must be [ceil(out/32), ceil(in/32)] = [" + std::to_string(sr) + ", " + std::to_string(sc) + "]");
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      const size_t k = static_cast<size_t>(o * in + i);
      w[k] = f32_from_e4m3(codes[k]) * f32_from_e8m0(scales[static_cast<size_t>((o / 32) * sc + i / 32)]);
    }
}

void dequant_fp4_weight(std::span<const uint8_t> packed, std::span<const uint8_t> scales, int64_t out,
                        int64_t in, std::span<float> w) {
  require(out > 0 && in > 0 && in % 32 == 0, "dequant_fp4_weight",
          "in = " + std::to_string(in) + " is not a positive multiple of 32");
  require(packed.size() == static_cast<size_t>(out * in / 2), "dequant_fp4_weight", "packed must be [out, in/2]");
  require(scales.size() == static_cast<size_t>(out * (in / 32)), "dequant_fp4_weight", "scales must be [out, in/32]");
  require(w.size() == static_cast<size_t>(out * in), "dequant_fp4_weight", "w must be [out, in]");
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      const uint8_t byte = packed[static_cast<size_t>((o * in + i) / 2)];
      const uint8_t code = (i % 2 == 0) ? (byte & 0xFu) : static_cast<uint8_t>(byte >> 4);
      w[static_cast<size_t>(o * in + i)] =
          f32_from_e2m1(code) * f32_from_e8m0(scales[static_cast<size_t>(o * (in / 32) + i / 32)]);
    }
}

}  // namespace ced::v41
