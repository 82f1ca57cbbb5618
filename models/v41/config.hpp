#pragma once
// The v41 family's configuration (docs/v41.md §4-§6): the official ModelArgs fields under their own
// names (the keys of the release's flat inference/config.json), the two release config files, the
// built-ins and validation.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ced::v41 {

// One member per ModelArgs field the release's files carry, in the order of the release's
// inference/config.json, then the two fields only a non-default config writes. The per-run fields
// (max_batch_size, max_seq_len, temperature) are not model parameters and are not here.
struct V41Config {
  std::string name;            // built-in name or file path; not a model parameter
  bool analytic_only = false;  // v41-flash: the oracle and memory estimates only, never a run

  int64_t vocab_size = 0;
  int64_t dim = 0;
  int64_t moe_inter_dim = 0;
  int64_t n_layers = 0;
  int64_t n_mtp_layers = 0;
  int64_t dspark_block_size = 0;
  int64_t dspark_noise_token_id = 0;
  std::vector<int64_t> dspark_target_layer_ids;
  int64_t dspark_markov_rank = 256;
  int64_t dspark_n_routed_experts = 0;
  int64_t dspark_n_activated_experts = 0;
  int64_t n_heads = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 1;
  int64_t n_activated_experts = 0;
  std::string score_func = "sqrtsoftplus";  // softmax | sigmoid | sqrtsoftplus
  double route_scale = 1.0;
  double swiglu_limit = 0.0;
  int64_t q_lora_rank = 0;
  int64_t head_dim = 0;
  int64_t rope_head_dim = 0;
  double norm_eps = 1e-20;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t window_size = 0;
  std::vector<int64_t> kv_source_layers;     // ascending
  std::vector<int64_t> index_source_layers;  // ascending
  int64_t original_seq_len = 0;              // YaRN on ratio > 0 layers when > 0
  double rope_theta = 10000.0;
  double rope_factor = 40.0;
  int64_t beta_fast = 32;
  int64_t beta_slow = 1;
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t candidate_source_layer = -1;  // < 0: no candidate pool
  int64_t candidate_topk_blocks = 0;
  int64_t candidate_block_size = 0;
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  std::vector<int64_t> engram_layer_ids;       // ascending
  int64_t engram_vocab_size = 0;
  std::vector<int64_t> engram_num_embeddings;  // table rows per Engram layer
  int64_t engram_max_ngram_size = 1;
  int64_t engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 0;
  std::string dtype = "fp8";                 // fp8 | bf16: the non-expert linears' weights
  std::optional<std::string> expert_dtype = "fp4";  // fp4 | null: the routed experts' weights
  double compress_rope_theta = 40000.0;
  std::vector<int64_t> compress_ratios;      // [n_layers + n_mtp_layers]
  int64_t vision_n_layers = 0;
  int64_t vision_dim = 1024;
  int64_t vision_n_heads = 16;
  int64_t vision_inter_dim = 2816;
  int64_t vision_patch_size = 14;
  int64_t vision_downsample_ratio = 3;
  int64_t vision_max_n_token = 1024;
  int64_t vision_min_pixels = 544 * 544;
  std::optional<int64_t> vision_max_wh_ratio;
  int64_t image_token_id = 129264;
  int64_t engram_n_heads = 0;
  int64_t engram_head_dim = 0;
  double vision_rope_theta = 10000.0;
  // Not in the release's files; ModelArgs defaults, written only when a config changes them.
  double gate_temp = 1.0;
  bool norm_topk_prob = true;

  bool operator==(const V41Config&) const = default;
};

// The keys of the flat inference/config.json (ModelArgs field names), in the release's order, then
// gate_temp and norm_topk_prob. `required` is false for those two only.
struct V41KeyInfo {
  const char* flat;  // inference/config.json key = V41Config member
  const char* hf;    // where config.json keeps it: "text_config.hidden_size",
                     // "text_config.rope_scaling.factor", "vision_config.hidden_size",
                     // "image_token_id", "quantization_config" (dtype, expert_dtype)
  bool flat_required;
  bool hf_required;
};
const std::vector<V41KeyInfo>& v41_keys();

// ---- the two release files (docs/v41.md §4) ----

// Parse one file's text. `origin` names the file in errors. Unknown keys, missing required keys and
// values of the wrong type are refused: ced::InputError, one line, naming the file and the key.
// The result is not validated (validate_v41 does that).
V41Config parse_v41_flat_json(std::string_view text, const std::string& origin);
V41Config parse_v41_hf_json(std::string_view text, const std::string& origin);
// The writers: the keys in the release's order. Flat: indent 4, lists on one line, as the release's
// inference/config.json. HF: indent 2, as a Hugging Face config.json.
std::string write_v41_flat_json(const V41Config& c);
std::string write_v41_hf_json(const V41Config& c);

// Every field on which the two disagree, each as "flat_key (config.json text_config.X = a,
// inference/config.json flat_key = b)"; empty when they agree. The YaRN sub-fields are not compared
// when both have original_seq_len 0 (config.json then carries rope_scaling null).
std::vector<std::string> v41_config_disagreements(const V41Config& flat, const V41Config& hf);

// Reads whichever of the two files is given (at least one); with both, the cross-check must find no
// disagreement (InputError naming every disagreeing key). The result is validated.
V41Config load_v41_config_files(const std::optional<std::filesystem::path>& hf_config,
                                const std::optional<std::filesystem::path>& flat_config);
// A release-layout folder: DIR/config.json and DIR/inference/config.json, whichever exist.
V41Config load_v41_checkpoint_config(const std::filesystem::path& dir);

// ---- built-ins and validation (docs/v41.md §5, §6) ----

const std::vector<std::string>& v41_builtin_names();  // v41-tiny, v41-wide, v41-ced, v41-flash
bool is_v41_builtin(std::string_view name);
V41Config v41_builtin_config(std::string_view name);  // validated; InputError if unknown

// Throws InputError (one line, "v41 config: NAME: ...") on the first rule broken.
void validate_v41(const V41Config& c);

// The Engram tables' rows the release's layout implies: per Engram layer, the sum of its
// (max_ngram_size - 1) * n_heads primes, each the smallest prime above engram_vocab_size - 1 (the
// search restarting there for every n-gram size) not handed out before.
std::vector<int64_t> v41_engram_rows(const V41Config& c);
// Those primes themselves: per Engram layer, [(max_ngram_size - 1) * n_heads] in (n-gram size, head)
// order, the bucket moduli of its hash columns (their prefix sums are the columns' row offsets).
std::vector<std::vector<int64_t>> v41_engram_primes(const V41Config& c);

}  // namespace ced::v41
