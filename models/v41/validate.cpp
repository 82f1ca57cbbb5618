// docs/v41.md §6: validation. Every rule throws one line naming the config and the key.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "model/error.hpp"
#include "models/v41/config.hpp"

namespace ced::v41 {
namespace {

struct Check {
  const V41Config& c;
  [[noreturn]] void fail(const std::string& why) const {
    throw InputError(fmt::format("v41 config: {}: {}", c.name.empty() ? "(unnamed)" : c.name, why));
  }
  void positive(const char* key, int64_t v) const {
    if (v <= 0) fail(fmt::format("{} = {} must be positive", key, v));
  }
  void multiple_of_32(const char* what, int64_t v, const char* why) const {
    if (v % 32 != 0) fail(fmt::format("{} = {} is not a multiple of 32 ({})", what, v, why));
  }
  // Strictly ascending layer ids in [0, n_layers).
  void layer_list(const char* key, const std::vector<int64_t>& v) const {
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] < 0 || v[i] >= c.n_layers)
        fail(fmt::format("{} has layer {}, outside [0, {})", key, v[i], c.n_layers));
      if (i > 0 && v[i] <= v[i - 1]) fail(fmt::format("{} {} is not strictly ascending", key, fmt::join(v, ",")));
    }
  }
  int64_t ratio(int64_t l) const { return c.compress_ratios[static_cast<size_t>(l)]; }
};

bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

void validate_v41(const V41Config& c) {
  const Check k{c};
  // Sizes.
  k.positive("vocab_size", c.vocab_size);
  k.positive("dim", c.dim);
  k.positive("moe_inter_dim", c.moe_inter_dim);
  k.positive("n_layers", c.n_layers);
  k.positive("n_heads", c.n_heads);
  k.positive("n_routed_experts", c.n_routed_experts);
  k.positive("n_activated_experts", c.n_activated_experts);
  k.positive("q_lora_rank", c.q_lora_rank);
  k.positive("head_dim", c.head_dim);
  k.positive("rope_head_dim", c.rope_head_dim);
  k.positive("o_groups", c.o_groups);
  k.positive("o_lora_rank", c.o_lora_rank);
  k.positive("window_size", c.window_size);
  k.positive("index_n_heads", c.index_n_heads);
  k.positive("index_head_dim", c.index_head_dim);
  k.positive("index_topk", c.index_topk);
  k.positive("hc_mult", c.hc_mult);
  k.positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  if (c.n_mtp_layers < 0) k.fail(fmt::format("n_mtp_layers = {} is negative", c.n_mtp_layers));
  if (c.n_activated_experts > c.n_routed_experts)
    k.fail(fmt::format("n_activated_experts = {} exceeds n_routed_experts = {}", c.n_activated_experts,
                       c.n_routed_experts));
  if (c.n_shared_experts != 1)
    k.fail(fmt::format("n_shared_experts = {}; the official MoE asserts exactly 1", c.n_shared_experts));
  if (c.score_func != "softmax" && c.score_func != "sigmoid" && c.score_func != "sqrtsoftplus")
    k.fail(fmt::format("score_func '{}' is none of softmax, sigmoid, sqrtsoftplus", c.score_func));
  if (c.dtype != "fp8" && c.dtype != "bf16") k.fail(fmt::format("dtype '{}' is neither fp8 nor bf16", c.dtype));
  if (c.expert_dtype && *c.expert_dtype != "fp4")
    k.fail(fmt::format("expert_dtype '{}' is neither fp4 nor null", *c.expert_dtype));
  if (!(c.norm_eps > 0)) k.fail(fmt::format("norm_eps = {} must be positive", c.norm_eps));
  if (!(c.hc_eps >= 0)) k.fail(fmt::format("hc_eps = {} must not be negative", c.hc_eps));
  if (!(c.rope_theta > 0) || !(c.compress_rope_theta > 0))
    k.fail(fmt::format("rope_theta = {} and compress_rope_theta = {} must be positive", c.rope_theta,
                       c.compress_rope_theta));
  if (c.original_seq_len < 0) k.fail(fmt::format("original_seq_len = {} is negative", c.original_seq_len));
  if (c.original_seq_len > 0 && (!(c.rope_factor > 0) || c.beta_fast <= 0 || c.beta_slow <= 0))
    k.fail(fmt::format("YaRN needs rope_factor, beta_fast and beta_slow positive (got {}, {}, {})", c.rope_factor,
                       c.beta_fast, c.beta_slow));

  // Widths (docs/v41.md §6.1): every FP8/FP4 linear's input is act_quant'ed per 32, the window KV is
  // FP8 per 32 over head_dim, the latent FP4 per 16, the index queries and keys FP4 per 32.
  k.multiple_of_32("dim", c.dim, "the input of wq_a, wkv, the shared expert's w1/w3 and every routed w1/w3");
  k.multiple_of_32("q_lora_rank", c.q_lora_rank, "the input of wq_b and indexer.wq_b");
  k.multiple_of_32("o_groups * o_lora_rank", c.o_groups * c.o_lora_rank, "the input of wo_b");
  k.multiple_of_32("moe_inter_dim", c.moe_inter_dim, "the input of every w2");
  k.multiple_of_32("head_dim", c.head_dim, "the window KV is FP8 per 32, the latent FP4 per 16");
  k.multiple_of_32("index_head_dim", c.index_head_dim, "the index queries and keys are FP4 per 32");
  if ((c.n_heads * c.head_dim) % c.o_groups != 0)
    k.fail(fmt::format("n_heads * head_dim = {} is not divisible by o_groups = {}", c.n_heads * c.head_dim, c.o_groups));
  if (c.rope_head_dim % 2 != 0 || c.rope_head_dim > c.head_dim || c.rope_head_dim > c.index_head_dim)
    k.fail(fmt::format("rope_head_dim = {} must be even and at most head_dim = {} and index_head_dim = {}",
                       c.rope_head_dim, c.head_dim, c.index_head_dim));

  // The schedule (docs/v41.md §6.2).
  const int64_t n_ratios = c.n_layers + c.n_mtp_layers;
  if (static_cast<int64_t>(c.compress_ratios.size()) != n_ratios)
    k.fail(fmt::format("compress_ratios has {} entries; n_layers + n_mtp_layers = {}", c.compress_ratios.size(),
                       n_ratios));
  for (int64_t l = 0; l < n_ratios; ++l) {
    if (k.ratio(l) < 0) k.fail(fmt::format("compress_ratios[{}] = {} is negative", l, k.ratio(l)));
    if (l >= c.n_layers && k.ratio(l) != 0)
      k.fail(fmt::format("compress_ratios[{}] = {}: a DSpark stage is SWA-only (ratio 0)", l, k.ratio(l)));
  }
  k.layer_list("kv_source_layers", c.kv_source_layers);
  k.layer_list("index_source_layers", c.index_source_layers);
  if (c.kv_source_layers.empty()) k.fail("kv_source_layers is empty (the CED split E is the largest kv source)");
  for (int64_t s : c.kv_source_layers)
    if (k.ratio(s) <= 0) k.fail(fmt::format("kv source {} has compress_ratios[{}] = {}; a kv source compresses (ratio > 0)", s, s, k.ratio(s)));
  for (int64_t s : c.index_source_layers)
    if (k.ratio(s) <= 0)
      k.fail(fmt::format("index source {} has compress_ratios[{}] = {}; an index source selects compressed entries (ratio > 0)", s, s, k.ratio(s)));
  for (int64_t s : c.kv_source_layers)
    if (!contains(c.index_source_layers, s))
      k.fail(fmt::format("kv source {} is not an index source; index_source_layers must contain every kv source "
                         "(its indexer owns the index keys)", s));
  // A compressed layer reads the compressed KV and index keys its latest kv source at or below it
  // published, so that source must exist and share its ratio.
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (k.ratio(l) == 0) continue;
    int64_t src = -1;
    for (int64_t s : c.kv_source_layers)
      if (s <= l) src = s;
    if (src < 0) k.fail(fmt::format("layer {} has ratio {} but no kv source at or below it", l, k.ratio(l)));
    if (k.ratio(src) != k.ratio(l))
      k.fail(fmt::format("layer {} has ratio {} but its kv source (the latest at or below it) is layer {} with ratio {}",
                         l, k.ratio(l), src, k.ratio(src)));
  }
  // The candidate pool.
  if (c.candidate_source_layer >= 0) {
    const int64_t s = c.candidate_source_layer;
    if (s >= c.n_layers) k.fail(fmt::format("candidate_source_layer = {} is outside [0, {})", s, c.n_layers));
    if (!contains(c.kv_source_layers, s) || k.ratio(s) != 1)
      k.fail(fmt::format("candidate_source_layer = {} must be a ratio-1 kv source (ratio {}, kv sources {})", s,
                         k.ratio(s), fmt::join(c.kv_source_layers, ",")));
    k.positive("candidate_topk_blocks", c.candidate_topk_blocks);
    k.positive("candidate_block_size", c.candidate_block_size);
    if (c.candidate_topk_blocks * c.candidate_block_size < c.index_topk)
      k.fail(fmt::format("candidate_topk_blocks * candidate_block_size = {} * {} = {} < index_topk = {}: a consumer's "
                         "top-k would pick positions outside the candidate pool",
                         c.candidate_topk_blocks, c.candidate_block_size,
                         c.candidate_topk_blocks * c.candidate_block_size, c.index_topk));
  }
  const int64_t E = c.kv_source_layers.back();

  // Engram.
  k.layer_list("engram_layer_ids", c.engram_layer_ids);
  if (c.engram_num_embeddings.size() != c.engram_layer_ids.size())
    k.fail(fmt::format("engram_num_embeddings has {} entries for {} Engram layers", c.engram_num_embeddings.size(),
                       c.engram_layer_ids.size()));
  if (!c.engram_layer_ids.empty()) {
    for (int64_t l : c.engram_layer_ids)
      if (l >= E)
        k.fail(fmt::format("Engram on layer {}: Engram must lie below the first decoder layer E = {} "
                           "(the largest kv source)", l, E));
    if (c.engram_max_ngram_size < 2)
      k.fail(fmt::format("engram_max_ngram_size = {} must be at least 2", c.engram_max_ngram_size));
    k.positive("engram_n_heads", c.engram_n_heads);
    k.positive("engram_head_dim", c.engram_head_dim);
    k.positive("engram_vocab_size", c.engram_vocab_size);
    k.positive("engram_compressed_vocab_size", c.engram_compressed_vocab_size);
    k.multiple_of_32("engram_head_dim", c.engram_head_dim, "the Engram table rows have one e8m0 scale per 32");
    k.multiple_of_32("(engram_max_ngram_size - 1) * engram_n_heads * engram_head_dim",
                     (c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim, "the input of engram.wkv");
    if (c.engram_pad_id < 0 || c.engram_pad_id >= c.vocab_size)
      k.fail(fmt::format("engram_pad_id = {} is outside [0, vocab_size = {})", c.engram_pad_id, c.vocab_size));
    const auto rows = v41_engram_rows(c);
    for (size_t i = 0; i < rows.size(); ++i)
      if (c.engram_num_embeddings[i] != rows[i])
        k.fail(fmt::format("engram_num_embeddings[{}] = {}, but layer {}'s {} prime buckets from engram_vocab_size = {} "
                           "sum to {}", i, c.engram_num_embeddings[i], c.engram_layer_ids[i],
                           (c.engram_max_ngram_size - 1) * c.engram_n_heads, c.engram_vocab_size, rows[i]));
  }

  // DSpark.
  if (c.dspark_block_size < 0) k.fail(fmt::format("dspark_block_size = {} is negative", c.dspark_block_size));
  if (c.dspark_block_size > 0) {
    k.positive("n_mtp_layers", c.n_mtp_layers);
    if (c.dspark_target_layer_ids.empty()) k.fail("dspark_target_layer_ids is empty; DSpark needs target layers");
    k.layer_list("dspark_target_layer_ids", c.dspark_target_layer_ids);
    if (c.dspark_noise_token_id < 0 || c.dspark_noise_token_id >= c.vocab_size)
      k.fail(fmt::format("dspark_noise_token_id = {} is outside [0, vocab_size = {})", c.dspark_noise_token_id,
                         c.vocab_size));
  }
  // Vision.
  if (c.vision_n_layers < 0) k.fail(fmt::format("vision_n_layers = {} is negative", c.vision_n_layers));
  if (c.vision_n_layers > 0 && (c.image_token_id < 0 || c.image_token_id >= c.vocab_size))
    k.fail(fmt::format("image_token_id = {} is outside [0, vocab_size = {})", c.image_token_id, c.vocab_size));
}

}  // namespace ced::v41
