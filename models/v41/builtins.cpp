// docs/v41.md §5: the v41 built-ins.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "model/error.hpp"
#include "models/v41/config.hpp"

namespace ced::v41 {
namespace {

// The release's scale-independent values (its inference/config.json), DSpark and vision off.
V41Config common() {
  V41Config c;
  c.n_mtp_layers = 0;
  c.dspark_block_size = 0;
  c.n_shared_experts = 1;
  c.score_func = "sqrtsoftplus";
  c.route_scale = 1.5;
  c.swiglu_limit = 10.0;
  c.norm_eps = 1e-20;
  c.compress_rope_theta = 160000.0;
  c.rope_theta = 10000.0;
  c.beta_fast = 32;
  c.beta_slow = 1;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.engram_max_ngram_size = 4;
  c.engram_pad_id = 2;
  c.dtype = "fp8";
  c.expert_dtype = "fp4";
  c.vision_n_layers = 0;
  return c;
}

// One layer per block role: 0 SWA-only; 1 ratio-2 Full (kv + index source); 2 ratio-2 Reuse;
// 3 ratio-1 Full + candidate source; 4 ratio-1 Reindex; 5 ratio-1 Reuse. Engram on 0 and 2.
void six_roles(V41Config& c) {
  c.n_layers = 6;
  c.compress_ratios = {0, 2, 2, 1, 1, 1};
  c.kv_source_layers = {1, 3};
  c.index_source_layers = {1, 3, 4};
  c.candidate_source_layer = 3;
  c.engram_layer_ids = {0, 2};
}

// The Engram tables of a stub tokenizer whose map halves the vocabulary (docs/v41.md §5).
void engram_tables(V41Config& c) {
  c.engram_compressed_vocab_size = c.vocab_size / 2;
  c.engram_num_embeddings = v41_engram_rows(c);
}

// The release's 40 layers and 3 DSpark entries: SWA-only 0-1; ratio 2 on 2-19 (Full at 2, 8, 14);
// ratio 1 on 20-39 (Full and candidate source at 20, Reindex at 24, 28, 32, 36); 40-42 DSpark (0).
void release_schedule(V41Config& c) {
  c.n_layers = 40;
  c.n_mtp_layers = 3;
  c.compress_ratios.assign(43, 0);
  for (int l = 2; l < 20; ++l) c.compress_ratios[static_cast<size_t>(l)] = 2;
  for (int l = 20; l < 40; ++l) c.compress_ratios[static_cast<size_t>(l)] = 1;
  c.kv_source_layers = {2, 8, 14, 20};
  c.index_source_layers = {2, 8, 14, 20, 24, 28, 32, 36};
  c.candidate_source_layer = 20;
  c.engram_layer_ids = {1, 14};
  c.window_size = 128;
}

V41Config make_tiny() {
  V41Config c = common();
  c.name = "v41-tiny";
  six_roles(c);
  c.vocab_size = 1024;
  c.dim = 256;
  c.moe_inter_dim = 128;
  c.n_heads = 4;
  c.n_routed_experts = 8;
  c.n_activated_experts = 2;
  c.q_lora_rank = 64;
  c.head_dim = 64;
  c.rope_head_dim = 16;
  c.o_groups = 2;
  c.o_lora_rank = 64;
  c.window_size = 16;
  c.index_n_heads = 4;
  c.index_head_dim = 64;
  c.index_topk = 8;
  c.candidate_topk_blocks = 3;
  c.candidate_block_size = 4;
  c.original_seq_len = 32;
  c.rope_factor = 4;
  c.engram_vocab_size = 100;
  c.engram_n_heads = 2;
  c.engram_head_dim = 32;
  engram_tables(c);
  return c;
}

V41Config make_wide() {
  V41Config c = common();
  c.name = "v41-wide";
  six_roles(c);
  c.vocab_size = 1024;
  c.dim = 512;
  c.moe_inter_dim = 256;
  c.n_heads = 8;
  c.n_routed_experts = 8;
  c.n_activated_experts = 2;
  c.q_lora_rank = 128;
  c.head_dim = 512;
  c.rope_head_dim = 64;
  c.o_groups = 4;
  c.o_lora_rank = 128;
  c.window_size = 128;
  c.index_n_heads = 8;
  c.index_head_dim = 128;
  c.index_topk = 64;
  c.candidate_topk_blocks = 16;
  c.candidate_block_size = 8;
  c.original_seq_len = 256;
  c.rope_factor = 16;
  c.engram_vocab_size = 1000;
  c.engram_n_heads = 4;
  c.engram_head_dim = 64;
  engram_tables(c);
  return c;
}

// The release's schedule, sources, Engram layers, window and candidate block at small widths:
// E = 20, D = 20, W = 128, R = 2541. DSpark stays off (its three ratio entries are kept).
V41Config make_ced() {
  V41Config c = common();
  c.name = "v41-ced";
  release_schedule(c);
  c.vocab_size = 1024;
  c.dim = 64;
  c.moe_inter_dim = 32;
  c.n_heads = 4;
  c.n_routed_experts = 8;
  c.n_activated_experts = 2;
  c.q_lora_rank = 32;
  c.head_dim = 32;
  c.rope_head_dim = 16;
  c.o_groups = 2;
  c.o_lora_rank = 32;
  c.index_n_heads = 2;
  c.index_head_dim = 32;
  c.index_topk = 32;
  c.candidate_topk_blocks = 16;
  c.candidate_block_size = 8;
  c.original_seq_len = 256;
  c.rope_factor = 16;
  c.engram_vocab_size = 100;
  c.engram_n_heads = 2;
  c.engram_head_dim = 32;
  engram_tables(c);
  return c;
}

// The released sizes, every value as the release's inference/config.json has it.
V41Config make_flash() {
  V41Config c;
  c.name = "v41-flash";
  c.analytic_only = true;
  c.vocab_size = 129280;
  c.dim = 5120;
  c.moe_inter_dim = 2304;
  c.n_layers = 40;
  c.n_mtp_layers = 3;
  c.dspark_block_size = 5;
  c.dspark_noise_token_id = 128799;
  c.dspark_target_layer_ids = {37, 38, 39};
  c.dspark_markov_rank = 256;
  c.dspark_n_routed_experts = 128;
  c.dspark_n_activated_experts = 3;
  c.n_heads = 64;
  c.n_routed_experts = 384;
  c.n_shared_experts = 1;
  c.n_activated_experts = 6;
  c.score_func = "sqrtsoftplus";
  c.route_scale = 1.5;
  c.swiglu_limit = 10.0;
  c.q_lora_rank = 1280;
  c.head_dim = 512;
  c.rope_head_dim = 64;
  c.norm_eps = 1e-20;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  release_schedule(c);
  c.original_seq_len = 65536;
  c.rope_theta = 10000;
  c.rope_factor = 16;
  c.beta_fast = 32;
  c.beta_slow = 1;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.candidate_topk_blocks = 2048;
  c.candidate_block_size = 8;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.engram_vocab_size = 16000000;
  c.engram_num_embeddings = {384006168, 384016682};
  c.engram_max_ngram_size = 4;
  c.engram_pad_id = 2;
  c.engram_compressed_vocab_size = 99092;
  c.dtype = "fp8";
  c.expert_dtype = "fp4";
  c.compress_rope_theta = 160000;
  c.vision_n_layers = 32;
  c.vision_dim = 1024;
  c.vision_n_heads = 16;
  c.vision_inter_dim = 2816;
  c.vision_patch_size = 14;
  c.vision_downsample_ratio = 3;
  c.vision_max_n_token = 1024;
  c.vision_min_pixels = 295936;
  c.vision_max_wh_ratio.reset();
  c.image_token_id = 129264;
  c.engram_n_heads = 8;
  c.engram_head_dim = 256;
  c.vision_rope_theta = 10000;
  return c;
}

}  // namespace

namespace {

// The one table of built-ins: each name with the function that makes it.
struct Builtin {
  const char* name;
  V41Config (*make)();
};
constexpr Builtin kBuiltins[] = {{"v41-tiny", make_tiny}, {"v41-wide", make_wide}, {"v41-ced", make_ced},
                                 {"v41-flash", make_flash}};

}  // namespace

const std::vector<std::string>& v41_builtin_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& b : kBuiltins) n.emplace_back(b.name);
    return n;
  }();
  return names;
}

bool is_v41_builtin(std::string_view name) {
  return std::any_of(std::begin(kBuiltins), std::end(kBuiltins), [&](const Builtin& b) { return name == b.name; });
}

V41Config v41_builtin_config(std::string_view name) {
  for (const auto& b : kBuiltins)
    if (name == b.name) {
      V41Config c = b.make();
      validate_v41(c);
      return c;
    }
  throw InputError(fmt::format("v41 config: unknown built-in '{}' (built-ins: {})", name,
                               fmt::join(v41_builtin_names(), ", ")));
}

}  // namespace ced::v41
