#pragma once
// The v41 forward's weights (docs/v41.md §8.2), dequantized once from the release's layout into
// doubles (every stored value is exact in a double and in fp32; the FP8 and FP4 ones in bf16 too,
// which is what the official dtype="bf16" load computes).
#include <cstdint>
#include <vector>

#include "io/safetensors.hpp"
#include "models/v41/config.hpp"
#include "models/v41/plan.hpp"

namespace ced::v41 {

struct V41Linear {
  int64_t out = 0, in = 0;
  std::vector<double> w;  // [out, in], the dequantized values
  // How the file stores it, for the release regime's block-scaled products (docs/v41.md §8.1):
  // Plain (BF16/F32, or dequantized at load as wo_a is), Fp8Tiles (one scale per 32x32 tile, scale
  // [ceil(out/32), ceil(in/32)]) or Fp4Rows (one scale per 32 along K, scale [out, in/32]).
  enum class Kind { Plain, Fp8Tiles, Fp4Rows } kind = Kind::Plain;
  std::vector<double> scale;  // the e8m0 scales' values
  // The same values in the forward's kernel layout (fwd::pack_linear, once per model), transposed
  // to [in, np] with np = out rounded up to the kernels' vector, so that their lanes run over
  // outputs, and stored as contiguous [in, lanes] column blocks: fp32 weights (bf16 regime, or
  // release on a Plain linear), double weights (f64), or (release on FP8/FP4) the codes' values
  // with the scale of each (32-block of K, output).
  struct Packed {
    int64_t np = 0;
    bool f64 = false, codes = false;
    std::vector<float> w32;    // [in, np] fp32 weights or the codes' values
    std::vector<double> w64;   // [in, np] f64 weights
    std::vector<float> scale;  // codes: [in / 32, np]
  } packed;
};

struct V41ExpertWeights {
  V41Linear w1, w2, w3;  // w1, w3: [inter, dim]; w2: [dim, inter]
};

struct V41LayerWeights {
  std::vector<double> attn_norm, ffn_norm;                   // [dim]
  std::vector<double> hc_attn_fn, hc_ffn_fn;                 // [(2 + hc) hc, hc dim] fp32
  std::vector<double> hc_attn_base, hc_ffn_base;             // [(2 + hc) hc] fp32
  std::vector<double> hc_attn_scale, hc_ffn_scale;           // [3] fp32
  // attention
  std::vector<double> attn_sink;                             // [n_heads] fp32
  V41Linear wq_a, wq_b, wkv, wo_a, wo_b;                     // wo_a: [o_groups o_lora_rank, n_heads head_dim / o_groups]
  std::vector<double> q_norm, kv_norm;                       // [q_lora_rank], [head_dim]
  V41Linear compressor_wkv, compressor_wgate;                // [head_dim, dim] (kv sources; wgate ratio > 1)
  std::vector<double> compressor_norm;                       // [head_dim]
  V41Linear indexer_wq_b, indexer_weights_proj, indexer_wk;  // index sources; wk: kv sources
  std::vector<double> indexer_k_norm;                        // [index_head_dim] (kv sources)
  // MoE
  V41Linear gate;                                            // [n_routed_experts, dim]
  std::vector<double> gate_bias;                             // [n_routed_experts] fp32
  std::vector<V41ExpertWeights> experts;                     // [n_routed_experts]
  V41ExpertWeights shared;
  // Engram (Engram layers)
  int64_t engram_rows = 0;
  std::vector<double> engram_table;                          // [rows, engram_head_dim], bf16 values
  V41Linear engram_wkv;                                      // [(hc + 1) dim, cols engram_head_dim]
  std::vector<double> engram_q, engram_k;                    // [hc, dim]
};

// Reads layer l's tensors (InputError naming the first missing or mis-shaped one).
V41LayerWeights load_v41_layer_weights(const V41Config& c, const LayerPlan& lp, const SafetensorsFile& f);
// A plain tensor of the given shape (BF16 or F32 in the release's layout) as doubles.
std::vector<double> load_v41_tensor(const SafetensorsFile& f, const std::string& name,
                                    const std::vector<int64_t>& shape);

}  // namespace ced::v41
