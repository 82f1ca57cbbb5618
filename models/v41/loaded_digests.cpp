// docs/v41.md §12.9: the canonical digests of a checkpoint's tensors; see loaded_digests.hpp.
#include "models/v41/loaded_digests.hpp"

#include <fmt/format.h>

#include <bit>
#include <cstring>

#include "model/error.hpp"
#include "model/hash.hpp"
#include "models/v41/numerics.hpp"

namespace ced::v41 {
namespace {

// FNV-1a 64 continued over more bytes (model/hash.hpp's constants).
uint64_t fnv_more(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

const SafetensorsTensor& need(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensor* t = f.find(name);
  if (!t) throw InputError(fmt::format("v41 loaded digests: the checkpoint has no tensor {}", name));
  return *t;
}

// A tensor's canonical values and logical shape (docs/v41.md §12.9).
std::vector<float> canonical(const SafetensorsFile& f, const V41TensorSpec& s, std::vector<int64_t>& shape) {
  const SafetensorsTensor& t = need(f, s.name);
  shape = t.shape;
  std::vector<float> v;
  switch (s.format) {
    case V41Format::Fp8Tiles: {
      const int64_t out = t.shape[0], in = t.shape[1];
      v.resize(static_cast<size_t>(out * in));
      dequant_fp8_weight(t.bytes, need(f, s.scale).bytes, out, in, v);
      return v;
    }
    case V41Format::Fp8Rows: {
      const int64_t rows = t.shape[0], d = t.shape[1];
      const SafetensorsTensor& sc = need(f, s.scale);
      v.resize(static_cast<size_t>(rows * d));
      const int64_t per = (d + 31) / 32;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < d; ++j)
          v[static_cast<size_t>(r * d + j)] = f32_from_e4m3(t.bytes[static_cast<size_t>(r * d + j)]) *
                                              f32_from_e8m0(sc.bytes[static_cast<size_t>(r * per + j / 32)]);
      return v;
    }
    case V41Format::Fp4K32: {
      const int64_t out = t.shape[0], in = 2 * t.shape[1];
      shape = {out, in};
      v.resize(static_cast<size_t>(out * in));
      dequant_fp4_weight(t.bytes, need(f, s.scale).bytes, out, in, v);
      return v;
    }
    case V41Format::Bf16: {
      v.resize(t.bytes.size() / 2);
      for (size_t i = 0; i < v.size(); ++i) {
        uint16_t b;
        std::memcpy(&b, t.bytes.data() + 2 * i, 2);
        v[i] = f32_from_bf16(b);
      }
      return v;
    }
    case V41Format::F32:
      v.resize(t.bytes.size() / 4);
      std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
      return v;
    case V41Format::Scale: break;
  }
  throw std::logic_error("v41 loaded digests: a scale has no canonical form of its own");
}

}  // namespace

std::string v41_tensor_digest(std::span<const float> values, std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n != static_cast<int64_t>(values.size()))
    throw InputError(fmt::format("tensor digest: {} values for a shape of {} elements", values.size(), n));
  uint64_t h = fnv1a64("");
  for (int64_t d : shape) h = fnv_more(h, &d, sizeof d);
  static_assert(std::endian::native == std::endian::little, "the canonical bytes are little-endian");
  h = fnv_more(h, values.data(), values.size() * sizeof(float));
  return fmt::format("{:016x}", h);
}

std::vector<std::pair<std::string, double>> v41_config_switches(const V41Config& c) {
  return {{"swiglu_limit", c.swiglu_limit},
          {"route_scale", c.route_scale},
          {"norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},
          {"rope_factor", c.rope_factor}};
}

std::vector<V41TensorDigest> v41_loaded_digests(const V41Checkpoint& ck) {
  std::vector<V41TensorDigest> out;
  for (const V41TensorSpec& s : v41_schema(ck.config)) {
    if (s.format == V41Format::Scale) continue;
    std::vector<int64_t> shape;
    const std::vector<float> v = canonical(ck.weights, s, shape);
    out.push_back({s.name, v41_tensor_digest(v, shape)});
  }
  const int64_t one = 1;
  for (const auto& [key, value] : v41_config_switches(ck.config)) {
    const float x = static_cast<float>(value);
    out.push_back({"config." + key, v41_tensor_digest(std::span<const float>(&x, 1), std::span<const int64_t>(&one, 1))});
  }
  return out;
}

}  // namespace ced::v41
