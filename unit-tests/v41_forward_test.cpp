// docs/v41.md §8: the v41 prefill's parts, each against an independent plain formulation on
// hand-made inputs, and the whole prefill's causality, plan roles, teacher forcing and thread
// invariance on random weights in the release's layout. No torch: the comparison with the official
// code is scripts/v41-official-compare.sh (docs/v41.md §9.4).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "reference/v41/forward.hpp"
#include "unit-tests/test_seed.hpp"
#include "reference/v41/forward_ops.hpp"
#include "models/v41/numerics.hpp"

using namespace ced;
using namespace ced::v41;
using namespace ced::v41::fwd;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const Arith kF64{V41Regime::f64};
const Arith kBf16{V41Regime::bf16};

// The seed of the random weights: printed, and replayable with CED_SEED.
uint64_t test_seed() {
  static const uint64_t seed = test::replayable_seed("v41_forward_test", 41);
  return seed;
}

// ---- random weights in the release's layout (names, dtypes, shapes of docs/v41.md §8.2) ----

struct Gen {
  std::mt19937_64 rng;
  SafetensorsFile f;
  // Mean 0, variance 1 (four uniforms, centred and scaled): cheap, and normal enough for weights.
  double normal() {
    double s = 0;
    for (int i = 0; i < 4; ++i) s += static_cast<double>(rng() >> 11) * 0x1p-53;
    return (s - 2.0) * std::sqrt(3.0);
  }

  void put(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    f.tensors.push_back({name, dtype, std::move(shape), std::move(bytes)});
  }
  void bf16(const std::string& name, std::vector<int64_t> shape, double mean, double sd) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint8_t> b(static_cast<size_t>(2 * n));
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t v = bf16_from_f32(static_cast<float>(mean + sd * normal()));
      std::memcpy(b.data() + 2 * i, &v, 2);
    }
    put(name, "BF16", std::move(shape), std::move(b));
  }
  void f32(const std::string& name, std::vector<int64_t> shape, double mean, double sd) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint8_t> b(static_cast<size_t>(4 * n));
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(mean + sd * normal());
      std::memcpy(b.data() + 4 * i, &v, 4);
    }
    put(name, "F32", std::move(shape), std::move(b));
  }
  // FP8 [out, in] with a scale per 32x32 tile: codes of N(0, 1), scale 2^-round(log2(sqrt(in))) · gain.
  void fp8(const std::string& p, int64_t out, int64_t in, double gain = 1.0) {
    std::vector<uint8_t> w(static_cast<size_t>(out * in)), s(static_cast<size_t>(((out + 31) / 32) * ((in + 31) / 32)));
    for (auto& c : w) c = e4m3_from_f32(static_cast<float>(normal()));
    const int e = static_cast<int>(std::lround(std::log2(std::sqrt(static_cast<double>(in)) / gain)));
    for (auto& c : s) c = static_cast<uint8_t>(127 - e);
    put(p + ".weight", "F8_E4M3", {out, in}, std::move(w));
    put(p + ".scale", "F8_E8M0", {(out + 31) / 32, (in + 31) / 32}, std::move(s));
  }
  // FP4 [out, in] packed in I8 with a scale per 32 along K.
  void fp4(const std::string& p, int64_t out, int64_t in) {
    std::vector<uint8_t> codes(static_cast<size_t>(out * in)), w(static_cast<size_t>(out * in / 2)),
        s(static_cast<size_t>(out * in / 32));
    for (auto& c : codes) c = e2m1_from_f32(static_cast<float>(2.0 * normal()));
    pack_fp4(codes, w);
    const int e = static_cast<int>(std::lround(std::log2(2.0 * std::sqrt(static_cast<double>(in)))));
    for (auto& c : s) c = static_cast<uint8_t>(127 - e);
    put(p + ".weight", "I8", {out, in / 2}, std::move(w));
    put(p + ".scale", "F8_E8M0", {out, in / 32}, std::move(s));
  }
};

SafetensorsFile random_weights(const V41Config& c, uint64_t seed) {
  Gen g{std::mt19937_64(seed), {}};
  const V41Plan plan = make_v41_plan(c);
  const int64_t D = c.dim, hc = c.hc_mult, nm = (2 + hc) * hc, H = c.n_heads, hd = c.head_dim;
  g.bf16("embed.weight", {c.vocab_size, D}, 0.0, 0.12);
  g.bf16("head.weight", {c.vocab_size, D}, 0.0, 1.0 / std::sqrt(static_cast<double>(D)));
  g.bf16("norm.weight", {D}, 1.0, 0.05);
  for (const LayerPlan& lp : plan.layers) {
    const std::string L = "layers." + std::to_string(lp.layer) + ".", A = L + "attn.", F = L + "ffn.";
    g.bf16(L + "attn_norm.weight", {D}, 1.0, 0.05);
    g.bf16(L + "ffn_norm.weight", {D}, 1.0, 0.05);
    for (const char* s : {"attn", "ffn"}) {
      g.f32(L + "hc_" + s + "_fn", {nm, hc * D}, 0.0, 1.0 / std::sqrt(static_cast<double>(hc * D)));
      g.f32(L + "hc_" + s + "_base", {nm}, 0.0, 0.5);
      g.f32(L + "hc_" + s + "_scale", {3}, 1.0, 0.2);
    }
    g.f32(A + "attn_sink", {H}, 0.0, 1.0);
    g.fp8(A + "wq_a", c.q_lora_rank, D);
    g.bf16(A + "q_norm.weight", {c.q_lora_rank}, 1.0, 0.05);
    g.fp8(A + "wq_b", H * hd, c.q_lora_rank);
    g.fp8(A + "wkv", hd, D);
    g.bf16(A + "kv_norm.weight", {hd}, 1.0, 0.05);
    g.fp8(A + "wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups);
    g.fp8(A + "wo_b", D, c.o_groups * c.o_lora_rank);
    if (lp.owns_compressor) {
      g.bf16(A + "compressor.wkv.weight", {hd, D}, 0.0, 1.0 / std::sqrt(static_cast<double>(D)));
      g.bf16(A + "compressor.norm.weight", {hd}, 1.0, 0.05);
    }
    if (lp.owns_wgate) g.bf16(A + "compressor.wgate.weight", {hd, D}, 0.0, 1.0 / std::sqrt(static_cast<double>(D)));
    if (lp.owns_indexer) {
      g.fp8(A + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      g.bf16(A + "indexer.weights_proj.weight", {c.index_n_heads, D}, 0.0, 1.0 / std::sqrt(static_cast<double>(D)));
    }
    if (lp.owns_index_k) {
      g.bf16(A + "indexer.wk.weight", {c.index_head_dim, hd}, 0.0, 1.0 / std::sqrt(static_cast<double>(hd)));
      g.bf16(A + "indexer.k_norm.weight", {c.index_head_dim}, 1.0, 0.05);
    }
    g.bf16(F + "gate.weight", {c.n_routed_experts, D}, 0.0, 1.0 / std::sqrt(static_cast<double>(D)));
    g.f32(F + "gate.bias", {c.n_routed_experts}, 0.0, 0.1);
    g.f32(F + "gate.bias_vl", {c.n_routed_experts}, 0.0, 0.1);
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const std::string E = F + "experts." + std::to_string(e) + ".";
      g.fp4(E + "w1", c.moe_inter_dim, D);
      g.fp4(E + "w3", c.moe_inter_dim, D);
      g.fp4(E + "w2", D, c.moe_inter_dim);
    }
    g.fp8(F + "shared_experts.w1", c.moe_inter_dim, D);
    g.fp8(F + "shared_experts.w3", c.moe_inter_dim, D);
    g.fp8(F + "shared_experts.w2", D, c.moe_inter_dim);
    if (lp.engram) {
      size_t k = 0;
      while (c.engram_layer_ids[k] != lp.layer) ++k;
      const int64_t rows = c.engram_num_embeddings[k], ed = c.engram_head_dim;
      const int64_t cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
      std::vector<uint8_t> t(static_cast<size_t>(rows * ed)), s(static_cast<size_t>(rows * ed / 32), 127 - 3);
      for (auto& v : t) v = e4m3_from_f32(static_cast<float>(g.normal()));
      g.put(L + "engram.embed.weight", "F8_E4M3", {rows, ed}, std::move(t));
      g.put(L + "engram.embed.scale", "F8_E8M0", {rows, ed / 32}, std::move(s));
      g.fp8(L + "engram.wkv", (hc + 1) * D, cols * ed, 0.5);
      g.bf16(L + "engram.q_weight", {hc, D}, 1.0, 0.05);
      g.bf16(L + "engram.k_weight", {hc, D}, 1.0, 0.05);
    }
  }
  return g.f;
}

V41EngramHashing hashing_for(const V41Config& c) {
  V41EngramHashing h;
  h.token_map = v41_halving_token_map(c);
  for (size_t l = 0; l < c.engram_layer_ids.size(); ++l) {
    std::vector<int64_t> m;
    for (int64_t s = 0; s < c.engram_max_ngram_size; ++s) m.push_back(2 * (1000003 * static_cast<int64_t>(l + 1) + 7919 * s) + 1);
    h.multipliers.push_back(m);
  }
  return h;
}

std::vector<int64_t> random_tokens(int64_t N, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> t(static_cast<size_t>(N));
  for (auto& v : t) v = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

// One tiny model per regime, built once (the weights take a moment to generate).
const V41Model& tiny_model(V41Regime r) {
  static const V41Config c = v41_builtin_config("v41-tiny");
  static const SafetensorsFile w = random_weights(c, test_seed());
  static const V41Model f64(c, w, V41Regime::f64), bf16(c, w, V41Regime::bf16), release(c, w, V41Regime::release);
  return r == V41Regime::f64 ? f64 : r == V41Regime::bf16 ? bf16 : release;
}

}  // namespace

// ---- mHC (docs/v41.md §8.3) ----

// A plain Sinkhorn in double: softmax rows + eps, a column normalisation, then iters - 1 (row,
// column) rounds, each divisor + eps.
TEST(V41Mhc, SinkhornMatchesThePlainIterationAndIsDoublyStochastic) {
  const int64_t hc = 4, iters = 20;
  const double eps = 1e-6;
  std::mt19937_64 rng(test_seed());
  std::normal_distribution<double> nd(0.0, 2.0);
  std::vector<double> m(24), scale{0.7, 1.3, 0.9}, base(24);
  for (auto& v : m) v = nd(rng);
  for (auto& v : base) v = nd(rng) * 0.3;
  std::vector<double> pre(4), post(4), comb(16);
  hc_split_sinkhorn(kF64, m.data(), hc, scale, base, iters, eps, pre.data(), post.data(), comb.data());

  double c[4][4];
  for (int i = 0; i < 4; ++i) {
    double mx = -kInf, s = 0;
    for (int j = 0; j < 4; ++j) mx = std::max(mx, m[8 + 4 * i + j] * scale[2] + base[8 + 4 * i + j]);
    for (int j = 0; j < 4; ++j) s += c[i][j] = std::exp(m[8 + 4 * i + j] * scale[2] + base[8 + 4 * i + j] - mx);
    for (int j = 0; j < 4; ++j) c[i][j] = c[i][j] / s + eps;
  }
  auto cols = [&] {
    for (int j = 0; j < 4; ++j) {
      const double s = c[0][j] + c[1][j] + c[2][j] + c[3][j] + eps;
      for (int i = 0; i < 4; ++i) c[i][j] /= s;
    }
  };
  auto rows = [&] {
    for (int i = 0; i < 4; ++i) {
      const double s = c[i][0] + c[i][1] + c[i][2] + c[i][3] + eps;
      for (int j = 0; j < 4; ++j) c[i][j] /= s;
    }
  };
  cols();
  for (int it = 0; it < iters - 1; ++it) rows(), cols();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(pre[i], 1.0 / (1.0 + std::exp(-(m[i] * scale[0] + base[i]))) + eps) << i;
    EXPECT_EQ(post[i], 2.0 * (1.0 / (1.0 + std::exp(-(m[4 + i] * scale[1] + base[4 + i]))))) << i;
    for (int j = 0; j < 4; ++j) EXPECT_EQ(comb[4 * i + j], c[i][j]) << i << "," << j;
  }
  // Ends on a column normalisation: each column sums to 1 - eps·(1/colsum) ≈ 1 within 4·eps; rows
  // are within the Sinkhorn residual of 1 after 20 rounds (1e-4 is loose for these inputs).
  for (int k = 0; k < 4; ++k) {
    double cs = 0, rs = 0;
    for (int l = 0; l < 4; ++l) cs += comb[4 * l + k], rs += comb[4 * k + l];
    EXPECT_NEAR(cs, 1.0, 4 * eps) << "column " << k;
    EXPECT_NEAR(rs, 1.0, 1e-4) << "row " << k;
  }
}

TEST(V41Mhc, CollapseAndExpandAreThePlainSums) {
  const int64_t N = 2, hc = 4, D = 3;
  std::vector<double> X(N * hc * D), pre(N * hc), post(N * hc), comb(N * hc * hc), y(N * D);
  for (size_t i = 0; i < X.size(); ++i) X[i] = 0.25 * static_cast<double>(i) - 2.0;
  for (size_t i = 0; i < pre.size(); ++i) pre[i] = 0.1 * static_cast<double>(i + 1), post[i] = 2.0 - 0.2 * static_cast<double>(i);
  for (size_t i = 0; i < comb.size(); ++i) comb[i] = 0.03 * static_cast<double>(i % 7);
  for (size_t i = 0; i < y.size(); ++i) y[i] = 1.5 - static_cast<double>(i);
  const auto col = hc_pre(kF64, X, pre, N, hc, D);
  const auto out = hc_post(kF64, y, X, post, comb, N, hc, D);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t d = 0; d < D; ++d) {
      double s = 0;
      for (int64_t i = 0; i < hc; ++i) s += pre[t * hc + i] * X[(t * hc + i) * D + d];
      EXPECT_EQ(col[t * D + d], s);
      for (int64_t j = 0; j < hc; ++j) {
        double r = 0;  // out_j = post_j · y + Σ_i comb[i, j] · X_i
        for (int64_t i = 0; i < hc; ++i) r += comb[(t * hc + i) * hc + j] * X[(t * hc + i) * D + d];
        EXPECT_EQ(out[(t * hc + j) * D + d], post[t * hc + j] * y[t * D + d] + r) << t << " " << j << " " << d;
      }
    }
}

// ---- MoE (docs/v41.md §9.1) ----

TEST(V41Moe, GateSelectsByBiasedScoresAndWeighsByUnbiasedOnes) {
  // Logits 0.5, 2, 1, 25 (softplus is the identity above 20), bias favouring expert 0.
  const std::vector<double> logits{0.5, 2.0, 1.0, 25.0}, bias{3.0, 0.0, 0.0, 0.0};
  std::vector<int64_t> ex(2);
  std::vector<double> w(2);
  gate_weights(kF64, logits, bias, 2, 1.0, true, 1.5, "sqrtsoftplus", ex, w);
  auto score = [](double x) { return std::sqrt(x > 20 ? x : std::log1p(std::exp(x))); };
  // biased: 3 + s(0.5) = 3.97, s(2) = 1.45, s(1) = 1.15, s(25) = 5: experts 3 and 0.
  std::vector<int64_t> sorted = ex;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{0, 3}));
  const double s0 = score(0.5), s3 = score(25.0);
  for (int j = 0; j < 2; ++j)
    EXPECT_EQ(w[static_cast<size_t>(j)], (ex[static_cast<size_t>(j)] == 0 ? s0 : s3) / (s0 + s3 + 1e-20) * 1.5);
}

TEST(V41Moe, GateRenormalisesWithTheLiteral1eMinus20) {
  // Logits -100: softplus = e^-100, scores e^-50 ≈ 1.9e-22, so the 1e-20 in the divisor dominates:
  // each weight is s / (2s + 1e-20) · 1.5 ≈ 0.028, not 0.75.
  const std::vector<double> logits{-100.0, -100.0, -200.0}, bias{0.0, 0.0, 0.0};
  std::vector<int64_t> ex(2);
  std::vector<double> w(2);
  gate_weights(kF64, logits, bias, 2, 1.0, true, 1.5, "sqrtsoftplus", ex, w);
  const double s = std::sqrt(std::log1p(std::exp(-100.0)));
  EXPECT_EQ(w[0], s / (s + s + 1e-20) * 1.5);
  EXPECT_LT(w[0], 0.05);
}

TEST(V41Moe, SwigluClampsUpOnBothSidesAndTheGateFromAboveOnly) {
  const std::vector<double> g{15.0, -15.0, 2.0, 9.0}, u{-12.0, 3.0, 12.0, -9.0};
  std::vector<double> h(4);
  const double route = 0.75;
  swiglu(kF64, g, u, 10.0, &route, h);
  auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
  EXPECT_EQ(h[0], route * (silu(10.0) * -10.0));
  EXPECT_EQ(h[1], route * (silu(-15.0) * 3.0));
  EXPECT_EQ(h[2], route * (silu(2.0) * 10.0));
  EXPECT_EQ(h[3], route * (silu(9.0) * -9.0));
}

// ---- RoPE and YaRN (docs/v41.md §8.4) ----

TEST(V41Rope, TablesFollowTheYarnRampOnCompressedLayersOnly) {
  const V41Config c = v41_builtin_config("v41-tiny");
  const int64_t d = c.rope_head_dim, N = 40;
  const auto yarn = rope_table(kF64, d, N, c.original_seq_len, c.compress_rope_theta, c.rope_factor, c.beta_fast,
                               c.beta_slow);
  const auto swa = rope_table(kF64, d, N, 0, c.rope_theta, c.rope_factor, c.beta_fast, c.beta_slow);
  // The plain YaRN of precompute_freqs_cis: low = floor(cd(32)), high = ceil(cd(1)) with
  // cd(r) = d ln(orig / (2π r)) / (2 ln θ); ramp = clamp((i - low) / (high - low)); f = f / factor
  // on the ramp's 1 end.
  auto cd = [&](double r) {
    return d * std::log(static_cast<double>(c.original_seq_len) / (r * 2 * std::numbers::pi)) / (2 * std::log(c.compress_rope_theta));
  };
  const double low = std::max(std::floor(cd(32)), 0.0), high = std::min(std::ceil(cd(1)), static_cast<double>(d - 1));
  for (int64_t p : {0, 1, 7, 39})
    for (int64_t i = 0; i < d / 2; ++i) {
      const double base_f = 1.0 / std::pow(c.compress_rope_theta, static_cast<double>(2 * i) / static_cast<double>(d));
      const double ramp = std::clamp((static_cast<double>(i) - low) / std::max(high - low, 1e-3), 0.0, 1.0);
      const double f = base_f / c.rope_factor * ramp + base_f * (1 - ramp);
      EXPECT_NEAR(yarn.cos[p * d / 2 + i], std::cos(static_cast<double>(p) * f), 1e-15) << p << " " << i;
      EXPECT_NEAR(yarn.sin[p * d / 2 + i], std::sin(static_cast<double>(p) * f), 1e-15) << p << " " << i;
      const double fs = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(d));
      EXPECT_NEAR(swa.cos[p * d / 2 + i], std::cos(static_cast<double>(p) * fs), 1e-15) << p << " " << i;
    }
  // The ramp is not trivial for tiny: some frequency is divided, some kept.
  EXPECT_GT(high, low);
}

TEST(V41Rope, InverseRotationUndoesTheRotationOfTheTail) {
  const auto t = rope_table(kF64, 16, 10, 32, 160000.0, 4.0, 32, 1);
  std::vector<double> x(64), y;
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<double>(i) * 0.7);
  y = x;
  apply_rope(kF64, y.data(), 64, t, 9, false);
  for (size_t i = 0; i < 48; ++i) EXPECT_EQ(y[i], x[i]) << "the first head_dim - rope_head_dim are not rotated";
  EXPECT_NE(y[63], x[63]);
  apply_rope(kF64, y.data(), 64, t, 9, true);
  for (size_t i = 48; i < 64; ++i) EXPECT_NEAR(y[i], x[i], 1e-15) << i;
}

// ---- the compressor, the window and the candidate pool (docs/v41.md §8.5, §8.6) ----

TEST(V41Compressor, PoolingIsASoftmaxWeightedSumOverEachGroupAndTheRemainderWaits) {
  const int64_t N = 5, d = 3, r = 2;  // groups {0, 1}, {2, 3}; token 4 waits
  std::vector<double> kv(N * d), sc(N * d);
  for (int64_t i = 0; i < N * d; ++i) kv[i] = 0.5 * static_cast<double>(i) - 3.0, sc[i] = std::cos(static_cast<double>(i));
  const auto out = compress_pool(kF64, kv, sc, N, d, r);
  ASSERT_EQ(out.size(), static_cast<size_t>(2 * d));
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t c = 0; c < d; ++c) {
      const double s0 = sc[(2 * g) * d + c], s1 = sc[(2 * g + 1) * d + c], m = std::max(s0, s1);
      const double e0 = std::exp(s0 - m), e1 = std::exp(s1 - m);
      EXPECT_EQ(out[g * d + c], kv[(2 * g) * d + c] * (e0 / (e0 + e1)) + kv[(2 * g + 1) * d + c] * (e1 / (e0 + e1)));
    }
}

TEST(V41Window, PrefillWindowIndicesAreTheLastWPositions) {
  const auto idx = window_topk_idxs(5, 3);
  const std::vector<int32_t> want{0, -1, -1, 0, 1, -1, 0, 1, 2, 1, 2, 3, 2, 3, 4};
  EXPECT_EQ(idx, want);
  EXPECT_EQ(window_topk_idxs(2, 4), (std::vector<int32_t>{0, -1, 0, 1}));  // N < W: N columns
}

TEST(V41Candidates, KeepsTheTopBlocksPinsTheNewestAndDropsUnreachableOnes) {
  // 11 positions in blocks of 4 (the last padded); visible 9: positions 9, 10 unreachable (-inf).
  std::vector<double> s{0.1, 0.9, 0.2, 0.3, /**/ 0.5, 0.4, 0.0, 0.1, /**/ 0.05, -kInf, -kInf};
  std::vector<uint8_t> mask(s.size());
  // Top 2 blocks: block 2 is pinned (it holds position 8 = visible - 1), then block 0 (max 0.9).
  candidate_blocks(s, 9, 2, 4, false, mask);
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1}));
  // Visible 2: only block 0 is reachable; asking for 3 blocks keeps it alone.
  std::vector<double> s2{0.3, 0.2, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf};
  std::vector<uint8_t> m2(s2.size());
  candidate_blocks(s2, 2, 3, 4, false, m2);
  EXPECT_EQ(m2, (std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0, 0}));
  // Visible 8, a multiple of the block: the newest position 7 is in block 1, which is pinned although
  // block 2 (positions 8.., unreachable) is not, and block 0 outscores it.
  std::vector<double> s4{0.9, 0.8, 0.7, 0.6, /**/ 0.1, 0.1, 0.1, 0.1, /**/ -kInf, -kInf, -kInf, -kInf};
  std::vector<uint8_t> m4(s4.size());
  candidate_blocks(s4, 8, 1, 4, false, m4);
  EXPECT_EQ(m4, (std::vector<uint8_t>{0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0}));
  // Visible 0 pins nothing, and nothing is reachable.
  std::vector<double> s3(8, -kInf);
  std::vector<uint8_t> m3(8);
  candidate_blocks(s3, 0, 2, 4, false, m3);
  EXPECT_EQ(m3, std::vector<uint8_t>(8, 0));
}

TEST(V41Topk, DistinctValuesGiveTheLargest) {
  const std::vector<double> v{0.3, 0.9, -1.0, 0.5, 0.9, 0.1};
  auto top = torch_topk(v, 3, false, true);
  std::sort(top.begin(), top.end());
  EXPECT_EQ(top, (std::vector<int64_t>{1, 3, 4}));
  // 64·k <= n: partial_sort, which returns the k largest in order.
  std::vector<double> w(128, 0.0);
  w[100] = 2.0, w[5] = 1.5, w[77] = 1.0;
  EXPECT_EQ(torch_topk(w, 2, true, true), (std::vector<int64_t>{100, 5}));
}

// ---- sparse attention (docs/v41.md §8.5) ----

TEST(V41SparseAttn, OnlineSoftmaxEqualsThePlainSoftmaxWithTheSinkInTheDenominator) {
  const int64_t N = 2, H = 2, d = 4, rows = 70, k = 70;  // two blocks of the online softmax
  std::vector<double> q(N * H * d), kv(rows * d), sink{0.5, -2.0}, out(N * H * d);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(1.3 * static_cast<double>(i));
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(0.37 * static_cast<double>(i));
  std::vector<int32_t> idx(N * k);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) idx[t * k + j] = (j % 5 == 3) ? -1 : static_cast<int32_t>((j * 7 + t) % rows);
  sparse_attn(kF64, q, N, H, d, kv, sink, idx, k, 0.5, out);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double mx = -kInf;
      std::vector<double> l(k, -kInf);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = idx[t * k + j];
        if (p < 0) continue;
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += q[(t * H + h) * d + c] * kv[p * d + c];
        mx = std::max(mx, l[j] = 0.5 * s);
      }
      double den = std::exp(sink[h] - mx);
      std::vector<double> num(d, 0.0);
      for (int64_t j = 0; j < k; ++j) {
        if (idx[t * k + j] < 0) continue;
        const double e = std::exp(l[j] - mx);
        den += e;
        for (int64_t c = 0; c < d; ++c) num[c] += e * kv[idx[t * k + j] * d + c];
      }
      // Two orders of the same double sums (one rescale at the block edge): 1e-14 is ~50 double ulps.
      for (int64_t c = 0; c < d; ++c) EXPECT_NEAR(out[(t * H + h) * d + c], num[c] / den, 1e-14) << t << " " << h << " " << c;
    }
  // A row with no valid index gives exact zeros (the running max starts at -1e30, not -inf).
  std::vector<int32_t> none(N * k, -1);
  sparse_attn(kF64, q, N, H, d, kv, sink, none, k, 0.5, out);
  for (double v : out) EXPECT_EQ(v, 0.0);
}

// ---- the release regime's block-scaled linear (docs/v41.md §8.1) ----

TEST(V41Release, BlockScaledLinearSumsFp32PartialsPer32InKOrderOverQuantizedInputs) {
  const int64_t M = 3, K = 64, N = 5;
  std::mt19937_64 rng(test_seed());
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> X(M * K);
  for (auto& v : X) v = round_bf16(static_cast<float>(nd(rng)));
  X[7] = 300.0;  // a block whose scale is not 1
  // An FP8 weight: e4m3 codes times one scale per 32x32 tile (2^-3 and 2^-5 for the two K tiles).
  V41Linear w;
  w.out = N, w.in = K, w.kind = V41Linear::Kind::Fp8Tiles, w.scale = {0x1p-3, 0x1p-5};
  for (int64_t o = 0; o < N; ++o)
    for (int64_t k = 0; k < K; ++k) w.w.push_back(f32_from_e4m3(e4m3_from_f32(static_cast<float>(nd(rng)))) * w.scale[k / 32]);
  std::vector<double> Y(M * N), Yb(M * N);
  const Arith rel(V41Regime::release);
  linear_w(rel, X, M, w, Y, true);
  linear_w(kBf16, X, M, w, Yb, true);  // the bf16 regime: no input quantization
  // The plain formula: each row's blocks quantized (s = 2^ceil(log2(amax/448)), codes e4m3(x/s)),
  // per block p = Σ code_a·code_w (float, K order), acc += p·s_a·s_w (float), bf16 at the end.
  bool differs_from_bf16 = false;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < N; ++o) {
      float acc = 0;
      for (int64_t b = 0; b < 2; ++b) {
        float amax = 1e-4f;
        for (int64_t k = 32 * b; k < 32 * b + 32; ++k) amax = std::max(amax, static_cast<float>(std::fabs(X[m * K + k])));
        const float sa = ue8m0_scale(amax, kFp8MaxInv);
        float p = 0;
        for (int64_t k = 32 * b; k < 32 * b + 32; ++k)
          p += f32_from_e4m3(e4m3_from_f32(static_cast<float>(X[m * K + k]) / sa)) * static_cast<float>(w.w[o * K + k] / w.scale[b]);
        acc += p * sa * static_cast<float>(w.scale[b]);
      }
      EXPECT_EQ(Y[m * N + o], round_bf16(acc)) << m << " " << o;
      differs_from_bf16 |= Y[m * N + o] != Yb[m * N + o];
    }
  EXPECT_TRUE(differs_from_bf16) << "the input's FP8 rounding must show";
}

TEST(V41Release, BlockScaledLinearIsBitwiseTheSameOnOneAndThreeThreads) {
  // Past the parallel threshold, with fp32 outputs (no bf16 rounding to hide a different sum).
  const int64_t M = 40, K = 1024, N = 64;
  ASSERT_GT(M * K * N, kParallelWork);
  std::mt19937_64 rng(test_seed() + 5);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> X(M * K);
  for (auto& v : X) v = round_bf16(static_cast<float>(nd(rng)));
  V41Linear w;
  w.out = N, w.in = K, w.kind = V41Linear::Kind::Fp4Rows;
  for (int64_t o = 0; o < N; ++o)
    for (int64_t b = 0; b < K / 32; ++b) w.scale.push_back(std::ldexp(1.0, -static_cast<int>(rng() % 4)));
  for (int64_t o = 0; o < N; ++o)
    for (int64_t k = 0; k < K; ++k)
      w.w.push_back(f32_from_e2m1(e2m1_from_f32(static_cast<float>(2 * nd(rng)))) * w.scale[o * (K / 32) + k / 32]);
  const Arith rel(V41Regime::release);
  const int saved = omp_get_max_threads();
  std::vector<double> y1(M * N), y3(M * N);
  omp_set_num_threads(1);
  linear_w(rel, X, M, w, y1, false);
  omp_set_num_threads(3);
  linear_w(rel, X, M, w, y3, false);
  omp_set_num_threads(saved);
  EXPECT_EQ(y1, y3);
}

// ---- the vector kernels against the scalar loops they replace (bit for bit) ----

namespace {

// linear_w as one scalar loop per output: Σ_k x·w in k order (Arith's roundings), or in the release
// regime on FP8/FP4 the block-scaled sum over act_quant's codes.
std::vector<double> scalar_linear_w(const Arith& a, const std::vector<double>& X, int64_t M, const V41Linear& w,
                                    bool out_bf16) {
  const int64_t K = w.in, N = w.out, nb = K / 32, tiles_in = (K + 31) / 32;
  std::vector<double> Y(M * N);
  std::vector<float> xf(X.begin(), X.end()), xs(M * nb);
  std::vector<uint8_t> codes(xf.size());
  const bool blocks = a.release && w.kind != V41Linear::Kind::Plain;
  if (blocks) act_quant(xf, K, codes, xs);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < N; ++o) {
      double acc = 0.0;
      if (!blocks)
        for (int64_t k = 0; k < K; ++k) acc = a.add(acc, a.mul(X[m * K + k], w.w[o * K + k]));
      for (int64_t b = 0; blocks && b < nb; ++b) {
        const double ws = w.kind == V41Linear::Kind::Fp8Tiles ? w.scale[(o / 32) * tiles_in + b] : w.scale[o * nb + b];
        double part = 0.0;
        for (int64_t k = b * 32; k < (b + 1) * 32; ++k)
          part = a.add(part, a.mul(f32_from_e4m3(codes[m * K + k]), w.w[o * K + k] / ws));
        acc = a.add(acc, a.mul(a.mul(part, xs[m * nb + b]), ws));
      }
      Y[m * N + o] = out_bf16 ? a.bf(acc) : acc;
    }
  return Y;
}

V41Linear random_linear(V41Linear::Kind kind, int64_t N, int64_t K, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  V41Linear w;
  w.out = N, w.in = K, w.kind = kind;
  const int64_t tiles = kind == V41Linear::Kind::Fp8Tiles ? ((N + 31) / 32) * ((K + 31) / 32) : N * (K / 32);
  for (int64_t i = 0; kind != V41Linear::Kind::Plain && i < tiles; ++i)
    w.scale.push_back(std::ldexp(1.0, -static_cast<int>(rng() % 6)));
  for (int64_t o = 0; o < N; ++o)
    for (int64_t k = 0; k < K; ++k) {
      const float v = static_cast<float>(nd(rng));
      if (kind == V41Linear::Kind::Plain) w.w.push_back(v);
      const double s = kind == V41Linear::Kind::Fp8Tiles ? w.scale[(o / 32) * ((K + 31) / 32) + k / 32]
                       : kind == V41Linear::Kind::Fp4Rows ? w.scale[o * (K / 32) + k / 32] : 1.0;
      if (kind == V41Linear::Kind::Fp8Tiles) w.w.push_back(f32_from_e4m3(e4m3_from_f32(v)) * s);
      if (kind == V41Linear::Kind::Fp4Rows) w.w.push_back(f32_from_e2m1(e2m1_from_f32(2 * v)) * s);
    }
  return w;
}

}  // namespace

TEST(V41Kernels, LinearWGivesTheScalarLoopsBitsForEveryShapeRegimeAndKind) {
  // Rows past one panel and not a multiple of the register block, outputs past one and two column
  // blocks and not a multiple of a vector; packed once (as a model does) and packed for the call.
  std::mt19937_64 rng(test_seed() + 11);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (auto kind : {V41Linear::Kind::Plain, V41Linear::Kind::Fp8Tiles, V41Linear::Kind::Fp4Rows})
    for (int64_t M : {1, 5, 70})
      for (int64_t N : {1, 17, 40})
        for (int64_t K : {32, 96}) {
          V41Linear w = random_linear(kind, N, K, rng);
          std::vector<double> X(M * K);
          for (auto& v : X) v = static_cast<float>(3 * nd(rng));  // fp32: an order change shows
          for (V41Regime r : {V41Regime::f64, V41Regime::bf16, V41Regime::release}) {
            const Arith a(r);
            for (bool out_bf16 : {false, true}) {
              const auto want = scalar_linear_w(a, X, M, w, out_bf16);
              std::vector<double> got(M * N);
              w.packed = {};
              linear_w(a, X, M, w, got, out_bf16);
              EXPECT_EQ(got, want) << v41_regime_name(r) << " M " << M << " N " << N << " K " << K;
              pack_linear(a, w);
              linear_w(a, X, M, w, got, out_bf16);
              EXPECT_EQ(got, want) << "packed, " << v41_regime_name(r) << " M " << M << " N " << N << " K " << K;
            }
          }
        }
}

namespace {

// sparse_attn as one scalar loop per (query, head): the online softmax over blocks of 64.
std::vector<double> scalar_sparse_attn(const Arith& a, const std::vector<double>& q, int64_t N, int64_t H, int64_t d,
                                       const std::vector<double>& kv, const std::vector<double>& sink,
                                       const std::vector<int32_t>& idxs, int64_t k, double softmax_scale) {
  const double scale = a.c(softmax_scale);
  std::vector<double> out(N * H * d), s(64), acc(d);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::fill(acc.begin(), acc.end(), 0.0);
      double mx = a.c(-1e30), sum = 0.0;
      for (int64_t b = 0; b < k; b += 64) {
        const int64_t nb = std::min<int64_t>(64, k - b);
        double bmax = -kInf;
        for (int64_t j = 0; j < nb; ++j) {
          const int32_t p = idxs[t * k + b + j];
          double dot = -kInf;
          if (p >= 0) {
            dot = 0.0;
            for (int64_t c = 0; c < d; ++c) dot = a.add(dot, a.mul(q[(t * H + h) * d + c], kv[p * d + c]));
          }
          bmax = std::max(bmax, s[j] = a.mul(dot, scale));
        }
        const double prev = mx;
        mx = std::max(prev, bmax);
        const double rescale = a.exp(a.sub(prev, mx));
        double psum = 0.0;
        for (int64_t j = 0; j < nb; ++j) psum = a.add(psum, s[j] = a.exp(a.sub(s[j], mx)));
        sum = a.add(a.mul(sum, rescale), psum);
        for (int64_t c = 0; c < d; ++c) {
          double pv = 0.0;
          for (int64_t j = 0; j < nb; ++j)
            if (idxs[t * k + b + j] >= 0) pv = a.add(pv, a.mul(a.bf(s[j]), kv[idxs[t * k + b + j] * d + c]));
          acc[c] = a.add(a.mul(acc[c], rescale), pv);
        }
      }
      sum = a.add(sum, a.exp(a.sub(sink[h], mx)));
      for (int64_t c = 0; c < d; ++c) out[(t * H + h) * d + c] = a.bf(a.div(acc[c], sum));
    }
  return out;
}

}  // namespace

TEST(V41Kernels, SparseAttnGivesTheScalarLoopsBitsForWindowAndScatteredLists) {
  // A channel count that is not a multiple of a vector, lists of one and three blocks (the last
  // partial), window-like lists (consecutive rows, -1 past the query) and scattered ones.
  const int64_t N = 6, H = 3, d = 37, rows = 150;
  std::mt19937_64 rng(test_seed() + 12);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> q(N * H * d), kv(rows * d), sink{0.3, -1.0, 2.0};
  // fp32 values (not bf16), so that every product has more bits than a sum keeps and a change of
  // summation order shows.
  for (auto& v : q) v = static_cast<float>(nd(rng));
  for (auto& v : kv) v = static_cast<float>(nd(rng));
  for (int64_t k : {40, 150}) {
    std::vector<int32_t> window(N * k), scattered(N * k);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < k; ++j) {
        window[t * k + j] = j <= 20 * t + 5 ? static_cast<int32_t>(j) : -1;
        scattered[t * k + j] = (j % 7 == 2) ? -1 : static_cast<int32_t>((j * 37 + t * 11) % rows);
      }
    for (V41Regime r : {V41Regime::f64, V41Regime::bf16})
      for (const auto* idx : {&window, &scattered}) {
        const Arith a(r);
        std::vector<double> got(N * H * d);
        sparse_attn(a, q, N, H, d, kv, sink, *idx, k, 0.4, got);
        EXPECT_EQ(got, scalar_sparse_attn(a, q, N, H, d, kv, sink, *idx, k, 0.4))
            << v41_regime_name(r) << " k " << k << (idx == &window ? " window" : " scattered");
      }
  }
}

TEST(V41Kernels, QuantizersPer32GiveTheFp32FunctionsBits) {
  // qdq_fp8_32 and qdq_fp4_32 under the emulating regimes run as vector kernels; act_qdq and
  // fp4_qdq_ue8m0_32 are the scalar definitions. Blocks at many scales (their amax below, at and
  // above each floor), the grids' midpoints times a power of two, and the special values.
  std::mt19937_64 rng(test_seed() + 13);
  std::normal_distribution<double> nd(0.0, 1.0);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> x;
  for (int scale = -140; scale <= 120; scale += 5)
    for (int i = 0; i < 64; ++i) x.push_back(round_bf16(static_cast<float>(std::ldexp(nd(rng), scale))));
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.5f, 1.0625f, 1.1875f, 500.0f, 3 * 0x1p-10f};
  for (int p = -8; p <= 8; p += 4)
    for (float m : mids) {
      x.push_back(std::ldexp(m, p));
      x.push_back(-std::ldexp(m, p));
    }
  for (float v : {0.0f, -0.0f, nan, -nan, inf, -inf, 0x1p-149f, -0x1p-130f, 3e38f}) {
    x.push_back(v);
    for (int i = 0; i < 31; ++i) x.push_back(static_cast<float>(nd(rng)));  // one special per block
  }
  x.resize((x.size() + 63) / 64 * 64, 0.5f);
  const auto same_bits = [](const std::vector<float>& want, const std::vector<double>& got, const char* what) {
    for (size_t i = 0; i < want.size(); ++i) {
      const float g = static_cast<float>(got[i]);
      EXPECT_EQ(std::memcmp(&g, &want[i], sizeof g), 0) << what << " " << i << ": " << g << " vs " << want[i];
    }
  };
  for (V41Regime r : {V41Regime::bf16, V41Regime::release}) {
    const Arith a(r);
    std::vector<float> w8 = x, w4 = x;
    act_qdq(w8, 64);
    fp4_qdq_ue8m0_32(w4, 64);
    std::vector<double> g8(x.begin(), x.end()), g4 = g8;
    qdq_fp8_32(a, g8, 64);
    qdq_fp4_32(a, g4, 64);
    same_bits(w8, g8, "fp8");
    same_bits(w4, g4, "fp4");
  }
  std::vector<double> odd(48, 1.0);
  EXPECT_THROW(qdq_fp8_32(Arith(V41Regime::bf16), odd, 48), std::invalid_argument);
}

// ---- the f64 quantization points (docs/v41.md §3.8) ----

TEST(V41QdqF64, DoubleQuantizersAgreeWithTheFp32OnesOnBf16Values) {
  std::mt19937_64 rng(test_seed());
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int scale = -12; scale <= 12; scale += 4) {
    std::vector<float> x32(256);
    for (auto& v : x32) v = round_bf16(static_cast<float>(std::ldexp(nd(rng), scale)));
    std::vector<double> x64(x32.begin(), x32.end());
    auto a32 = x32, b32 = x32;
    auto a64 = x64, b64 = x64;
    act_qdq(a32, 64);
    act_qdq_f64(a64, 64);
    fp4_qdq_ue8m0_32(b32, 64);
    fp4_qdq_ue8m0_32_f64(b64, 64);
    for (size_t i = 0; i < x32.size(); ++i) {
      EXPECT_EQ(a64[i], a32[i]) << "fp8 " << scale << " " << i;
      EXPECT_EQ(b64[i], b32[i]) << "fp4 " << scale << " " << i;
    }
  }
  // The scale rule at and around a power of two: 2^ceil(log2 p), so p = 0.5 stays 0.5, 0.75 goes to 1.
  EXPECT_EQ(ue8m0_scale_f64(0.5, 1.0), 0.5);
  EXPECT_EQ(ue8m0_scale_f64(0.75, 1.0), 1.0);
  EXPECT_EQ(ue8m0_scale_f64(896.0, 1.0 / 448.0), 2.0);
  // The grids' midpoints go to the even code: e4m3 1 + 1/16 -> 1, 1 + 3/16 -> 1.25; e2m1 as §2.4.
  EXPECT_EQ(e4m3_round_f64(1.0625), 1.0);
  EXPECT_EQ(e4m3_round_f64(1.1875), 1.25);
  EXPECT_EQ(e4m3_round_f64(500.0), 448.0);
  EXPECT_EQ(e4m3_round_f64(3 * 0x1p-10), 0x1p-8);  // subnormal step 2^-9: 1.5 steps -> 2 steps
  const double mids[] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0}, to[] = {0, 1, 1, 2, 2, 4, 4};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(e2m1_round_f64(mids[i]), to[i]) << mids[i];
  EXPECT_EQ(e2m1_round_f64(7.0), 6.0);
  EXPECT_TRUE(std::signbit(e2m1_round_f64(-0.1)));
}

// ---- the whole prefill on random weights (docs/v41.md §9.3) ----

TEST(V41Prefill, IsCausalEveryCaptureOfAPositionIgnoresLaterTokens) {
  for (V41Regime r : {V41Regime::f64, V41Regime::bf16}) {
    const V41Model& m = tiny_model(r);
    const int64_t N = 19, cut = 11;  // odd N (a ratio-2 remainder), N > window 16
    auto tokens = random_tokens(N, m.config().vocab_size, test_seed() + 1);
    const auto a = m.forward(tokens, hashing_for(m.config()));
    for (int64_t t = cut; t < N; ++t) tokens[t] = (tokens[t] + 17) % m.config().vocab_size;
    const auto b = m.forward(tokens, hashing_for(m.config()));
    const int64_t D = m.config().dim, hc = m.config().hc_mult, V = m.config().vocab_size;
    for (size_t l = 0; l < a.layers.size(); ++l) {
      const auto& x = a.layers[l];
      const auto& y = b.layers[l];
      for (int64_t i = 0; i < cut * hc * D; ++i) ASSERT_EQ(x.out[i], y.out[i]) << v41_regime_name(r) << " layer " << l;
      if (!x.topk_idxs.empty()) {
        for (int64_t i = 0; i < cut * x.topk; ++i) ASSERT_EQ(x.topk_idxs[i], y.topk_idxs[i]) << "layer " << l;
      }
      bool later_differs = false;
      for (size_t i = static_cast<size_t>(cut * hc * D); i < x.out.size(); ++i) later_differs |= x.out[i] != y.out[i];
      EXPECT_TRUE(later_differs) << "layer " << l << ": the changed tokens must show";
    }
    for (int64_t i = 0; i < cut * V; ++i) ASSERT_EQ(a.logits[i], b.logits[i]) << v41_regime_name(r);
  }
}

TEST(V41Prefill, ReuseLayersAttendWithTheirSourcesSelectionAndReindexStaysInTheCandidatePool) {
  const V41Model& m = tiny_model(V41Regime::bf16);
  const int64_t N = 23;
  const auto r = m.forward(random_tokens(N, m.config().vocab_size, test_seed() + 2), hashing_for(m.config()));
  const V41Plan& p = m.plan();
  int64_t reindexed = 0;
  for (const LayerPlan& lp : p.layers) {
    const auto& c = r.layers[static_cast<size_t>(lp.layer)];
    EXPECT_EQ(!c.topk_idxs.empty(), lp.owns_indexer) << lp.layer;
    EXPECT_EQ(!c.compress_kv.empty(), lp.owns_compressor) << lp.layer;
    if (lp.role != Role::Reindex) continue;
    const auto& cand = r.layers[static_cast<size_t>(lp.cand_src)].candidates;
    const int64_t T = N / lp.ratio;
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < c.topk; ++j) {
        const int32_t i = c.topk_idxs[t * c.topk + j];
        if (i < 0) continue;
        EXPECT_TRUE(cand[t * T + (i - N)]) << "layer " << lp.layer << " query " << t << " picked " << i - N;
        ++reindexed;
      }
  }
  EXPECT_GT(reindexed, 0);
  // The selection a Reindex layer publishes is not its kv source's: it scores with its own queries.
  EXPECT_NE(r.layers[4].topk_idxs, r.layers[3].topk_idxs);
}

TEST(V41Prefill, OneLayerFedTheForwardsInputsReproducesItsCaptures) {
  const V41Model& m = tiny_model(V41Regime::bf16);
  const int64_t N = 20;
  const auto tokens = random_tokens(N, m.config().vocab_size, test_seed() + 3);
  const auto h = hashing_for(m.config());
  const auto r = m.forward(tokens, h);
  const auto ids = m.engram_hash_ids(tokens, h);
  V41SharedAttention shared;
  const int64_t cols = (m.config().engram_max_ngram_size - 1) * m.config().engram_n_heads;
  int64_t e = 0;
  const int64_t ne = static_cast<int64_t>(m.config().engram_layer_ids.size());
  for (const auto& c : r.layers) {
    std::vector<int64_t> mine;
    if (m.plan()[c.layer].engram) {
      for (int64_t t = 0; t < N; ++t)
        mine.insert(mine.end(), ids.begin() + (t * ne + e) * cols, ids.begin() + (t * ne + e + 1) * cols);
      ++e;
    }
    const auto& input = m.plan()[c.layer].engram ? c.engram_in : c.in;
    const auto one = m.run_layer(c.layer, input, c.pre_mix, N, mine, shared);
    EXPECT_EQ(one.out, c.out) << c.layer;
    EXPECT_EQ(one.ffn_pre, c.ffn_pre) << c.layer;
    EXPECT_EQ(one.topk_idxs, c.topk_idxs) << c.layer;
  }
}

TEST(V41Prefill, EngramHashIdsAreTheRollingXorModuloEachColumnsPrime) {
  const V41Model& m = tiny_model(V41Regime::f64);
  const V41Config& c = m.config();
  const std::vector<int64_t> tokens{5, 9, 1000, 3, 3};
  const auto h = hashing_for(c);
  const auto ids = m.engram_hash_ids(tokens, h);
  const auto primes = v41_engram_primes(c);
  const int64_t nl = 2, ng = 4, nh = 2, cols = 6;
  const int64_t pad = h.token_map[2];
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t l = 0; l < nl; ++l) {
      int64_t offset = 0;
      for (int64_t n = 2; n <= ng; ++n) {  // the n-gram ending at t: shifts 0 .. n - 1
        uint64_t x = 0;
        for (int64_t s = 0; s < n; ++s) {
          const int64_t tok = t - s >= 0 ? h.token_map[tokens[t - s]] : pad;
          x ^= static_cast<uint64_t>(tok) * static_cast<uint64_t>(h.multipliers[l][s]);
        }
        for (int64_t hh = 0; hh < nh; ++hh) {
          const int64_t p = primes[l][(n - 2) * nh + hh];
          EXPECT_EQ(ids[(t * nl + l) * cols + (n - 2) * nh + hh], static_cast<int64_t>(x % static_cast<uint64_t>(p)) + offset)
              << "t " << t << " layer " << l << " n " << n << " head " << hh;
          offset += p;
        }
      }
    }
}

TEST(V41Engram, MultipliersAreNumPysDefaultRngDraws) {
  // engram.py's compute_hash_multipliers, run with NumPy 2.4 (default_rng(10007 · layer).integers(0,
  // bound, 4, int64) · 2 + 1): the tiny presets' layers 0 and 2 over a compressed vocab of 512, and the
  // release's layers 1 and 14 over 99,092.
  V41Config c = v41_builtin_config("v41-tiny");
  EXPECT_EQ(v41_engram_multipliers(c), (std::vector<std::vector<int64_t>>{
                                           {11474481670680735, 4860045374305909, 738113388524411, 297735412830395},
                                           {14807183965884349, 7179874451713115, 4383153767543747, 13823440822075059}}));
  c.engram_layer_ids = {1, 14};
  c.engram_compressed_vocab_size = 99092;
  EXPECT_EQ(v41_engram_multipliers(c), (std::vector<std::vector<int64_t>>{
                                           {76632096046245, 4839876093313, 35959672319349, 73987337458391},
                                           {67716810739261, 51510806800915, 30921347202721, 82619226485591}}));
}

TEST(V41Prefill, IsBitwiseTheSameOnOneTwoAndThreeThreads) {
  const int64_t N = 21;
  const int saved = omp_get_max_threads();
  for (V41Regime r : {V41Regime::bf16, V41Regime::release}) {
    const V41Model& m = tiny_model(r);
    const auto tokens = random_tokens(N, m.config().vocab_size, test_seed() + 4);
    std::vector<V41ForwardResult> runs;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      ASSERT_EQ(omp_get_max_threads(), threads);
      runs.push_back(m.forward(tokens, hashing_for(m.config())));
    }
    omp_set_num_threads(saved);
    for (size_t i = 1; i < runs.size(); ++i) {
      EXPECT_EQ(runs[i].logits, runs[0].logits) << v41_regime_name(r) << ", " << i + 1 << " threads";
      for (size_t l = 0; l < runs[0].layers.size(); ++l) EXPECT_EQ(runs[i].layers[l].out, runs[0].layers[l].out) << l;
    }
  }
  const V41Model& m = tiny_model(V41Regime::bf16);
  // The hc mixes' linear at this N is past the parallel threshold, so its region opens; one of 3.
  const int64_t hc = m.config().hc_mult;
  EXPECT_GT(N * hc * m.config().dim * (2 + hc) * hc, kParallelWork);
  int seen = 0;
  omp_set_num_threads(3);
#pragma omp parallel
  {
#pragma omp single
    seen = omp_get_num_threads();
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(seen, 3);
}

TEST(V41Prefill, RefusesAMissingTensorAndAnUnknownRegime) {
  const V41Config c = v41_builtin_config("v41-tiny");
  SafetensorsFile w = random_weights(c, test_seed());
  std::erase_if(w.tensors, [](const SafetensorsTensor& t) { return t.name == "layers.4.attn.indexer.wq_b.scale"; });
  try {
    V41Model m(c, w, V41Regime::bf16);
    FAIL() << "a missing scale must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.4.attn.indexer.wq_b.scale: missing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(v41_regime_from_name("fp16"), InputError);
  for (V41Regime r : {V41Regime::f64, V41Regime::bf16, V41Regime::release})
    EXPECT_EQ(v41_regime_from_name(v41_regime_name(r)), r);
  EXPECT_EQ(v41_regime_names(), (std::vector<std::string>{"f64", "bf16", "release"}));
}
