// docs/v41.md §4-§7: the v41 config files (both of the release's), the built-ins, every validation
// rule's message, and the layer plan against the release's schedule and the tiny one by hand.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "model/error.hpp"
#include "models/v41/boundary_lengths.hpp"
#include "models/v41/config.hpp"
#include "models/v41/run_types.hpp"
#include "models/v41/plan.hpp"

using namespace ced::v41;
using ced::InputError;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The error of validating c after `edit`; must be one line.
std::string invalid(std::string_view builtin, const std::function<void(V41Config&)>& edit) {
  V41Config c = v41_builtin_config(builtin);
  edit(c);
  const std::string e = error_of([&] { validate_v41(c); });
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  return e;
}

// v41-tiny's flat inference/config.json, written by hand from the release's key names (not by our
// writer), in an order of its own: the reader must not care about order.
const char* kTinyFlat = R"({
  "dim": 256, "vocab_size": 1024, "moe_inter_dim": 128, "n_layers": 6, "n_mtp_layers": 0,
  "dspark_block_size": 0, "dspark_noise_token_id": 0, "dspark_target_layer_ids": [],
  "dspark_markov_rank": 256, "dspark_n_routed_experts": 0, "dspark_n_activated_experts": 0,
  "n_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1, "n_activated_experts": 2,
  "score_func": "sqrtsoftplus", "route_scale": 1.5, "swiglu_limit": 10.0, "q_lora_rank": 64,
  "head_dim": 64, "rope_head_dim": 16, "norm_eps": 1e-20, "o_groups": 2, "o_lora_rank": 64,
  "window_size": 16, "kv_source_layers": [1, 3], "index_source_layers": [1, 3, 4],
  "original_seq_len": 32, "rope_theta": 10000, "rope_factor": 4, "beta_fast": 32, "beta_slow": 1,
  "index_n_heads": 4, "index_head_dim": 64, "index_topk": 8, "candidate_source_layer": 3,
  "candidate_topk_blocks": 3, "candidate_block_size": 4, "hc_mult": 4, "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-06, "engram_layer_ids": [0, 2], "engram_vocab_size": 100,
  "engram_num_embeddings": [660, 864], "engram_max_ngram_size": 4, "engram_pad_id": 2,
  "engram_compressed_vocab_size": 512, "dtype": "fp8", "expert_dtype": "fp4",
  "compress_rope_theta": 160000, "compress_ratios": [0, 2, 2, 1, 1, 1], "vision_n_layers": 0,
  "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816, "vision_patch_size": 14,
  "vision_downsample_ratio": 3, "vision_max_n_token": 1024, "vision_min_pixels": 295936,
  "vision_max_wh_ratio": null, "image_token_id": 129264, "engram_n_heads": 2,
  "engram_head_dim": 32, "vision_rope_theta": 10000
})";

// v41-tiny's HF config.json, by hand with the release's HF names (docs/v41.md §4.2's table).
const char* kTinyHf = R"({
  "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
  "torch_dtype": "bfloat16", "transformers_version": "4.57.0", "bos_token_id": 0, "eos_token_id": 1,
  "image_token_id": 129264,
  "quantization_config": {"activation_scheme": "dynamic", "expert_dtype": "fp4", "quant_method": "fp8",
                          "scale_fmt": "ue8m0", "weight_block_size": [32, 32]},
  "text_config": {
    "model_type": "deepseek_v41_text", "vocab_size": 1024, "hidden_size": 256,
    "moe_intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 64, "qk_rope_head_dim": 16, "q_lora_rank": 64,
    "o_lora_rank": 64, "o_groups": 2, "hidden_act": "silu", "swiglu_limit": 10, "rms_norm_eps": 1e-20,
    "attention_bias": false, "tie_word_embeddings": false, "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 32},
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": true,
    "routed_scaling_factor": 1.5, "sliding_window": 16, "compress_ratios": [0, 2, 2, 1, 1, 1],
    "compress_rope_theta": 160000, "kv_source_layer_ids": [1, 3], "index_source_layer_ids": [1, 3, 4],
    "index_n_heads": 4, "index_head_dim": 64, "index_topk": 8, "candidate_source_layer_id": 3,
    "candidate_topk_blocks": 3, "candidate_block_size": 4, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "engram_layer_ids": [0, 2], "engram_num_embeddings": [660, 864],
    "engram_max_ngram_size": 4, "engram_vocab_size": 100, "engram_n_heads": 2, "engram_head_dim": 32,
    "engram_pad_token_id": 2, "engram_compressed_vocab_size": 512, "num_nextn_predict_layers": 0,
    "dspark_block_size": 0, "dspark_noise_token_id": 0, "dspark_target_layer_ids": [],
    "dspark_markov_rank": 256, "dspark_n_routed_experts": 0, "dspark_num_experts_per_tok": 0
  },
  "vision_config": {"model_type": "deepseek_v41_vision", "num_hidden_layers": 0, "hidden_size": 1024,
                    "num_attention_heads": 16, "intermediate_size": 2816, "patch_size": 14,
                    "rope_theta": 10000, "downsample_ratio": 3, "max_image_tokens": 1024,
                    "min_pixels": 295936, "max_wh_ratio": null}
})";

V41Config named(V41Config c, const std::string& name) {
  c.name = name;
  return c;
}

// A config whose every integer, real and list field holds a value of its own (not a valid model):
// a round trip through a file then shows that no two fields share a key and none is dropped.
V41Config distinct_values() {
  V41Config c;
  int64_t n = 1000;
  double r = 0.5;
  c.vocab_size = n++; c.dim = n++; c.moe_inter_dim = n++; c.n_layers = n++; c.n_mtp_layers = n++;
  c.dspark_block_size = n++; c.dspark_noise_token_id = n++; c.dspark_target_layer_ids = {n++, n++};
  c.dspark_markov_rank = n++; c.dspark_n_routed_experts = n++; c.dspark_n_activated_experts = n++;
  c.n_heads = n++; c.n_routed_experts = n++; c.n_shared_experts = n++; c.n_activated_experts = n++;
  c.score_func = "sigmoid"; c.route_scale = r += 1; c.swiglu_limit = r += 1; c.q_lora_rank = n++;
  c.head_dim = n++; c.rope_head_dim = n++; c.norm_eps = r += 1; c.o_groups = n++; c.o_lora_rank = n++;
  c.window_size = n++; c.kv_source_layers = {n++}; c.index_source_layers = {n++, n++};
  c.original_seq_len = n++; c.rope_theta = r += 1; c.rope_factor = r += 1; c.beta_fast = n++;
  c.beta_slow = n++; c.index_n_heads = n++; c.index_head_dim = n++; c.index_topk = n++;
  c.candidate_source_layer = n++; c.candidate_topk_blocks = n++; c.candidate_block_size = n++;
  c.hc_mult = n++; c.hc_sinkhorn_iters = n++; c.hc_eps = r += 1; c.engram_layer_ids = {n++};
  c.engram_vocab_size = n++; c.engram_num_embeddings = {n++, n++, n++}; c.engram_max_ngram_size = n++;
  c.engram_pad_id = n++; c.engram_compressed_vocab_size = n++; c.dtype = "fp8"; c.expert_dtype.reset();
  c.compress_rope_theta = r += 1; c.compress_ratios = {n++, n++, n++, n++}; c.vision_n_layers = n++;
  c.vision_dim = n++; c.vision_n_heads = n++; c.vision_inter_dim = n++; c.vision_patch_size = n++;
  c.vision_downsample_ratio = n++; c.vision_max_n_token = n++; c.vision_min_pixels = n++;
  c.vision_max_wh_ratio = n++; c.image_token_id = n++; c.engram_n_heads = n++; c.engram_head_dim = n++;
  c.vision_rope_theta = r += 1; c.gate_temp = r += 1; c.norm_topk_prob = false;
  return c;
}

}  // namespace

// ---- built-ins ----

TEST(V41Builtins, EveryBuiltinValidates) {
  for (const auto& n : v41_builtin_names()) EXPECT_NO_THROW(v41_builtin_config(n)) << n;
  EXPECT_NE(error_of([] { v41_builtin_config("v41-nope"); }).find("unknown built-in 'v41-nope'"), std::string::npos);
}

TEST(V41Builtins, TinyIsTheReadmesTinyRow) {
  const V41Config c = v41_builtin_config("v41-tiny");
  EXPECT_EQ(c.dim, 256);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_head_dim, 16);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.o_lora_rank, 64);
  EXPECT_EQ(c.o_groups, 2);
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.n_activated_experts, 2);
  EXPECT_EQ(c.moe_inter_dim, 128);
  EXPECT_EQ(c.window_size, 16);
  EXPECT_EQ(c.index_n_heads, 4);
  EXPECT_EQ(c.index_head_dim, 64);
  EXPECT_EQ(c.index_topk, 8);
  EXPECT_EQ(c.candidate_topk_blocks, 3);
  EXPECT_EQ(c.candidate_block_size, 4);
  EXPECT_EQ(c.original_seq_len, 32);
  EXPECT_EQ(c.rope_factor, 4);
  EXPECT_EQ(c.vocab_size, 1024);
  EXPECT_EQ(c.engram_layer_ids, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(c.engram_compressed_vocab_size, 512);
  EXPECT_EQ(c.compress_ratios, (std::vector<int64_t>{0, 2, 2, 1, 1, 1}));
  EXPECT_FALSE(c.analytic_only);
}

TEST(V41Builtins, WideKeepsTheReleasesPerHeadGeometry) {
  const V41Config c = v41_builtin_config("v41-wide");
  const V41Config f = v41_builtin_config("v41-flash");
  EXPECT_EQ(c.head_dim, f.head_dim);
  EXPECT_EQ(c.rope_head_dim, f.rope_head_dim);
  EXPECT_EQ(c.index_head_dim, f.index_head_dim);
  EXPECT_EQ(c.window_size, f.window_size);
  EXPECT_EQ(c.candidate_block_size, f.candidate_block_size);
  EXPECT_EQ(c.dim, 512);
  EXPECT_EQ(c.index_topk, 64);
  EXPECT_EQ(c.candidate_topk_blocks, 16);
  EXPECT_EQ(c.compress_ratios, v41_builtin_config("v41-tiny").compress_ratios);
}

TEST(V41Builtins, CedHasTheReleasesScheduleAtSmallWidths) {
  const V41Config c = v41_builtin_config("v41-ced");
  const V41Config f = v41_builtin_config("v41-flash");
  EXPECT_EQ(c.n_layers, f.n_layers);
  EXPECT_EQ(c.n_mtp_layers, f.n_mtp_layers);
  EXPECT_EQ(c.compress_ratios, f.compress_ratios);
  EXPECT_EQ(c.compress_ratios.size(), 43u);
  EXPECT_EQ(c.kv_source_layers, f.kv_source_layers);
  EXPECT_EQ(c.index_source_layers, f.index_source_layers);
  EXPECT_EQ(c.candidate_source_layer, f.candidate_source_layer);
  EXPECT_EQ(c.engram_layer_ids, f.engram_layer_ids);
  EXPECT_EQ(c.window_size, 128);
  EXPECT_LE(c.dim, 64);
  const V41Plan p = make_v41_plan(c);
  EXPECT_EQ(p.E, 20);
  EXPECT_EQ(p.W, 128);
  EXPECT_FALSE(c.analytic_only);
}

TEST(V41Builtins, FlashIsTheReleasedConfigAndAnalyticOnly) {
  const V41Config f = v41_builtin_config("v41-flash");
  EXPECT_TRUE(f.analytic_only);
  EXPECT_EQ(f.dim, 5120);
  EXPECT_EQ(f.n_routed_experts, 384);
  EXPECT_EQ(f.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(f.dspark_target_layer_ids, (std::vector<int64_t>{37, 38, 39}));
  EXPECT_EQ(f.vision_n_layers, 32);
  EXPECT_FALSE(f.vision_max_wh_ratio.has_value());
}

TEST(V41EngramRows, AreTheSumsOfConsecutiveUnusedPrimes) {
  // Tiny: 3 n-gram sizes x 2 heads = 6 primes per layer above 99, never reused: layer 0 takes
  // 101 103 107 109 113 127 (= 660), layer 2 the next six, 131 137 139 149 151 157 (= 864).
  EXPECT_EQ(v41_engram_rows(v41_builtin_config("v41-tiny")), (std::vector<int64_t>{660, 864}));
  // The release's table rows (its engram_num_embeddings), from 24 primes per layer above 15999999.
  EXPECT_EQ(v41_engram_rows(v41_builtin_config("v41-flash")), (std::vector<int64_t>{384006168, 384016682}));
}

TEST(V41EngramRows, ThePrimesStartStrictlyAboveTheVocabularyEvenWhenItsLastIdIsPrime) {
  // The official find_next_prime returns the smallest unused prime *above* its start, vocab − 1: with a
  // vocabulary of 102, 101 is prime and is not taken; the first prime is 103.
  V41Config c = v41_builtin_config("v41-tiny");
  c.engram_vocab_size = 102;
  const auto primes = v41_engram_primes(c);
  ASSERT_FALSE(primes.empty());
  EXPECT_EQ(primes.front().front(), 103);
  EXPECT_EQ(std::count(primes.front().begin(), primes.front().end(), 101), 0);
}

// ---- the files ----

TEST(V41ConfigFiles, AHandWrittenFlatFileReadsAsTiny) {
  EXPECT_EQ(parse_v41_flat_json(kTinyFlat, "f.json"), named(v41_builtin_config("v41-tiny"), "f.json"));
}

TEST(V41ConfigFiles, AHandWrittenHfFileReadsAsTiny) {
  EXPECT_EQ(parse_v41_hf_json(kTinyHf, "c.json"), named(v41_builtin_config("v41-tiny"), "c.json"));
}

TEST(V41ConfigFiles, EveryBuiltinRoundTripsThroughBothFiles) {
  for (const auto& n : v41_builtin_names()) {
    const V41Config c = named(v41_builtin_config(n), "x");
    V41Config flat = parse_v41_flat_json(write_v41_flat_json(c), "x");
    V41Config hf = parse_v41_hf_json(write_v41_hf_json(c), "x");
    flat.analytic_only = hf.analytic_only = c.analytic_only;
    EXPECT_EQ(flat, c) << n;
    EXPECT_EQ(hf, c) << n;
    EXPECT_TRUE(v41_config_disagreements(flat, hf).empty()) << n;
  }
}

TEST(V41ConfigFiles, EveryFieldHasAKeyOfItsOwnInBothFiles) {
  const V41Config c = named(distinct_values(), "x");
  EXPECT_EQ(parse_v41_flat_json(write_v41_flat_json(c), "x"), c);
  EXPECT_EQ(parse_v41_hf_json(write_v41_hf_json(c), "x"), c);
}

TEST(V41ConfigFiles, TheFlatWriterFollowsTheReleasesKeysOrderAndNumberForms) {
  const std::string s = write_v41_flat_json(v41_builtin_config("v41-flash"));
  EXPECT_EQ(s.rfind("{\n    \"vocab_size\": 129280,\n    \"dim\": 5120,\n    \"moe_inter_dim\": 2304,\n", 0), 0u);
  EXPECT_TRUE(s.ends_with(",\n    \"vision_rope_theta\": 10000\n}\n"));
  for (const char* line : {"\"dspark_target_layer_ids\": [37, 38, 39],", "\"swiglu_limit\": 10.0,",
                           "\"norm_eps\": 1e-20,", "\"hc_eps\": 1e-06,", "\"rope_theta\": 10000,",
                           "\"rope_factor\": 16,", "\"compress_rope_theta\": 160000,", "\"route_scale\": 1.5,",
                           "\"vision_max_wh_ratio\": null,", "\"expert_dtype\": \"fp4\",",
                           "\"engram_num_embeddings\": [384006168, 384016682],",
                           "\"compress_ratios\": [0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, "
                           "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],"})
    EXPECT_NE(s.find(line), std::string::npos) << line;
  // The keys appear in the table's order, the release's; the defaults of gate_temp and
  // norm_topk_prob are left out, and written when changed.
  size_t at = 0;
  for (const auto& k : v41_keys()) {
    const size_t p = s.find(std::string("\"") + k.flat + "\":");
    if (!k.flat_required) {
      EXPECT_EQ(p, std::string::npos) << k.flat;
      continue;
    }
    ASSERT_NE(p, std::string::npos) << k.flat;
    EXPECT_GT(p, at) << k.flat;
    at = p;
  }
  V41Config t = v41_builtin_config("v41-tiny");
  t.gate_temp = 2.0;
  EXPECT_NE(write_v41_flat_json(t).find("\"gate_temp\": 2.0\n}"), std::string::npos);
}

// The key order of the release's two files, written down here (not taken from the code's table).
const std::vector<std::string> kReleaseFlatOrder = {
    "vocab_size", "dim", "moe_inter_dim", "n_layers", "n_mtp_layers", "dspark_block_size", "dspark_noise_token_id",
    "dspark_target_layer_ids", "dspark_markov_rank", "dspark_n_routed_experts", "dspark_n_activated_experts",
    "n_heads", "n_routed_experts", "n_shared_experts", "n_activated_experts", "score_func", "route_scale",
    "swiglu_limit", "q_lora_rank", "head_dim", "rope_head_dim", "norm_eps", "o_groups", "o_lora_rank", "window_size",
    "kv_source_layers", "index_source_layers", "original_seq_len", "rope_theta", "rope_factor", "beta_fast",
    "beta_slow", "index_n_heads", "index_head_dim", "index_topk", "candidate_source_layer", "candidate_topk_blocks",
    "candidate_block_size", "hc_mult", "hc_sinkhorn_iters", "hc_eps", "engram_layer_ids", "engram_vocab_size",
    "engram_num_embeddings", "engram_max_ngram_size", "engram_pad_id", "engram_compressed_vocab_size", "dtype",
    "expert_dtype", "compress_rope_theta", "compress_ratios", "vision_n_layers", "vision_dim", "vision_n_heads",
    "vision_inter_dim", "vision_patch_size", "vision_downsample_ratio", "vision_max_n_token", "vision_min_pixels",
    "vision_max_wh_ratio", "image_token_id", "engram_n_heads", "engram_head_dim", "vision_rope_theta"};
const std::vector<std::string> kReleaseTextConfigOrder = {
    "model_type", "vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "hidden_act",
    "swiglu_limit", "rms_norm_eps", "attention_bias", "tie_word_embeddings", "max_position_embeddings", "rope_theta",
    "rope_scaling", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "scoring_func", "topk_method",
    "norm_topk_prob", "routed_scaling_factor", "sliding_window", "compress_ratios", "compress_rope_theta",
    "kv_source_layer_ids", "index_source_layer_ids", "index_n_heads", "index_head_dim", "index_topk",
    "candidate_source_layer_id", "candidate_topk_blocks", "candidate_block_size", "hc_mult", "hc_sinkhorn_iters",
    "hc_eps", "engram_layer_ids", "engram_num_embeddings", "engram_max_ngram_size", "engram_vocab_size",
    "engram_n_heads", "engram_head_dim", "engram_pad_token_id", "engram_compressed_vocab_size",
    "num_nextn_predict_layers", "dspark_block_size", "dspark_noise_token_id", "dspark_target_layer_ids",
    "dspark_markov_rank", "dspark_n_routed_experts", "dspark_num_experts_per_tok"};

// The keys of the lines of `text` indented by exactly `indent` spaces, in order.
std::vector<std::string> keys_at_indent(const std::string& text, size_t indent) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    if (line.size() > indent + 1 && line.find_first_not_of(' ') == indent && line[indent] == '"')
      out.push_back(line.substr(indent + 1, line.find('"', indent + 1) - indent - 1));
    at = end + 1;
  }
  return out;
}

TEST(V41ConfigFiles, BothWritersPutTheKeysInTheReleasesOrder) {
  const V41Config f = v41_builtin_config("v41-flash");
  EXPECT_EQ(keys_at_indent(write_v41_flat_json(f), 4), kReleaseFlatOrder);
  const std::string hf = write_v41_hf_json(f);
  const size_t a = hf.find("\"text_config\": {"), b = hf.find("\"vision_config\": {");
  ASSERT_LT(a, b);
  EXPECT_EQ(keys_at_indent(hf.substr(a, b - a), 4), kReleaseTextConfigOrder);
}

TEST(V41ConfigFiles, TheHfWriterNestsTextConfigWithTheReleasesNames) {
  const std::string s = write_v41_hf_json(v41_builtin_config("v41-flash"));
  for (const char* part : {"\"architectures\": [\n    \"DeepseekV41ForCausalLM\"\n  ]", "\"model_type\": \"deepseek_v41\"",
                           "\"quant_method\": \"fp8\"", "\"weight_block_size\": [\n      32,\n      32\n    ]",
                           "\"scale_fmt\": \"ue8m0\"", "\"expert_dtype\": \"fp4\"",
                           "\"model_type\": \"deepseek_v41_text\"", "\"hidden_size\": 5120",
                           "\"num_attention_heads\": 64", "\"sliding_window\": 128", "\"rope_type\": \"yarn\"",
                           "\"original_max_position_embeddings\": 65536", "\"candidate_source_layer_id\": 20",
                           "\"engram_pad_token_id\": 2", "\"num_nextn_predict_layers\": 3",
                           "\"dspark_num_experts_per_tok\": 3", "\"max_image_tokens\": 1024",
                           "\"max_position_embeddings\": 1048576"})
    EXPECT_NE(s.find(part), std::string::npos) << part;
  EXPECT_LT(s.find("\"text_config\""), s.find("\"vision_config\""));
  EXPECT_LT(s.find("\"vocab_size\""), s.find("\"hidden_size\""));
  EXPECT_LT(s.find("\"dspark_markov_rank\""), s.find("\"dspark_num_experts_per_tok\""));
}

TEST(V41ConfigFiles, ABf16ConfigHasNoQuantizationConfigAndReadsBack) {
  V41Config c = named(v41_builtin_config("v41-tiny"), "x");
  c.dtype = "bf16";
  c.expert_dtype.reset();
  const std::string s = write_v41_hf_json(c);
  EXPECT_EQ(s.find("quantization_config"), std::string::npos);
  EXPECT_EQ(parse_v41_hf_json(s, "x"), c);
}

TEST(V41ConfigFiles, NoYarnIsRopeScalingNullAndTheCrossCheckIgnoresItsFields) {
  V41Config c = named(v41_builtin_config("v41-tiny"), "x");
  c.original_seq_len = 0;
  const std::string s = write_v41_hf_json(c);
  EXPECT_NE(s.find("\"rope_scaling\": null"), std::string::npos);
  const V41Config hf = parse_v41_hf_json(s, "x");
  EXPECT_EQ(hf.original_seq_len, 0);
  EXPECT_NE(hf.rope_factor, c.rope_factor);  // not in the file: the ModelArgs default
  EXPECT_TRUE(v41_config_disagreements(c, hf).empty());
}

// YaRN in one file only. The cross-check skips the rope_scaling fields only when neither file has YaRN
// (a null rope_scaling leaves them at the ModelArgs defaults); one file with it and one without disagree
// on original_seq_len, whichever of the two has it. Both configs read back from the writers' files.
TEST(V41ConfigFiles, YarnInOneFileOnlyIsADisagreementWhicheverFileHasIt) {
  const V41Config yarn = named(v41_builtin_config("v41-tiny"), "x");
  ASSERT_EQ(yarn.original_seq_len, 32);
  V41Config plain = yarn;
  plain.original_seq_len = 0;
  const V41Config hf_yarn = parse_v41_hf_json(write_v41_hf_json(yarn), "x");
  const V41Config hf_plain = parse_v41_hf_json(write_v41_hf_json(plain), "x");
  const V41Config flat_yarn = parse_v41_flat_json(write_v41_flat_json(yarn), "x");
  const V41Config flat_plain = parse_v41_flat_json(write_v41_flat_json(plain), "x");
  auto has = [](const std::vector<std::string>& d, const std::string& line) {
    return std::find(d.begin(), d.end(), line) != d.end();
  };
  // YaRN only in inference/config.json.
  const auto only_flat = v41_config_disagreements(flat_yarn, hf_plain);
  EXPECT_TRUE(has(only_flat, "original_seq_len (config.json text_config.rope_scaling.original_max_position_embeddings "
                             "= 0, inference/config.json original_seq_len = 32)"))
      << fmt::format("{}", fmt::join(only_flat, "; "));
  // YaRN only in config.json.
  const auto only_hf = v41_config_disagreements(flat_plain, hf_yarn);
  EXPECT_TRUE(has(only_hf, "original_seq_len (config.json text_config.rope_scaling.original_max_position_embeddings "
                           "= 32, inference/config.json original_seq_len = 0)"))
      << fmt::format("{}", fmt::join(only_hf, "; "));
  // The control: with it in both, or in neither, they agree.
  EXPECT_TRUE(v41_config_disagreements(flat_yarn, hf_yarn).empty());
  EXPECT_TRUE(v41_config_disagreements(flat_plain, hf_plain).empty());
}

// ---- refusals: one line naming the file and the key ----

TEST(V41ConfigFiles, RefusesUnknownKeysNamingFileAndKey) {
  const std::string flat = std::string(kTinyFlat).replace(1, 0, "\"q_norm\": 1,");
  EXPECT_EQ(error_of([&] { parse_v41_flat_json(flat, "inf.json"); }),
            "v41 config: inf.json: q_norm: unknown key (not a ModelArgs field of the release)");
  const std::string runtime = std::string(kTinyFlat).replace(1, 0, "\"max_seq_len\": 4096,");
  EXPECT_NE(error_of([&] { parse_v41_flat_json(runtime, "inf.json"); }).find("max_seq_len: a per-run value"),
            std::string::npos);
  auto hf_with = [](const std::string& at, const std::string& text) {
    std::string s = kTinyHf;
    s.insert(s.find(at) + at.size(), text);
    return error_of([&] { parse_v41_hf_json(s, "config.json"); });
  };
  EXPECT_EQ(hf_with("\"text_config\": {", "\"mscale\": 1.0,"), "v41 config: config.json: text_config.mscale: unknown key");
  EXPECT_EQ(hf_with("\"rope_scaling\": {", "\"mscale\": 1.0,"),
            "v41 config: config.json: text_config.rope_scaling.mscale: unknown key");
  EXPECT_EQ(hf_with("\"vision_config\": {", "\"depth\": 1,"), "v41 config: config.json: vision_config.depth: unknown key");
  EXPECT_EQ(hf_with("\"quantization_config\": {", "\"fmt\": 1,"),
            "v41 config: config.json: quantization_config.fmt: unknown key");
  EXPECT_EQ(hf_with("{", "\"dim\": 256,"), "v41 config: config.json: dim: unknown top-level key");
  // A flat key inside text_config is unknown there.
  EXPECT_EQ(hf_with("\"text_config\": {", "\"n_heads\": 4,"), "v41 config: config.json: text_config.n_heads: unknown key");
}

TEST(V41ConfigFiles, RefusesMissingKeysNamingFileAndKey) {
  std::string flat = kTinyFlat;
  flat.erase(flat.find("\"head_dim\": 64,"), 15);
  EXPECT_EQ(error_of([&] { parse_v41_flat_json(flat, "inf.json"); }),
            "v41 config: inf.json: head_dim: missing (a required key)");
  std::string hf = kTinyHf;
  hf.erase(hf.find("\"num_attention_heads\": 4,"), 25);
  EXPECT_EQ(error_of([&] { parse_v41_hf_json(hf, "config.json"); }),
            "v41 config: config.json: text_config.num_attention_heads: missing (a required key)");
  std::string rope = kTinyHf;
  rope.erase(rope.find("\"factor\": 4,"), 12);
  EXPECT_EQ(error_of([&] { parse_v41_hf_json(rope, "config.json"); }),
            "v41 config: config.json: text_config.rope_scaling.factor: missing (a required key)");
  std::string vis = kTinyHf;
  vis.erase(vis.find("\"patch_size\": 14,"), 17);
  EXPECT_EQ(error_of([&] { parse_v41_hf_json(vis, "config.json"); }),
            "v41 config: config.json: vision_config.patch_size: missing (a required key)");
}

TEST(V41ConfigFiles, RefusesValuesOfTheWrongKind) {
  auto flat_with = [](const std::string& from, const std::string& to) {
    std::string s = kTinyFlat;
    s.replace(s.find(from), from.size(), to);
    return error_of([&] { parse_v41_flat_json(s, "inf.json"); });
  };
  EXPECT_EQ(flat_with("\"dim\": 256", "\"dim\": 256.0"), "v41 config: inf.json: dim: 256.0 is not an integer");
  EXPECT_EQ(flat_with("\"dim\": 256", "\"dim\": \"256\""), "v41 config: inf.json: dim: \"256\" is not an integer");
  EXPECT_EQ(flat_with("\"kv_source_layers\": [1, 3]", "\"kv_source_layers\": 1"),
            "v41 config: inf.json: kv_source_layers: 1 is not a list of integers");
  EXPECT_EQ(flat_with("\"route_scale\": 1.5", "\"route_scale\": true"),
            "v41 config: inf.json: route_scale: true is not a number");
  EXPECT_EQ(flat_with("\"expert_dtype\": \"fp4\"", "\"expert_dtype\": 4"),
            "v41 config: inf.json: expert_dtype: 4 is neither a string nor null");
  EXPECT_NE(error_of([] { parse_v41_flat_json("{\"dim\": ", "inf.json"); }).find("v41 config: inf.json: not valid JSON"),
            std::string::npos);
  EXPECT_EQ(error_of([] { parse_v41_flat_json("[1]", "inf.json"); }), "v41 config: inf.json: not a JSON object");
}

TEST(V41ConfigFiles, RefusesAnotherArchitectureOrAValueModelPyDoesNotImplement) {
  auto hf_with = [](const std::string& from, const std::string& to) {
    std::string s = kTinyHf;
    s.replace(s.find(from), from.size(), to);
    return error_of([&] { parse_v41_hf_json(s, "config.json"); });
  };
  EXPECT_EQ(hf_with("[\"DeepseekV41ForCausalLM\"]", "[\"DeepseekV4ForCausalLM\"]"),
            "v41 config: config.json: architectures: [\"DeepseekV4ForCausalLM\"] does not name DeepseekV41ForCausalLM");
  EXPECT_EQ(hf_with("\"model_type\": \"deepseek_v41\"", "\"model_type\": \"deepseek_v4\""),
            "v41 config: config.json: model_type: is \"deepseek_v4\", not \"deepseek_v41\"");
  EXPECT_EQ(hf_with("\"num_key_value_heads\": 1", "\"num_key_value_heads\": 2"),
            "v41 config: config.json: text_config.num_key_value_heads: is 2; the official model.py implies 1");
  EXPECT_EQ(hf_with("\"type\": \"yarn\"", "\"type\": \"linear\""),
            "v41 config: config.json: text_config.rope_scaling.type: is \"linear\"; the official model.py implements yarn");
  EXPECT_EQ(hf_with("\"weight_block_size\": [32, 32]", "\"weight_block_size\": [128, 128]"),
            "v41 config: config.json: quantization_config.weight_block_size: is [128,128]; the official model.py "
            "implements [32,32]");
}

TEST(V41ConfigFiles, TheCrossCheckNamesEveryDisagreeingKey) {
  const V41Config flat = v41_builtin_config("v41-tiny");
  V41Config hf = flat;
  hf.dim = 512;
  hf.compress_ratios = {0, 2, 2, 2, 1, 1};
  const auto d = v41_config_disagreements(flat, hf);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], "dim (config.json text_config.hidden_size = 512, inference/config.json dim = 256)");
  EXPECT_EQ(d[1], "compress_ratios (config.json text_config.compress_ratios = [0,2,2,2,1,1], inference/config.json "
                  "compress_ratios = [0,2,2,1,1,1])");
}

TEST(V41ConfigFiles, ACheckpointFolderIsReadFromWhicheverFilesItHas) {
  const auto dir = std::filesystem::temp_directory_path() / ("v41-config-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "inference");
  auto put = [](const std::filesystem::path& p, const std::string& s) { std::ofstream(p) << s; };
  const V41Config tiny = v41_builtin_config("v41-tiny");
  EXPECT_NE(error_of([&] { load_v41_checkpoint_config(dir); }).find("neither config.json nor inference/config.json"),
            std::string::npos);
  put(dir / "config.json", write_v41_hf_json(tiny));
  EXPECT_EQ(named(load_v41_checkpoint_config(dir), ""), named(tiny, ""));
  put(dir / "inference" / "config.json", write_v41_flat_json(tiny));
  EXPECT_EQ(named(load_v41_checkpoint_config(dir), ""), named(tiny, ""));
  V41Config other = tiny;
  other.window_size = 32;
  other.index_topk = 12;
  put(dir / "config.json", write_v41_hf_json(other));
  const std::string e = error_of([&] { load_v41_checkpoint_config(dir); });
  EXPECT_NE(e.find("disagree on 2 key(s): window_size (config.json text_config.sliding_window = 32, "
                   "inference/config.json window_size = 16); index_topk"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
  // A file that reads but does not validate is refused by validation, naming the file.
  V41Config bad = tiny;
  bad.dim = 250;
  put(dir / "inference" / "config.json", write_v41_flat_json(bad));
  std::filesystem::remove(dir / "config.json");
  EXPECT_NE(error_of([&] { load_v41_checkpoint_config(dir); })
                .find("inference/config.json: dim = 250 is not a multiple of 32"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

// ---- validation: every rule's message ----

TEST(V41Validation, RefusesAQuantizedInputWidthThatIsNotAMultipleOf32) {
  EXPECT_EQ(invalid("v41-tiny", [](V41Config& c) { c.dim = 240; }),
            "v41 config: v41-tiny: dim = 240 is not a multiple of 32 (the input of wq_a, wkv, the shared expert's "
            "w1/w3 and every routed w1/w3)");
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.q_lora_rank = 48; }).find("q_lora_rank = 48 is not a multiple of 32"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.o_lora_rank = 40; })
                .find("o_groups * o_lora_rank = 80 is not a multiple of 32 (the input of wo_b)"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.moe_inter_dim = 80; }).find("moe_inter_dim = 80 is not a multiple of 32"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.engram_head_dim = 16; }).find("engram_head_dim = 16 is not a multiple of 32"),
            std::string::npos);
}

TEST(V41Validation, RefusesHeadWidthsTheQuantizersCannotBlock) {
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.head_dim = 48; }).find("head_dim = 48 is not a multiple of 32"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.index_head_dim = 48; })
                .find("index_head_dim = 48 is not a multiple of 32 (the index queries and keys are FP4 per 32)"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.rope_head_dim = 15; }).find("rope_head_dim = 15 must be even"),
            std::string::npos);
}

TEST(V41Validation, RefusesACandidatePoolSmallerThanIndexTopk) {
  EXPECT_EQ(invalid("v41-tiny", [](V41Config& c) { c.index_topk = 13; }),
            "v41 config: v41-tiny: candidate_topk_blocks * candidate_block_size = 3 * 4 = 12 < index_topk = 13: a "
            "consumer's top-k would pick positions outside the candidate pool");
  // Exactly full is allowed.
  V41Config c = v41_builtin_config("v41-tiny");
  c.index_topk = 12;
  EXPECT_NO_THROW(validate_v41(c));
}

TEST(V41Validation, RefusesCompressRatiosOfTheWrongLength) {
  EXPECT_EQ(invalid("v41-flash", [](V41Config& c) { c.compress_ratios.resize(40); }),
            "v41 config: v41-flash: compress_ratios has 40 entries; n_layers + n_mtp_layers = 43");
  EXPECT_NE(invalid("v41-flash", [](V41Config& c) { c.compress_ratios[41] = 1; })
                .find("compress_ratios[41] = 1: a DSpark stage is SWA-only"),
            std::string::npos);
}

TEST(V41Validation, RefusesSourcesInconsistentWithTheRatios) {
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.kv_source_layers = {0, 1, 3}; c.index_source_layers = {0, 1, 3, 4}; })
                .find("kv source 0 has compress_ratios[0] = 0; a kv source compresses (ratio > 0)"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.index_source_layers = {1, 4}; })
                .find("kv source 3 is not an index source"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.index_source_layers = {0, 1, 3, 4}; })
                .find("index source 0 has compress_ratios[0] = 0"),
            std::string::npos);
  // Layer 3 (ratio 1) would read layer 1's ratio-2 cache.
  EXPECT_EQ(invalid("v41-tiny", [](V41Config& c) { c.kv_source_layers = {1}; c.index_source_layers = {1, 4}; c.candidate_source_layer = -1; }),
            "v41 config: v41-tiny: layer 3 has ratio 1 but its kv source (the latest at or below it) is layer 1 with "
            "ratio 2");
  EXPECT_EQ(invalid("v41-tiny", [](V41Config& c) { c.compress_ratios = {2, 2, 2, 1, 1, 1}; c.engram_layer_ids = {2}; c.engram_num_embeddings = {660}; }),
            "v41 config: v41-tiny: layer 0 has ratio 2 but no kv source at or below it");
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.kv_source_layers = {3, 1}; }).find("kv_source_layers 3,1 is not strictly ascending"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.index_source_layers = {1, 3, 6}; })
                .find("index_source_layers has layer 6, outside [0, 6)"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.kv_source_layers = {}; }).find("kv_source_layers is empty"),
            std::string::npos);
}

// A repeated layer id breaks "strictly ascending" as a descending pair does, and must be refused by the same
// rule, naming its list (validate.cpp's layer_list). Each list gets a repeat that every other rule accepts
// (the Engram tables resized to the repeated list), so a rule weakened to "non-descending" lets each through.
TEST(V41Validation, RefusesARepeatedLayerIdInEveryLayerListNamingTheList) {
  EXPECT_EQ(invalid("v41-tiny", [](V41Config& c) { c.kv_source_layers = {1, 1, 3}; }),
            "v41 config: v41-tiny: kv_source_layers 1,1,3 is not strictly ascending");
  EXPECT_EQ(invalid("v41-tiny", [](V41Config& c) { c.index_source_layers = {1, 3, 3, 4}; }),
            "v41 config: v41-tiny: index_source_layers 1,3,3,4 is not strictly ascending");
  EXPECT_EQ(invalid("v41-tiny",
                    [](V41Config& c) {
                      c.engram_layer_ids = {0, 0};
                      c.engram_num_embeddings = v41_engram_rows(c);
                    }),
            "v41 config: v41-tiny: engram_layer_ids 0,0 is not strictly ascending");
  EXPECT_EQ(invalid("v41-flash", [](V41Config& c) { c.dspark_target_layer_ids = {37, 38, 38}; }),
            "v41 config: v41-flash: dspark_target_layer_ids 37,38,38 is not strictly ascending");
}

TEST(V41Validation, RefusesALayerListsFirstIdOutsideTheStack) {
  // The first element is range-checked like the others (a list of one id has only a first).
  EXPECT_EQ(invalid("v41-flash", [](V41Config& c) { c.dspark_target_layer_ids = {40}; }),
            "v41 config: v41-flash: dspark_target_layer_ids has layer 40, outside [0, 40)");
  EXPECT_EQ(invalid("v41-flash", [](V41Config& c) { c.dspark_target_layer_ids = {-1, 38, 39}; }),
            "v41 config: v41-flash: dspark_target_layer_ids has layer -1, outside [0, 40)");
}

TEST(V41Validation, RefusesADSparkNoiseTokenOutsideTheVocabularyOnEitherSide) {
  EXPECT_EQ(invalid("v41-flash", [](V41Config& c) { c.dspark_noise_token_id = c.vocab_size; }),
            "v41 config: v41-flash: dspark_noise_token_id = 129280 is outside [0, vocab_size = 129280)");
  EXPECT_EQ(invalid("v41-flash", [](V41Config& c) { c.dspark_noise_token_id = -1; }),
            "v41 config: v41-flash: dspark_noise_token_id = -1 is outside [0, vocab_size = 129280)");
  EXPECT_EQ(invalid("v41-flash", [](V41Config& c) { c.dspark_noise_token_id = c.vocab_size - 1; }), "");
}

TEST(V41Validation, RefusesACandidateSourceThatIsNotARatio1KvSource) {
  EXPECT_EQ(invalid("v41-tiny", [](V41Config& c) { c.candidate_source_layer = 4; }),
            "v41 config: v41-tiny: candidate_source_layer = 4 must be a ratio-1 kv source (ratio 1, kv sources 1,3)");
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.candidate_source_layer = 1; }).find("(ratio 2, kv sources 1,3)"),
            std::string::npos);
  V41Config off = v41_builtin_config("v41-tiny");
  off.candidate_source_layer = -1;
  off.candidate_topk_blocks = off.candidate_block_size = 0;
  EXPECT_NO_THROW(validate_v41(off));
}

TEST(V41Validation, RefusesEngramAtOrAboveTheFirstDecoderLayer) {
  EXPECT_EQ(invalid("v41-tiny", [](V41Config& c) { c.engram_layer_ids = {0, 3}; }),
            "v41 config: v41-tiny: Engram on layer 3: Engram must lie below the first decoder layer E = 3 (the largest "
            "kv source)");
  EXPECT_NE(invalid("v41-flash", [](V41Config& c) { c.engram_layer_ids = {1, 20}; }).find("Engram on layer 20"),
            std::string::npos);
}

TEST(V41Validation, RefusesEngramTablesOfAnotherSize) {
  EXPECT_EQ(invalid("v41-tiny", [](V41Config& c) { c.engram_num_embeddings = {660, 865}; }),
            "v41 config: v41-tiny: engram_num_embeddings[1] = 865, but layer 2's 6 prime buckets from "
            "engram_vocab_size = 100 sum to 864");
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.engram_num_embeddings = {660}; })
                .find("engram_num_embeddings has 1 entries for 2 Engram layers"),
            std::string::npos);
}

TEST(V41Validation, RefusesWhatTheOfficialCodeAssertsOrCannotRepresent) {
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.n_shared_experts = 2; }).find("asserts exactly 1"), std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.n_activated_experts = 9; }).find("exceeds n_routed_experts = 8"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.score_func = "relu"; }).find("score_func 'relu'"), std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.dtype = "fp16"; }).find("dtype 'fp16' is neither fp8 nor bf16"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.o_groups = 3; }).find("n_heads * head_dim = 256 is not divisible by o_groups = 3"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.window_size = 0; }).find("window_size = 0 must be positive"),
            std::string::npos);
  EXPECT_NE(invalid("v41-tiny", [](V41Config& c) { c.dspark_block_size = 5; }).find("n_mtp_layers = 0 must be positive"),
            std::string::npos);
}

// ---- the plan ----

TEST(V41Plan, TinyHasOneLayerPerBlockRoleByHand) {
  const V41Plan p = make_v41_plan(v41_builtin_config("v41-tiny"));
  // layer:           0        1     2      3     4        5
  const Role role[] = {Role::SwaOnly, Role::Full, Role::Reuse, Role::Full, Role::Reindex, Role::Reuse};
  const int64_t ratio[] = {0, 2, 2, 1, 1, 1};
  const int64_t kv[] = {-1, 1, 1, 3, 3, 3};
  const int64_t idx[] = {-1, 1, 1, 3, 4, 4};
  const int64_t cand[] = {-1, -1, -1, -1, 3, -1};
  const bool comp[] = {false, true, false, true, false, false};
  const bool gate[] = {false, true, false, false, false, false};
  const bool indexer[] = {false, true, false, true, true, false};
  const bool engram[] = {true, false, true, false, false, false};
  ASSERT_EQ(p.layers.size(), 6u);
  for (int64_t l = 0; l < 6; ++l) {
    const LayerPlan& lp = p[l];
    EXPECT_EQ(lp.role, role[l]) << l;
    EXPECT_EQ(lp.ratio, ratio[l]) << l;
    EXPECT_EQ(lp.kv_src, kv[l]) << l;
    EXPECT_EQ(lp.idx_src, idx[l]) << l;
    EXPECT_EQ(lp.cand_src, cand[l]) << l;
    EXPECT_EQ(lp.candidate_source, l == 3) << l;
    EXPECT_EQ(lp.owns_compressor, comp[l]) << l;
    EXPECT_EQ(lp.owns_index_k, comp[l]) << l;
    EXPECT_EQ(lp.owns_wgate, gate[l]) << l;
    EXPECT_EQ(lp.owns_indexer, indexer[l]) << l;
    EXPECT_EQ(lp.engram, engram[l]) << l;
    EXPECT_EQ(lp.yarn, l > 0) << l;
    EXPECT_EQ(lp.rope_theta, l == 0 ? 10000.0 : 160000.0) << l;
    EXPECT_EQ(lp.decoder, l >= 3) << l;
  }
  EXPECT_EQ(p.E, 3);
  EXPECT_EQ(p.D, 3);
  EXPECT_EQ(p.W, 16);
  EXPECT_EQ(p.R(), 1 + 3 * 15);
}

TEST(V41Plan, FlashIsTheReleasedSchedule) {
  const V41Plan p = make_v41_plan(v41_builtin_config("v41-flash"));
  ASSERT_EQ(p.L, 40);
  for (int64_t l = 0; l < 40; ++l) {
    const LayerPlan& lp = p[l];
    const bool full = l == 2 || l == 8 || l == 14 || l == 20;
    const bool reindex = l == 24 || l == 28 || l == 32 || l == 36;
    const Role want = l < 2 ? Role::SwaOnly : full ? Role::Full : reindex ? Role::Reindex : Role::Reuse;
    EXPECT_EQ(lp.role, want) << l;
    EXPECT_EQ(lp.ratio, l < 2 ? 0 : l < 20 ? 2 : 1) << l;
    // kv_src: the latest of 2, 8, 14, 20; idx_src: the latest of those and 24, 28, 32, 36.
    const int64_t kv = l < 2 ? -1 : l < 8 ? 2 : l < 14 ? 8 : l < 20 ? 14 : 20;
    const int64_t idx = l < 24 ? kv : 24 + 4 * ((l - 24) / 4);
    EXPECT_EQ(lp.kv_src, kv) << l;
    EXPECT_EQ(lp.idx_src, idx) << l;
    EXPECT_EQ(lp.candidate_source, l == 20) << l;
    EXPECT_EQ(lp.cand_src, reindex ? 20 : -1) << l;
    EXPECT_EQ(lp.owns_wgate, l == 2 || l == 8 || l == 14) << l;
    EXPECT_EQ(lp.owns_index_k, full) << l;
    EXPECT_EQ(lp.owns_indexer, full || reindex) << l;
    EXPECT_EQ(lp.engram, l == 1 || l == 14) << l;
    EXPECT_EQ(lp.yarn, l >= 2) << l;
    EXPECT_EQ(lp.rope_theta, l >= 2 ? 160000.0 : 10000.0) << l;
    EXPECT_EQ(lp.decoder, l >= 20) << l;
  }
  EXPECT_EQ(p.E, 20);
  EXPECT_EQ(p.D, 20);
  EXPECT_EQ(p.W, 128);
  EXPECT_EQ(p.R(), 2541);
}

TEST(V41Plan, NoYarnWhenOriginalSeqLenIsZero) {
  V41Config c = v41_builtin_config("v41-tiny");
  c.original_seq_len = 0;
  const V41Plan p = make_v41_plan(c);
  for (const auto& lp : p.layers) EXPECT_FALSE(lp.yarn) << lp.layer;
  EXPECT_EQ(p[1].rope_theta, 160000.0);
}

// Each line of the plan starts with its layer and then that layer's compression ratio: on v41-tiny layer 0 is
// the window-only one (ratio 0), layers 1 and 2 compress by 2, 3 to 5 by 1.
TEST(V41Plan, EachLineOfThePlanStartsWithItsLayerThenItsRatio) {
  const std::string s = describe_v41_plan(make_v41_plan(v41_builtin_config("v41-tiny")));
  EXPECT_NE(s.find("\n    0     0 SwaOnly"), std::string::npos) << s;
  EXPECT_NE(s.find("\n    1     2 Full"), std::string::npos) << s;
  EXPECT_NE(s.find("\n    2     2 Reuse"), std::string::npos) << s;
  EXPECT_NE(s.find("\n    4     1 Reindex"), std::string::npos) << s;
}

TEST(V41Plan, DescribesOneLinePerLayer) {
  const std::string s = describe_v41_plan(make_v41_plan(v41_builtin_config("v41-tiny")));
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 2 + 6);
  EXPECT_NE(s.find("L = 6, E = 3, D = 3, W = 16, R = 46"), std::string::npos);
  EXPECT_NE(s.find("Reindex"), std::string::npos);
}

// The boundary lengths of v41-tiny, each constant's neighbours with its reason: the window's and 2W's, the
// top-k's at both index ratios, the candidate pool's (3 blocks of 4 groups at ratio 1), ratio 2's first group,
// the Engram n-gram size's and every convention's exact span; nothing in between.
TEST(V41BoundaryLengths, TinysConstantsEachGiveTheirNeighboursWithTheirReason) {
  const V41Config c = v41_builtin_config("v41-tiny");
  const V41Plan p = make_v41_plan(c);
  const std::vector<V41BoundaryLength> b = v41_boundary_lengths(c, p);
  std::map<int64_t, std::string> why;
  for (const V41BoundaryLength& l : b) why[l.n] = fmt::format("{}", fmt::join(l.why, "; "));
  for (int64_t n : {15, 16, 17, 31, 32, 33}) EXPECT_TRUE(why.count(n)) << n;
  EXPECT_NE(why[16].find("W = 16"), std::string::npos) << why[16];
  EXPECT_NE(why[16].find("index_topk × ratio = 8 × 2"), std::string::npos) << why[16];
  EXPECT_NE(why[12].find("the candidate pool: 3 blocks × 4 groups × ratio 1"), std::string::npos) << why[12];
  EXPECT_NE(why[8].find("index_topk × ratio = 8 × 1"), std::string::npos) << why[8];
  EXPECT_NE(why[2].find("ratio 2: the first whole group"), std::string::npos) << why[2];
  EXPECT_NE(why[c.engram_max_ngram_size].find("n-gram size"), std::string::npos);
  for (const V41ReplayConvention& conv : v41_replay_conventions())
    EXPECT_NE(why[v41_exact_span(p, conv)].find(conv.name), std::string::npos) << conv.name;
  EXPECT_FALSE(why.count(20)) << why[20];  // between the constants
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1].n, b[i].n);
  std::string all;
  for (const V41BoundaryLength& l : b) all += fmt::format("{} ", l.n);
  RecordProperty("lengths", all);
}
