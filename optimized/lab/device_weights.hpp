#pragma once
// The docs/spec.md §2 weights in device memory (the device side of models/lab/weights.hpp).
#include <cstdint>
#include <vector>

#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"
#include "models/lab/weights.hpp"
#include "optimized/lab/cuda_backend.hpp"
#include "optimized/lab/device_buffer.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

// A weight matrix W [rows = in, cols = out], f32 or bf16 (by precision).
struct DevMat {
  int64_t rows = 0, cols = 0;
  DeviceBuffer<float> f32;
  DeviceBuffer<uint16_t> bf16;
};
struct DevExpert {
  DevMat w1, w3;  // [d, moe_dim]
  DevMat w2;      // [moe_dim, d]
};
struct DevLayer {
  DeviceBuffer<float> attn_norm, ffn_norm;  // [d]
  DevMat wq_a;                              // [d, q_lora_rank]
  DeviceBuffer<float> q_norm;               // [q_lora_rank]
  DevMat wq_b;                              // [q_lora_rank, n_heads·head_dim]
  DevMat wkv;                               // [d, head_dim]
  DeviceBuffer<float> kv_norm;              // [head_dim]
  DeviceBuffer<float> attn_sink;            // [n_heads]
  DevMat comp_wkv, comp_wgate;              // [d, head_dim] (Full; wgate for r >= 2)
  DeviceBuffer<float> comp_norm;            // [head_dim]
  DevMat idx_wk;                            // [head_dim, index_head_dim]
  DeviceBuffer<float> idx_knorm;            // [index_head_dim]
  DevMat idx_wq;                            // [q_lora_rank, index_n_heads·index_head_dim]
  DevMat idx_wweights;                      // [d, index_n_heads]
  std::vector<DevMat> wo_a;                 // o_groups × [(n_heads/o_groups)·head_dim, o_lora_rank]
  DevMat wo_b;                              // [o_groups·o_lora_rank, d]
  DevMat router;                            // [d, n_routed_experts]
  DeviceBuffer<float> router_bias;          // [n_routed_experts]
  std::vector<DevExpert> experts, shared;
};
struct DevWeights {
  DeviceBuffer<float> embed;  // [V, d], f32 in both precisions (a row gather, not a product)
  std::vector<DevLayer> layers;
  DeviceBuffer<float> final_norm;  // [d]
  DevMat lm_head;                  // [d, V]
};

// A tensor the projector multiplies by (every 2-D weight but the embedding).
bool is_matrix(const TensorSpec& t);

// Bytes the weights take on the device.
double weight_bytes(const std::vector<TensorSpec>& specs, CudaPrecision prec);

// docs/spec.md §2 weights, generated on the host tensor by tensor (values rounded to
// f32 as generate_weights<float> does) and uploaded once.
DevWeights upload_weights(const Config& c, const Plan& plan, uint64_t seed, CudaPrecision prec);

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
