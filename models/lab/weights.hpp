#pragma once
// docs/spec.md §2: the weights and tokens generator. Every tensor is a function of
// (weight_seed, name), so any implementation can rebuild it without a file.
#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/hash.hpp"
#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"

namespace ced {

constexpr uint64_t tensor_key(uint64_t weight_seed, std::string_view name) {
  return fnv1a64(name) ^ splitmix64(weight_seed);
}

// Element i of a tensor with the given key: center + scale * (2u - 1), in double.
inline double weight_element(uint64_t key, uint64_t i, double center, double scale) {
  const double u = static_cast<double>(splitmix64(key + i) >> 11) * 0x1.0p-53;
  return center + scale * (2.0 * u - 1.0);
}

// docs/spec.md §2: tokens[i] = splitmix64((fnv1a64("tokens") ^ splitmix64(token_seed)) + i) mod V.
std::vector<int32_t> make_tokens(uint64_t token_seed, int64_t vocab_size, int64_t count);

enum class TensorKind {
  Embed, AttnNorm, FfnNorm, WqA, QNorm, WqB, Wkv, KvNorm, AttnSink,
  CompWkv, CompWgate, CompNorm, IdxWk, IdxKnorm, IdxWq, IdxWweights,
  WoA, WoB, Router, RouterBias, ExpertW1, ExpertW3, ExpertW2, SharedW1, SharedW3, SharedW2,
  FinalNorm, LmHead
};

struct TensorSpec {
  std::string name;      // docs/spec.md §2 name
  std::string gen_name;  // the name its values are generated under (differs only when tied)
  std::vector<int64_t> shape;  // [rows] or [rows, cols]
  double center = 0, scale = 0;
  TensorKind kind{};
  int64_t layer = -1;  // -1 for embed, final_norm, lm_head
  int64_t index = -1;  // group g or expert e / shared s
  int64_t numel() const;
};

// Every tensor of the model, in a fixed order.
std::vector<TensorSpec> weight_specs(const Config& c, const Plan& p);

// The tensor's values in double, row-major.
std::vector<double> generate_tensor(const TensorSpec& t, uint64_t weight_seed);

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;

template <class T>
struct ExpertWeights {
  Mat<T> w1, w3;  // [d, moe_dim]
  Mat<T> w2;      // [moe_dim, d]
};

template <class T>
struct LayerWeights {
  Vec<T> attn_norm, ffn_norm;  // [d]
  Mat<T> wq_a;                 // [d, q_lora_rank]
  Vec<T> q_norm;               // [q_lora_rank]
  Mat<T> wq_b;                 // [q_lora_rank, n_heads*head_dim]
  Mat<T> wkv;                  // [d, head_dim]
  Vec<T> kv_norm;              // [head_dim]
  Vec<T> attn_sink;            // [n_heads]
  // Full layers
  Mat<T> comp_wkv, comp_wgate;  // [d, head_dim] (wgate only when r >= 2)
  Vec<T> comp_norm;             // [head_dim]
  Mat<T> idx_wk;                // [head_dim, index_head_dim]
  Vec<T> idx_knorm;             // [index_head_dim]
  // index sources
  Mat<T> idx_wq;        // [q_lora_rank, index_n_heads*index_head_dim]
  Mat<T> idx_wweights;  // [d, index_n_heads]
  std::vector<Mat<T>> wo_a;  // o_groups x [(n_heads/o_groups)*head_dim, o_lora_rank]
  Mat<T> wo_b;               // [o_groups*o_lora_rank, d]
  Mat<T> router;             // [d, n_routed_experts]
  Vec<T> router_bias;        // [n_routed_experts]
  std::vector<ExpertWeights<T>> experts, shared;
};

template <class T>
struct Weights {
  Mat<T> embed;  // [V, d]
  std::vector<LayerWeights<T>> layers;
  Vec<T> final_norm;  // [d]
  Mat<T> lm_head;     // [d, V]
};

// Generates every tensor of weight_specs, rounded to T.
template <class T>
Weights<T> generate_weights(const Config& c, const Plan& p, uint64_t weight_seed);

extern template Weights<float> generate_weights<float>(const Config&, const Plan&, uint64_t);
extern template Weights<double> generate_weights<double>(const Config&, const Plan&, uint64_t);

}  // namespace ced
