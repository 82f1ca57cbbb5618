#pragma once
// What an engine loaded is what the checkpoint holds (docs/v41.md §12.9): a digest of each tensor in one
// canonical form, so that a port can digest its own loaded copy however it keeps it (dequantized, repacked,
// transposed back) and the gate can name the first tensor that differs before any forward pass. Field bugs
// this catches: a routing table that reached the engine as zeros, a switch of the config lost on the way.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/v41/checkpoint.hpp"

namespace ced::v41 {

// The canonical form: a tensor's values as the checkpoint means them, in its logical row-major shape, as
// little-endian float32: a quantized weight (F8_E4M3 in 32 x 32 tiles, F8_E4M3 rows with a scale per 32, packed
// e2m1 with a scale per 32 along K) times its e8m0 scales, which is exact in float32; bf16 widened; float32 as
// is. The digest is FNV-1a 64 over the shape (each dimension an int64, little-endian) and then those bytes,
// written as 16 hex digits. `shape` is the logical shape ([out, in] for a packed e2m1 weight stored [out, in/2]).
std::string v41_tensor_digest(std::span<const float> values, std::span<const int64_t> shape);

struct V41TensorDigest {
  std::string name;    // the weight's checkpoint name ("layers.0.ffn.gate.weight"); a scale is folded into it
  std::string digest;  // v41_tensor_digest of its canonical form
};

// Every weight of the checkpoint's schema, in schema order (scales folded into their weights), then the
// config's switches a port must honour as "config.KEY" (swiglu_limit, route_scale, norm_eps, rope_theta,
// rope_factor: each a one-value tensor of shape [1]).
std::vector<V41TensorDigest> v41_loaded_digests(const V41Checkpoint& ck);

// The switches' values, for an engine's own report: the digest of config.KEY is v41_tensor_digest({v}, {1}).
std::vector<std::pair<std::string, double>> v41_config_switches(const V41Config& c);

}  // namespace ced::v41
