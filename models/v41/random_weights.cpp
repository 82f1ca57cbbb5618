// docs/v41.md §11.2: random weights with the release's statistics, stored as the release stores them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "model/hash.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/numerics.hpp"

namespace ced::v41 {
namespace {

// ---- the random stream: splitmix64 seeded by (seed, name); normals as Irwin-Hall(12) - 6 -------

struct Stream {
  uint64_t state;
  Stream(uint64_t seed, std::string_view name) {
    uint64_t s = seed;
    state = splitmix64_next(s) ^ fnv1a64(name);
  }
  // Mean 0, variance 1, in [-6, 6]: the sum of twelve 24-bit uniforms minus 6. Every step is exact
  // in double (integers below 2^28 times 2^-24), so the value is the same on every platform.
  double normal() {
    int64_t sum = 0;
    for (int k = 0; k < 6; ++k) {
      const uint64_t r = splitmix64_next(state);
      sum += int64_t(r >> 40) + int64_t((r >> 16) & 0xFFFFFF);
    }
    return double(sum) * 0x1p-24 - 6.0;
  }
};

// ---- the statistics (docs/v41.md §11.2) ----------------------------------------------------------

// Norm-weight means by owner (the release's, as measured on its checkpoint); other norms 1.
double norm_mean(std::string_view owner) {
  struct Entry { std::string_view suffix; double mean; };
  static constexpr Entry kMeans[] = {{"attn_norm", 0.025}, {"ffn_norm", 0.2},        {"q_norm", 0.97},
                                     {"kv_norm", 0.4},     {"compressor.norm", 0.6}, {"k_norm", 0.5}};
  for (const Entry& e : kMeans)
    if (owner == e.suffix || (owner.size() > e.suffix.size() && owner.ends_with(e.suffix) &&
                              owner[owner.size() - e.suffix.size() - 1] == '.'))
      return e.mean;
  return 1.0;
}

// Projection std = gain / sqrt(fan_in), the gain by the module's own name; others 1.
double gain(std::string_view owner) {
  struct Entry { std::string_view leaf; double gain; };
  static constexpr Entry kGains[] = {{"wq_a", 1.6}, {"wq_b", 0.95}, {"wkv", 1.8}, {"wo_a", 1.6}, {"wo_b", 1.9},
                                     {"gate", 2.9}, {"w1", 1.5},    {"w3", 1.5},  {"w2", 1.05}};
  const std::string_view leaf = owner.substr(owner.rfind('.') + 1);
  for (const Entry& e : kGains)
    if (leaf == e.leaf) return e.gain;
  return 1.0;
}

constexpr double kEmbedStd = 0.12;

// The values of one tensor: bf16 values held in fp32 (the release quantized bf16 weights), fp32 for an
// F32 tensor.
std::vector<float> draw(const V41TensorSpec& s, int64_t numel, uint64_t seed) {
  Stream rng(seed, s.name);
  std::string_view name = s.name;
  const bool weight = name.ends_with(".weight");
  const std::string_view owner = weight ? name.substr(0, name.size() - 7) : name;
  double mean = 0, std = 1;
  if (name == "embed.weight") {
    std = kEmbedStd;
  } else if (weight && (owner.ends_with("norm"))) {
    mean = norm_mean(owner), std = 0.1 * mean;  // mean * (1 + 0.1 n)
  } else if (name.ends_with("engram.q_weight") || name.ends_with("engram.k_weight")) {
    mean = 1, std = 0.1;
  } else if (name.ends_with("engram.embed.weight")) {
    std = 1;
  } else if (name.ends_with("gate.bias")) {
    std = 0.1;
  } else if (name.ends_with("gate.bias_vl")) {
    std = 0;  // unused for text; the release ships it
  } else if (s.shape.size() == 2) {  // a projection or hc_*_fn: [out, in]
    const int64_t fan_in = s.format == V41Format::Fp4K32 ? 2 * s.shape[1] : s.shape[1];
    std = gain(owner) / std::sqrt(double(fan_in));
  } else {  // attn_sink, hc_*_base, hc_*_scale
    std = 0.5;
  }
  const bool f32 = s.format == V41Format::F32;
  std::vector<float> v(static_cast<size_t>(numel));
  for (float& x : v) {
    const float f = float(mean + std * rng.normal());
    x = f32 ? f : round_bf16(f);
  }
  return v;
}

std::vector<uint8_t> raw_bytes(const void* p, size_t n) {
  std::vector<uint8_t> out(n);
  std::memcpy(out.data(), p, n);
  return out;
}

// FP8 e4m3 with one ue8m0 scale per 32x32 tile (amax floored at 1e-4), the release's dense layout.
void quantize_fp8_tiles(const std::vector<float>& w, int64_t rows, int64_t cols, std::vector<uint8_t>& codes,
                        std::vector<uint8_t>& scales) {
  const int64_t rb = (rows + 31) / 32, cb = (cols + 31) / 32;
  codes.assign(size_t(rows * cols), 0);
  scales.assign(size_t(rb * cb), 0);
  for (int64_t bi = 0; bi < rb; ++bi)
    for (int64_t bj = 0; bj < cb; ++bj) {
      const int64_t r1 = std::min(rows, 32 * bi + 32), c1 = std::min(cols, 32 * bj + 32);
      float amax = 0;
      for (int64_t r = 32 * bi; r < r1; ++r)
        for (int64_t c = 32 * bj; c < c1; ++c) amax = std::max(amax, std::fabs(w[size_t(r * cols + c)]));
      const float s = ue8m0_scale(std::max(amax, kFp8AmaxFloor), kFp8MaxInv);
      scales[size_t(bi * cb + bj)] = e8m0_from_f32(s);
      for (int64_t r = 32 * bi; r < r1; ++r)
        for (int64_t c = 32 * bj; c < c1; ++c) codes[size_t(r * cols + c)] = e4m3_from_f32(w[size_t(r * cols + c)] / s);
    }
}

// Packed e2m1 with one ue8m0 scale per 32 along K (amax floored at 6 * 2^-126): the routed experts.
void quantize_fp4_k32(const std::vector<float>& w, int64_t rows, int64_t cols, std::vector<uint8_t>& packed,
                      std::vector<uint8_t>& scales) {
  std::vector<uint8_t> codes(size_t(rows * cols));
  scales.assign(size_t(rows * cols / 32), 0);
  for (int64_t b = 0; b < rows * cols / 32; ++b) {
    const float* x = w.data() + 32 * b;
    float amax = 0;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float s = ue8m0_scale(std::max(amax, kFp4AmaxFloor), kFp4MaxInv);
    scales[size_t(b)] = e8m0_from_f32(s);
    for (int k = 0; k < 32; ++k) codes[size_t(32 * b + k)] = e2m1_from_f32(std::clamp(x[k] / s, -kE2m1Max, kE2m1Max));
  }
  packed.assign(codes.size() / 2, 0);
  pack_fp4(codes, packed);
}

// FP8 per 32 of a row: act_quant's blocks (the Engram tables).
void quantize_fp8_rows(const std::vector<float>& w, int64_t cols, std::vector<uint8_t>& codes,
                       std::vector<uint8_t>& scales) {
  codes.assign(w.size(), 0);
  std::vector<float> s(w.size() / 32);
  act_quant(w, cols, codes, s);
  scales.resize(s.size());
  std::transform(s.begin(), s.end(), scales.begin(), e8m0_from_f32);
}

}  // namespace

V41Checkpoint make_v41_random_checkpoint(const V41Config& c, uint64_t seed) {
  V41Checkpoint ck{c, {}};
  const auto schema = v41_schema(c);
  for (const V41TensorSpec& s : schema) {
    if (s.format == V41Format::Scale) continue;  // made with its weight
    SafetensorsTensor t{s.name, s.dtype, s.shape, {}};
    const int64_t rows = s.shape[0], stored = s.shape.size() > 1 ? s.shape[1] : 1;
    const int64_t cols = s.format == V41Format::Fp4K32 ? 2 * stored : stored;
    const std::vector<float> v = draw(s, rows * cols, seed);
    SafetensorsTensor scale;
    switch (s.format) {
      case V41Format::Fp8Tiles: quantize_fp8_tiles(v, rows, cols, t.bytes, scale.bytes); break;
      case V41Format::Fp8Rows: quantize_fp8_rows(v, cols, t.bytes, scale.bytes); break;
      case V41Format::Fp4K32: quantize_fp4_k32(v, rows, cols, t.bytes, scale.bytes); break;
      case V41Format::Bf16: {
        std::vector<uint16_t> b(v.size());
        std::transform(v.begin(), v.end(), b.begin(), bf16_from_f32);
        t.bytes = raw_bytes(b.data(), 2 * b.size());
        break;
      }
      case V41Format::F32: t.bytes = raw_bytes(v.data(), 4 * v.size()); break;
      case V41Format::Scale: break;
    }
    if (!s.scale.empty()) {
      const auto it = std::find_if(schema.begin(), schema.end(), [&](const auto& x) { return x.name == s.scale; });
      scale.name = it->name, scale.dtype = it->dtype, scale.shape = it->shape;
      ck.weights.tensors.push_back(std::move(scale));
    }
    ck.weights.tensors.push_back(std::move(t));
  }
  std::sort(ck.weights.tensors.begin(), ck.weights.tensors.end(),
            [](const auto& x, const auto& y) { return x.name < y.name; });
  return ck;
}

}  // namespace ced::v41
