// docs/v41.md §2-§3: the v41 codecs and quantizers on hand vectors at every rounding midpoint and
// saturation edge (each derived in a comment), round trips, and exhaustive comparisons with
// brute-force formulations (nearest representable value, ties to the even code).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "models/v41/numerics.hpp"

using namespace ced::v41;

namespace {
uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// Brute force: the finite e4m3 code nearest |x| (saturating), ties to the even code.
uint8_t e4m3_brute(float x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xFF : 0x7F;
  const double a = std::min(std::fabs(static_cast<double>(x)), 448.0);  // saturating
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(static_cast<double>(f32_from_e4m3(static_cast<uint8_t>(c))) - a);
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c, best_d = d;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

// Brute force: the e2m1 magnitude nearest |x| (saturating at 6), ties to the even code.
uint8_t e2m1_brute(float x) {
  const double a = std::min(std::fabs(static_cast<double>(x)), 6.0);  // saturating
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c < 8; ++c) {
    const double d = std::fabs(static_cast<double>(f32_from_e2m1(static_cast<uint8_t>(c))) - a);
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c, best_d = d;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 8 : 0));
}
}  // namespace

// ---- bf16 ----

TEST(V41Bf16, RoundsExactMidpointsToTheEvenNeighbour) {
  // 1 + 2^-8 lies halfway between 1.0 (0x3F80, even) and 1 + 2^-7 (0x3F81): down to 0x3F80.
  EXPECT_EQ(bf16_from_f32(1.0f + 0x1p-8f), 0x3F80);
  // 1 + 3*2^-8 lies halfway between 0x3F81 (odd) and 0x3F82 (even): up to 0x3F82.
  EXPECT_EQ(bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3F82);
  // Negative: the same, with the sign bit.
  EXPECT_EQ(bf16_from_f32(-(1.0f + 0x1p-8f)), 0xBF80);
  EXPECT_EQ(bf16_from_f32(-(1.0f + 3 * 0x1p-8f)), 0xBF82);
}

TEST(V41Bf16, RoundsJustOffAMidpointToTheNearerNeighbour) {
  // One fp32 ulp above the midpoint 1 + 2^-8 rounds up to 0x3F81; one below rounds down.
  EXPECT_EQ(bf16_from_f32(from_bits(0x3F808001)), 0x3F81);
  EXPECT_EQ(bf16_from_f32(from_bits(0x3F807FFF)), 0x3F80);
  // Low bits below the midpoint truncate: 0x3F817FFF -> 0x3F81.
  EXPECT_EQ(bf16_from_f32(from_bits(0x3F817FFF)), 0x3F81);
}

TEST(V41Bf16, OverflowsToInfinityFromTheLastMidpointUp) {
  // The largest bf16 is 0x7F7F; 0x7F7F8000 is halfway to 0x7F80 (inf, even): up to inf.
  EXPECT_EQ(bf16_from_f32(from_bits(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(bf16_from_f32(from_bits(0x7F7F8000)), 0x7F80);
  EXPECT_EQ(bf16_from_f32(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(bf16_from_f32(kInf), 0x7F80);
  EXPECT_EQ(bf16_from_f32(-kInf), 0xFF80);
}

TEST(V41Bf16, KeepsSubnormalsAndSignedZeroWithEvenTies) {
  EXPECT_EQ(bf16_from_f32(0.0f), 0x0000);
  EXPECT_EQ(bf16_from_f32(-0.0f), 0x8000);
  // fp32 subnormal 0x00008000 is halfway between bf16 0x0000 (even) and 0x0001: down.
  EXPECT_EQ(bf16_from_f32(from_bits(0x00008000)), 0x0000);
  // 0x00018000 is halfway between 0x0001 and 0x0002 (even): up. No flush to zero.
  EXPECT_EQ(bf16_from_f32(from_bits(0x00018000)), 0x0002);
  EXPECT_EQ(bf16_from_f32(from_bits(0x00010000)), 0x0001);
}

TEST(V41Bf16, KeepsNaNANaNEvenWhenItsPayloadIsOnlyInTheDroppedBits) {
  // 0x7F800001 is a NaN whose payload lies below bit 16: rounding the bits would give 0x7F80 = inf.
  EXPECT_TRUE(std::isnan(f32_from_bf16(bf16_from_f32(from_bits(0x7F800001)))));
  EXPECT_EQ(bf16_from_f32(from_bits(0x7F800001)), 0x7FC0);  // quiet bit set
  EXPECT_EQ(bf16_from_f32(from_bits(0xFF800001)), 0xFFC0);  // sign kept
  EXPECT_EQ(bf16_from_f32(kNaN), 0x7FC0);
  EXPECT_EQ(bf16_from_f32(from_bits(0x7FFFFFFF)), 0x7FFF);  // top payload kept
}

TEST(V41Bf16, EveryBf16ValueRoundTripsBitExactly) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = f32_from_bf16(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(round_bf16(f))) << b;
      continue;
    }
    ASSERT_EQ(bf16_from_f32(f), b) << b;
  }
}

TEST(V41Bf16, RandomFp32ValuesRoundToTheNearerNeighbourTiesToEven) {
  // Independent formulation: compare the distances to the two bf16 neighbours in double.
  std::mt19937 rng(41);
  std::printf("seed 41\n");
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = rng();
    const float f = from_bits(u);
    if (!std::isfinite(f)) continue;
    const uint16_t lo = static_cast<uint16_t>(u >> 16), hi = static_cast<uint16_t>(lo + 1);
    const double dl = std::fabs(static_cast<double>(f) - f32_from_bf16(lo));
    const double fh = f32_from_bf16(hi);
    const double dh = std::isinf(fh) ? std::ldexp(1.0, 128) - std::fabs(static_cast<double>(f)) : std::fabs(static_cast<double>(f) - fh);
    const uint16_t want = (dl < dh || (dl == dh && lo % 2 == 0)) ? lo : hi;
    ASSERT_EQ(bf16_from_f32(f), want) << std::hex << u;
  }
}

// ---- e4m3fn ----

TEST(V41E4m3, DecodesTheFormatsLandmarks) {
  EXPECT_EQ(f32_from_e4m3(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(f32_from_e4m3(0x80)));
  EXPECT_EQ(f32_from_e4m3(0x01), 0x1p-9f);   // smallest subnormal: 1 * 2^-9
  EXPECT_EQ(f32_from_e4m3(0x07), 7 * 0x1p-9f);  // largest subnormal
  EXPECT_EQ(f32_from_e4m3(0x08), 0x1p-6f);   // smallest normal: exponent field 1, bias 7
  EXPECT_EQ(f32_from_e4m3(0x38), 1.0f);      // exponent field 7
  EXPECT_EQ(f32_from_e4m3(0x39), 1.125f);
  EXPECT_EQ(f32_from_e4m3(0x7E), 448.0f);    // 1.75 * 2^8, the largest
  EXPECT_EQ(f32_from_e4m3(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(f32_from_e4m3(0x7F)));
  EXPECT_TRUE(std::isnan(f32_from_e4m3(0xFF)));
}

TEST(V41E4m3, RoundsNormalMidpointsToTheEvenCode) {
  // Step 1/8 in [1, 2): 1.0625 is halfway between 0x38 (even) and 0x39: down.
  EXPECT_EQ(e4m3_from_f32(1.0625f), 0x38);
  // 1.1875 is halfway between 0x39 and 0x3A (even): up.
  EXPECT_EQ(e4m3_from_f32(1.1875f), 0x3A);
  EXPECT_EQ(e4m3_from_f32(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(e4m3_from_f32(std::nextafter(1.1875f, 0.0f)), 0x39);
  // A carry into the exponent: 1.9375 is halfway between 1.875 (0x3F) and 2.0 (0x40, even).
  EXPECT_EQ(e4m3_from_f32(1.9375f), 0x40);
  // Near the top, step 32: 400 is halfway between 384 (0x7C, even) and 416 (0x7D);
  // 432 between 416 (0x7D) and 448 (0x7E, even).
  EXPECT_EQ(e4m3_from_f32(400.0f), 0x7C);
  EXPECT_EQ(e4m3_from_f32(432.0f), 0x7E);
  EXPECT_EQ(e4m3_from_f32(-432.0f), 0xFE);
}

TEST(V41E4m3, RoundsSubnormalMidpointsToTheEvenCode) {
  // Step 2^-9 below 2^-6: 2^-10 is halfway between 0 (even) and 0x01; 3 * 2^-10 between 0x01 and 0x02.
  EXPECT_EQ(e4m3_from_f32(0x1p-10f), 0x00);
  EXPECT_EQ(e4m3_from_f32(3 * 0x1p-10f), 0x02);
  EXPECT_EQ(e4m3_from_f32(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  // 7.5 * 2^-9 is halfway between the largest subnormal 0x07 and the smallest normal 0x08 (even).
  EXPECT_EQ(e4m3_from_f32(7.5f * 0x1p-9f), 0x08);
  // Just above the subnormal range: 2^-6 * (1 + 1/16) is halfway between 0x08 (even) and 0x09.
  EXPECT_EQ(e4m3_from_f32(0x1p-6f * 1.0625f), 0x08);
  EXPECT_EQ(e4m3_from_f32(-0x1p-10f), 0x80);  // rounds to -0
  EXPECT_EQ(e4m3_from_f32(from_bits(0x00000001)), 0x00);  // an fp32 subnormal
}

TEST(V41E4m3, SaturatesAtPlusMinus448InsteadOfGoingNaN) {
  // satfinite: everything at or beyond 448 in magnitude is 448, infinities included. (A plain cast
  // would give NaN from 464 up; the release clamps first.)
  EXPECT_EQ(e4m3_from_f32(448.0f), 0x7E);
  EXPECT_EQ(e4m3_from_f32(449.0f), 0x7E);
  EXPECT_EQ(e4m3_from_f32(464.0f), 0x7E);
  EXPECT_EQ(e4m3_from_f32(480.0f), 0x7E);
  EXPECT_EQ(e4m3_from_f32(1e30f), 0x7E);
  EXPECT_EQ(e4m3_from_f32(kInf), 0x7E);
  EXPECT_EQ(e4m3_from_f32(-kInf), 0xFE);
  EXPECT_EQ(e4m3_from_f32(-1000.0f), 0xFE);
}

TEST(V41E4m3, MapsNaNToNaNWithItsSign) {
  EXPECT_EQ(e4m3_from_f32(kNaN), 0x7F);
  EXPECT_EQ(e4m3_from_f32(-kNaN), 0xFF);
  EXPECT_EQ(e4m3_from_f32(-0.0f), 0x80);
}

TEST(V41E4m3, EveryBf16ValueEncodesToTheNearestCodeTiesToEven) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = f32_from_bf16(static_cast<uint16_t>(b));
    ASSERT_EQ(e4m3_from_f32(f), e4m3_brute(f)) << std::hex << b;
  }
}

TEST(V41E4m3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(e4m3_from_f32(f32_from_e4m3(static_cast<uint8_t>(c))), c) << c;
  }
}

// ---- e8m0 and the ue8m0 scale rule ----

TEST(V41E8m0, DecodesBytesAsPowersOfTwo) {
  EXPECT_EQ(f32_from_e8m0(127), 1.0f);
  EXPECT_EQ(f32_from_e8m0(128), 2.0f);
  EXPECT_EQ(f32_from_e8m0(0), 0x1p-127f);  // an fp32 subnormal, exact
  EXPECT_EQ(f32_from_e8m0(1), 0x1p-126f);
  EXPECT_EQ(f32_from_e8m0(254), 0x1p127f);
  EXPECT_TRUE(std::isnan(f32_from_e8m0(255)));
}

TEST(V41E8m0, EncodesAsTorchsCastRoundingAtOneAndAHalf) {
  EXPECT_EQ(e8m0_from_f32(1.0f), 127);
  EXPECT_EQ(e8m0_from_f32(0x1p-22f), 105);
  // The mantissa's top bit decides for a normal x: 1.25 and just under 1.5 stay, 1.5 and 1.75 go up.
  EXPECT_EQ(e8m0_from_f32(1.25f), 127);
  EXPECT_EQ(e8m0_from_f32(std::nextafter(1.5f, 0.0f)), 127);
  EXPECT_EQ(e8m0_from_f32(1.5f), 128);
  EXPECT_EQ(e8m0_from_f32(1.75f), 128);
  EXPECT_EQ(e8m0_from_f32(-2.0f), 128);  // the sign is ignored
  // A subnormal x has no implicit bit: 2^-127 (0x00400000) stays at 0, one ulp more goes to 1.
  EXPECT_EQ(e8m0_from_f32(0x1p-127f), 0);
  EXPECT_EQ(e8m0_from_f32(from_bits(0x00400001)), 1);
  EXPECT_EQ(e8m0_from_f32(0.0f), 0);
  // Rounding past 2^127, an infinity or a NaN gives 255 (NaN).
  EXPECT_EQ(e8m0_from_f32(0x1p127f), 254);
  EXPECT_EQ(e8m0_from_f32(std::numeric_limits<float>::max()), 255);
  EXPECT_EQ(e8m0_from_f32(kInf), 255);
  EXPECT_EQ(e8m0_from_f32(kNaN), 255);
}

TEST(V41E8m0, EveryByteRoundTrips) {
  for (int b = 0; b < 255; ++b) EXPECT_EQ(e8m0_from_f32(f32_from_e8m0(static_cast<uint8_t>(b))), b) << b;
}

TEST(V41Ue8m0, TheKernelsReciprocalsAreTheFp32Constants) {
  // 1/448 = 1.001001...b * 2^-9: the 24th significant bit is followed by 1001..., so it rounds up
  // to mantissa 0x124925, exponent 118: 0x3B124925. 1/6 = 1.0101...b * 2^-3 rounds up to 0x3E2AAAAB.
  EXPECT_EQ(bits(kFp8MaxInv), 0x3B124925u);
  EXPECT_EQ(bits(kFp4MaxInv), 0x3E2AAAABu);
}

TEST(V41Ue8m0, ScaleIsTheCeilingPowerOfTwoOfTheFp32Product) {
  // 448 * fp32(1/448) rounds to exactly 1.0 (mantissa 0): scale 1. 447 gives 0.99799: scale 1.
  EXPECT_EQ(ue8m0_scale(448.0f, kFp8MaxInv), 1.0f);
  EXPECT_EQ(ue8m0_scale(447.0f, kFp8MaxInv), 1.0f);
  // 450 gives 1.0045 (mantissa != 0): ceiling 2 (a floor would say 1).
  EXPECT_EQ(ue8m0_scale(450.0f, kFp8MaxInv), 2.0f);
  EXPECT_EQ(ue8m0_scale(896.0f, kFp8MaxInv), 2.0f);
  EXPECT_EQ(ue8m0_scale(224.0f, kFp8MaxInv), 0.5f);
  // The FP8 floor: fp32(1e-4) * fp32(1/448) = 0x1.df595ap-23: ceiling 2^-22.
  EXPECT_EQ(ue8m0_scale(kFp8AmaxFloor, kFp8MaxInv), 0x1p-22f);
  // FP4: 6 * fp32(1/6) rounds to exactly 1 (the product is 1 + 2^-25 + ..., below half an ulp).
  EXPECT_EQ(ue8m0_scale(6.0f, kFp4MaxInv), 1.0f);
  EXPECT_EQ(ue8m0_scale(7.0f, kFp4MaxInv), 2.0f);
  EXPECT_EQ(ue8m0_scale(3.0f, kFp4MaxInv), 0.5f);
  // The FP4 floor 6 * 2^-126 gives exactly 2^-126.
  EXPECT_EQ(ue8m0_scale(kFp4AmaxFloor, kFp4MaxInv), 0x1p-126f);
  // Zero gives the bits 0 << 23 = +0 (why the kernels floor amax first).
  EXPECT_EQ(bits(ue8m0_scale(0.0f, kFp4MaxInv)), 0u);
}

// ---- e2m1 and packing ----

TEST(V41E2m1, RoundsEveryMidpointToTheEvenCode) {
  // (value, code): 0.25 -> 0, 0.75 -> 1.0 (code 2), 1.25 -> 1.0 (2), 1.75 -> 2.0 (4), 2.5 -> 2.0 (4),
  // 3.5 -> 4.0 (6), 5 -> 4.0 (6).
  EXPECT_EQ(e2m1_from_f32(0.25f), 0);
  EXPECT_EQ(e2m1_from_f32(0.75f), 2);
  EXPECT_EQ(e2m1_from_f32(1.25f), 2);
  EXPECT_EQ(e2m1_from_f32(1.75f), 4);
  EXPECT_EQ(e2m1_from_f32(2.5f), 4);
  EXPECT_EQ(e2m1_from_f32(3.5f), 6);
  EXPECT_EQ(e2m1_from_f32(5.0f), 6);
  EXPECT_EQ(e2m1_from_f32(-5.0f), 14);
  EXPECT_EQ(e2m1_from_f32(-0.75f), 10);
}

TEST(V41E2m1, RoundsJustOffEachMidpointToTheNearerCode) {
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(e2m1_from_f32(std::nextafter(mids[i], 0.0f)), i) << mids[i];
    EXPECT_EQ(e2m1_from_f32(std::nextafter(mids[i], 10.0f)), i + 1) << mids[i];
  }
}

TEST(V41E2m1, KeepsNegativeZeroSaturatesAndMapsNaNToZero) {
  EXPECT_EQ(e2m1_from_f32(-0.0f), 8);
  EXPECT_EQ(e2m1_from_f32(-0.1f), 8);  // rounds to -0
  EXPECT_EQ(e2m1_from_f32(0.0f), 0);
  EXPECT_TRUE(std::signbit(f32_from_e2m1(8)));
  EXPECT_EQ(f32_from_e2m1(8), 0.0f);
  EXPECT_EQ(e2m1_from_f32(6.0f), 7);
  EXPECT_EQ(e2m1_from_f32(100.0f), 7);
  EXPECT_EQ(e2m1_from_f32(-kInf), 15);
  EXPECT_EQ(e2m1_from_f32(kNaN), 0);
}

TEST(V41E2m1, DecodesTheSixteenCodes) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(bits(f32_from_e2m1(static_cast<uint8_t>(c))), bits(want[c])) << c;
    EXPECT_EQ(e2m1_from_f32(f32_from_e2m1(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(V41E2m1, EveryBf16ValueEncodesToTheNearestCodeTiesToEven) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = f32_from_bf16(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(e2m1_from_f32(f), e2m1_brute(f)) << std::hex << b;
  }
}

TEST(V41Fp4Packing, PutsTheEvenElementInTheLowNibble) {
  const std::vector<uint8_t> codes = {0x1, 0x2, 0xF, 0x8};
  std::vector<uint8_t> bytes(2);
  pack_fp4(codes, bytes);
  EXPECT_EQ(bytes[0], 0x21);
  EXPECT_EQ(bytes[1], 0x8F);
  std::vector<uint8_t> back(4);
  unpack_fp4(bytes, back);
  EXPECT_EQ(back, codes);
}

TEST(V41Fp4Packing, EveryByteRoundTrips) {
  std::vector<uint8_t> bytes(256), codes(512), again(256);
  for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = static_cast<uint8_t>(b);
  unpack_fp4(bytes, codes);
  pack_fp4(codes, again);
  EXPECT_EQ(again, bytes);
  EXPECT_THROW(pack_fp4(codes, std::span<uint8_t>(again.data(), 255)), std::invalid_argument);
}

// ---- quantize-dequantize ----

namespace {
std::vector<float> block(std::initializer_list<float> head, size_t n) {
  std::vector<float> v(head);
  v.resize(n, 0.0f);
  return v;
}
}  // namespace

TEST(V41ActQuant, ScalesEachBlockOf32ByTheCeilingPowerOfTwo) {
  // Block 0: amax 448 -> s = 1, values rounded straight to e4m3: 1.0625 -> 1 (tie, even),
  //   1.1875 -> 1.25 (tie, even), 432 -> 448, 400 -> 384, 3 * 2^-10 -> 2^-8, 2^-10 -> 0.
  // Block 1: amax 450 (a bf16: 448 + 2) -> 450/448 > 1 -> s = 2: 450/2 = 225 -> 224 (step 16)
  //   -> 448; 1.0625/2 = 0.53125, halfway between 0.5 and 0.5625 -> 0.5 -> 1.0.
  // Block 2: amax 3 * 2^-33 < 1e-4 -> floored: s = 2^-22; 3 * 2^-33 / 2^-22 = 0.75 * 2^-9 ->
  //   subnormal code 1 -> 2^-9 * 2^-22 = 2^-31. (Without the floor s = 2^-40 and it stays exact.)
  std::vector<float> x = block({448.0f, 1.0625f, 1.1875f, 432.0f, 400.0f, 3 * 0x1p-10f, 0x1p-10f, -0.0f}, 32);
  const auto b1 = block({450.0f, 1.0625f}, 32);
  const auto b2 = block({3 * 0x1p-33f, -3 * 0x1p-33f}, 32);
  x.insert(x.end(), b1.begin(), b1.end());
  x.insert(x.end(), b2.begin(), b2.end());
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(3);
  act_quant(x, 96, codes, scales);
  EXPECT_EQ(scales, (std::vector<float>{1.0f, 2.0f, 0x1p-22f}));
  EXPECT_EQ(codes[0], 0x7E);
  EXPECT_EQ(codes[1], 0x38);
  EXPECT_EQ(codes[7], 0x80);  // -0 keeps its sign
  std::vector<float> y = x;
  act_qdq(y, 96);
  const std::vector<float> want0 = {448.0f, 1.0f, 1.25f, 448.0f, 384.0f, 0x1p-8f, 0.0f};
  for (size_t i = 0; i < want0.size(); ++i) EXPECT_EQ(y[i], want0[i]) << i;
  EXPECT_TRUE(std::signbit(y[7]));
  EXPECT_EQ(y[32], 448.0f);
  EXPECT_EQ(y[33], 1.0f);
  EXPECT_EQ(y[64], 0x1p-31f);
  EXPECT_EQ(y[65], -0x1p-31f);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], f32_from_e4m3(codes[i]) * scales[i / 32]) << i;
}

TEST(V41ActQuant, RefusesARowNotAMultipleOf32) {
  std::vector<float> x(48);
  EXPECT_THROW(act_qdq(x, 48), std::invalid_argument);
  EXPECT_THROW(act_qdq(x, 32), std::invalid_argument);  // 48 values are not whole rows of K = 32
}

TEST(V41Fp4Ue8m0, RoundsTiesToEvenAfterAPowerOfTwoScale) {
  // amax 6 -> s = 1: the e2m1 ties straight: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
  // 3.5 -> 4, 5 -> 4, 2.75 -> 3, 5.5 -> 6, -5 -> -4, -0.25 -> -0.
  std::vector<float> x = block({6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 2.75f, 5.5f, -5.0f, -0.25f}, 32);
  // Second block: amax 7 -> 7 * fp32(1/6) = 1.1667 -> s = 2: 7/2 = 3.5 -> 4 -> 8 (above amax);
  // 5/2 = 2.5 -> 2 -> 4; 1.5/2 = 0.75 -> 1 -> 2.
  const auto b1 = block({7.0f, 5.0f, 1.5f}, 32);
  x.insert(x.end(), b1.begin(), b1.end());
  fp4_qdq_ue8m0_32(x, 64);
  const std::vector<float> want = {6, 0, 1, 1, 2, 2, 4, 4, 3, 6, -4, -0.0f};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(bits(x[i]), bits(want[i])) << i;
  EXPECT_EQ(x[32], 8.0f);
  EXPECT_EQ(x[33], 4.0f);
  EXPECT_EQ(x[34], 2.0f);
}

TEST(V41Fp4Ue8m0, KeepsAnAllZeroBlockPositiveZero) {
  // amax 0 is floored at 6 * 2^-126, so s = 2^-126 and 0 / s = +0. (Unfloored, s would be +0 and
  // 0/0 a NaN, whose sign on x86 is set: the block would come back as -0.)
  std::vector<float> x(32, 0.0f);
  x[5] = -0.0f;
  fp4_qdq_ue8m0_32(x, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(bits(x[static_cast<size_t>(i)]), i == 5 ? 0x80000000u : 0u) << i;
}

TEST(V41Fp4E4m3, ScalesEachBlockOf16ByAmaxOver6RoundedToE4m3) {
  // Block 0: amax 6.375 -> 6.375 / 6 = 1.0625 exactly, an e4m3 tie -> 1.0 (even; ties away would
  //   give 1.125); s = 1: 6.375 -> clamp 6 -> 6; 0.75 -> 1.
  // Block 1: amax 7 -> 7/6 = 1.1667 -> e4m3 1.125 (nearer than 1.25); 7 / 1.125 = 6.22 -> 6 ->
  //   6.75; 1 / 1.125 = 0.889 -> 1 -> 1.125; 0.84375 / 1.125 = 0.75 exactly -> 1 -> 1.125;
  //   0.5625 / 1.125 = 0.5 -> 0.5625.
  // Block 2: amax 3008 -> 501.3 -> saturates to s = 448: 3008 / 448 = 6.71 -> clamp 6 -> 2688.
  // Block 3: amax 3 * 2^-11 < 6 * 2^-9 -> floored: s = e4m3(2^-9) = 2^-9; 2^-10 / 2^-9 = 0.5 ->
  //   2^-10; 3 * 2^-11 / 2^-9 = 0.75 -> 1 -> 2^-9. (Unfloored: 3 * 2^-11 / 6 rounds to an e4m3 0,
  //   s = 0, and every value becomes a NaN's ±0.)
  // Block 4: amax 11.25 -> 11.25 / 6 = 1.875 = s exactly; 2.34375 / 1.875 = 1.25, 4.6875 / 1.875 =
  //   2.5, 9.375 / 1.875 = 5: e2m1 ties, to 1, 2, 4 -> 1.875, 3.75, 7.5. (Through the reciprocal,
  //   x * fp32(1/1.875) gives 1.2500001, 2.5000002, 5.0000005 and would round all three up.)
  std::vector<float> x = block({6.375f, 0.75f}, 16);
  for (const auto& b : {block({7.0f, 1.0f, 0.84375f, 0.5625f}, 16), block({3008.0f, 448.0f}, 16),
                        block({0x1p-10f, 3 * 0x1p-11f}, 16), block({11.25f, 2.34375f, 4.6875f, 9.375f}, 16)})
    x.insert(x.end(), b.begin(), b.end());
  fp4_qdq_e4m3_16(x, 80);
  EXPECT_EQ(x[0], 6.0f);
  EXPECT_EQ(x[1], 1.0f);
  EXPECT_EQ(x[16], 6.75f);
  EXPECT_EQ(x[17], 1.125f);
  EXPECT_EQ(x[18], 1.125f);
  EXPECT_EQ(x[19], 0.5625f);
  EXPECT_EQ(x[32], 2688.0f);
  EXPECT_EQ(x[33], 448.0f);
  EXPECT_EQ(x[48], 0x1p-10f);
  EXPECT_EQ(x[49], 0x1p-9f);
  EXPECT_EQ(x[64], 11.25f);
  EXPECT_EQ(x[65], 1.875f);
  EXPECT_EQ(x[66], 3.75f);
  EXPECT_EQ(x[67], 7.5f);
}

TEST(V41Fp4E4m3, RefusesARowNotAMultipleOf16) {
  std::vector<float> x(24);
  EXPECT_THROW(fp4_qdq_e4m3_16(x, 24), std::invalid_argument);
}

// ---- stored weights ----

TEST(V41WeightDequant, Fp8WeightTakesOneScalePer32x32Tile) {
  // [33, 40]: scales [2, 2]. Every code 0x38 (1.0); scale bytes 127, 128, 129, 130 (1, 2, 4, 8).
  const int64_t out = 33, in = 40;
  std::vector<uint8_t> codes(static_cast<size_t>(out * in), 0x38), scales = {127, 128, 129, 130};
  codes[static_cast<size_t>(1 * in + 2)] = 0xC0;  // -2.0
  std::vector<float> w(codes.size());
  dequant_fp8_weight(codes, scales, out, in, w);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[static_cast<size_t>(31 * in + 31)], 1.0f);
  EXPECT_EQ(w[static_cast<size_t>(0 * in + 32)], 2.0f);
  EXPECT_EQ(w[static_cast<size_t>(32 * in + 0)], 4.0f);
  EXPECT_EQ(w[static_cast<size_t>(32 * in + 39)], 8.0f);
  EXPECT_EQ(w[static_cast<size_t>(1 * in + 2)], -2.0f);
  std::vector<uint8_t> wrong(3);
  EXPECT_THROW(dequant_fp8_weight(codes, wrong, out, in, w), std::invalid_argument);
}

TEST(V41WeightDequant, Fp4WeightTakesOneScalePer32AlongKAndTheLowNibbleFirst) {
  // [2, 64]: packed [2, 32], scales [2, 2] = 1, 2 / 4, 8. Byte 0x71 holds element 0 = code 1 (0.5)
  // and element 1 = code 7 (6).
  const int64_t out = 2, in = 64;
  std::vector<uint8_t> packed(64, 0x00), scales = {127, 128, 129, 130};
  packed[0] = 0x71;
  packed[16] = 0x2A;  // row 0, elements 32 (code 0xA = -1) and 33 (code 2 = 1)
  packed[63] = 0xF0;  // row 1, element 63: code 0xF = -6
  std::vector<float> w(static_cast<size_t>(out * in));
  dequant_fp4_weight(packed, scales, out, in, w);
  EXPECT_EQ(w[0], 0.5f);
  EXPECT_EQ(w[1], 6.0f);
  EXPECT_EQ(w[32], -2.0f);
  EXPECT_EQ(w[33], 2.0f);
  EXPECT_EQ(w[127], -48.0f);
  EXPECT_EQ(w[126], 0.0f);
}
