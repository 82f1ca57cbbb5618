#pragma once
// Admissible results of the v41 sublayers' ops under op-level forcing (docs/sound-bounds.md §12-§14): each
// op computed from the inputs the implementation was given (the official run's own), intervals carried in
// f64 through its elementwise steps, every quantizer admitting each result its input interval reaches.
// What the gate judges its sublayer kinds by: sparse_attn and the attention's other ops, the index scores'
// selection, the MoE, the block's mixes and streams, Engram and the compressor.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compare/op_bounds.hpp"
#include "reference/v41/forward.hpp"
#include "reference/v41/forward_weights.hpp"

namespace ced::v41 {

// Where a quantizer's input interval reached more than one result: the first such place, named, and
// how many values and block scales did (the report's "both e4m3 values admissible").
struct V41Straddles {
  int64_t values = 0, scales = 0;
  std::string first;  // "act_quant of wo_b's input, row 3, block 17: 2 scales"
  void add(int64_t values, int64_t scales, const std::string& where);
};

// act_quant's QDQ (FP8 e4m3, one ue8m0 scale per 32 along rows of K) on inputs known as intervals, in
// place: a block's scale may be any the interval of its amax reaches (by the kernel's product with
// fp32(1/448) or an exact division), each value any QDQ result of its interval under any of them.
void v41_act_qdq_bounds(std::span<bounds::Interval> x, int64_t K, V41Straddles* straddles = nullptr,
                        const std::string& what = "act_quant");

// The indexer's FP4 QDQ (e2m1, one ue8m0 scale per 32 from amax / 6, the result cast to bf16) likewise.
void v41_fp4_qdq_bounds(std::span<bounds::Interval> x, int64_t K, V41Straddles* straddles = nullptr,
                        const std::string& what = "fp4 QDQ");

// linear_w's admissible results on interval inputs x [M, w.in] (a point is an interval of width 0): in the
// release regime on an FP8 or FP4 weight, act_quant first, then the products of the QDQ values with the
// dequantized weight; else the plain product. Outputs [M, w.out] rounded to out_bits.
std::vector<bounds::BoundedValue> v41_linear_w_bounds(const V41Model& m, std::span<const bounds::Interval> x, int64_t M,
                                                      const V41Linear& w, const bounds::BoundModel& model, int out_bits,
                                                      V41Straddles* straddles = nullptr, const std::string& what = "");

// The attention's input (docs/sound-bounds.md §13.3): the collapse of the block's streams [N, hc, dim]
// (after its Engram) with the pre_mix [N, hc] it was given, then attn_norm. [N, dim] bf16.
std::vector<bounds::BoundedValue> v41_attn_x_bounds(const V41Model& m, int64_t layer, std::span<const double> streams,
                                                    std::span<const double> pre_mix, int64_t N,
                                                    const bounds::BoundModel& model);

// The attention's query and window KV (docs/sound-bounds.md §13.2) on x [N, dim] (attn_norm's output):
// q [N, n_heads, head_dim] after wq_a, q_norm, wq_b and the RoPE; the window KV rows [N, head_dim] after wkv,
// kv_norm, the RoPE and the FP8 QDQ. Their intervals carried through every op, bf16 at each of the release's
// casts.
struct V41QkvBounds {
  std::vector<bounds::BoundedValue> q, kv;
  V41Straddles q_straddles, kv_straddles;
};
// `positions` (empty: 0 .. N − 1): the position of each row of x, for the RoPE.
V41QkvBounds v41_attention_qkv_bounds(const V41Model& m, int64_t layer, std::span<const double> x, int64_t N,
                                      const bounds::BoundModel& model, std::span<const int64_t> positions = {});

// The index scores of an index source (docs/sound-bounds.md §13.4) on x [N, dim] (attn_norm's output): the
// indexer's query (wq_a, q_norm, its wq_b, the RoPE, FP4 per 32), the keys index_k [T, index_head_dim] the
// layer reads (points: the official's published ones), each head's weight (weights_proj times its
// constant), score[t, j] = Σ_h relu(q_th · k_j) · w_th with the release's three bf16 casts (none under
// --index-scores fp32). [N, T = N / ratio]; −∞ where query t does not see group j, or where the candidate
// pool `candidates` [N, T] (empty: none) leaves it out. What a published selection is judged against
// (judge_topk).
std::vector<bounds::Interval> v41_index_score_bounds(const V41Model& m, int64_t layer, std::span<const double> x,
                                                     int64_t N, std::span<const double> index_k,
                                                     std::span<const uint8_t> candidates,
                                                     const bounds::BoundModel& model, V41Straddles* straddles = nullptr);

// sparse_attn alone (docs/sound-bounds.md §12) on q [N, n_heads, head_dim], kv rows, index lists [N, k]:
// bf16 outputs.
// `needed` [N, n_heads] (empty: all) as sparse_attention_bounds takes it.
std::vector<bounds::BoundedValue> v41_attention_core_bounds(const V41Model& m, int64_t layer, std::span<const double> q,
                                                            std::span<const double> kv, std::span<const int32_t> idx,
                                                            int64_t N, const bounds::BoundModel& model,
                                                            std::span<const uint8_t> needed = {});
// The attention's output projection alone (docs/sound-bounds.md §13.1) on sparse_attn's output o: the
// inverse RoPE (its products and sum in fp32, then bf16), wo_a by groups (bf16), wo_b (linear_w, bf16).
// [N, dim].
// Rows at positions first .. first + N - 1 (a decode step's one row at its position), or at `positions`.
std::vector<bounds::BoundedValue> v41_attention_output_bounds(const V41Model& m, int64_t layer, std::span<const double> o,
                                                              int64_t N, const bounds::BoundModel& model,
                                                              V41Straddles* straddles = nullptr, int64_t first = 0,
                                                              std::span<const int64_t> positions = {});
// The MoE alone (docs/sound-bounds.md §14.1) on x [N, dim] (ffn_norm's output) under the selection
// `experts` [N, n_activated] (the implementation's own, judged apart): each routed expert with its route
// weight's interval, the shared expert, the clamped SwiGLU, the sum in any order. [N, dim] bf16.
std::vector<bounds::BoundedValue> v41_moe_bounds(const V41Model& m, int64_t layer, std::span<const double> x, int64_t N,
                                                 std::span<const int64_t> experts, const bounds::BoundModel& model,
                                                 V41Straddles* straddles = nullptr);

// A kv source's compressor (docs/sound-bounds.md §14.4) on x [N, dim] (attn_norm's output) of a prefill
// from 0: the latent [N / ratio, head_dim] (wkv bf16 for ratio 1; else the fp32 wkv and wgate and the
// softmax pooling per group, bf16; then the norm), the compressed KV (the RoPE at each group's first token,
// FP4 per 16 with e4m3 scales) and, for an owner, the index keys [N / ratio, index_head_dim] (wk, k_norm,
// RoPE, FP4 per 32).
struct V41CompressorBounds {
  std::vector<bounds::BoundedValue> latent, compress_kv, index_k;
  V41Straddles latent_straddles, kv_straddles, k_straddles;  // each from its own quantizers
};
V41CompressorBounds v41_compressor_bounds(const V41Model& m, int64_t layer, std::span<const double> x, int64_t N,
                                          const bounds::BoundModel& model);

// Engram (docs/sound-bounds.md §14.3) on the streams before it [N, hc, dim] (points: the official's) with
// the hash ids [N, cols] it read: wkv of the looked-up rows (bf16), each stream's gate from its
// RMS-normalised dot with its key, the gated value added, bf16. [N, hc, dim]: the streams the block then
// reads.
std::vector<bounds::BoundedValue> v41_engram_bounds(const V41Model& m, int64_t layer, std::span<const double> streams,
                                                    std::span<const int64_t> hash_ids, int64_t N,
                                                    const bounds::BoundModel& model);

// A block's hc mixes without the Sinkhorn (docs/sound-bounds.md §14.2): pre = σ(m·s0 + b) + eps and
// post = 2σ(m·s1 + b), m the projection of the flattened streams X [N, hc·dim] (intervals) times
// rsqrt(mean(X²) + norm_eps); the attention's (ffn = false) or the FFN's weights of the layer. [N, hc] each.
// comb's Sinkhorn iterations are not bounded (docs/sound-bounds.md §15): the gate feeds hc_post the
// official's own comb.
struct V41MixBounds {
  std::vector<bounds::Interval> pre, post;
};
V41MixBounds v41_mix_bounds(const V41Model& m, int64_t layer, std::span<const bounds::Interval> X, int64_t N, bool ffn,
                            const bounds::BoundModel& model);

// The block around its two sublayers (docs/sound-bounds.md §14.2), fed the official's streams `in` (after
// Engram), sublayer outputs and hc mixes of `o`: the attention's mixes; the streams after its hc_post; the
// FFN's input (hc_pre with the attention's pre, ffn_norm); the FFN's mixes (its pre is the next block's
// pre_mix); the block's output streams after the FFN's hc_post. InputError when `o` lacks one of them.
struct V41BlockBounds {
  V41MixBounds attn_mixes, ffn_mixes;
  std::vector<bounds::Interval> streams;     // [N, hc, dim] between the sublayers
  std::vector<bounds::BoundedValue> ffn_x;   // [N, dim]
  std::vector<bounds::BoundedValue> out;     // [N, hc, dim]
};
V41BlockBounds v41_block_bounds(const V41Model& m, int64_t layer, const V41LayerCapture& o, int64_t N,
                                const bounds::BoundModel& model);
// Whether `o` holds, at N rows, every capture v41_block_bounds needs.
bool v41_block_captured(const V41Config& c, const V41LayerCapture& o, int64_t N);
// The final collapse of the last block's output streams (its bounds) with its FFN's pre [N, hc]: [N, dim] bf16.
std::vector<bounds::BoundedValue> v41_final_collapse_bounds(const V41Model& m, std::span<const bounds::BoundedValue> out,
                                                            std::span<const double> pre, int64_t N,
                                                            const bounds::BoundModel& model);

}  // namespace ced::v41
