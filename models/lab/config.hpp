#pragma once
// docs/spec.md §1: the model configuration, the built-ins and validation.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ced {

struct Config {
  std::string name;  // built-in name or file path; not a model parameter
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_encoder_layers = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;
  int64_t q_lora_rank = 0;
  int64_t window = 0;
  std::vector<int64_t> compress_ratios;      // [L]
  std::vector<int64_t> kv_source_layers;     // sorted
  std::vector<int64_t> index_source_layers;  // sorted
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t candidate_source_layer = -1;
  int64_t candidate_block_size = 0;
  int64_t candidate_topk_blocks = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t n_routed_experts = 0;
  int64_t n_active_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t moe_dim = 0;
  double routed_scaling_factor = 1.0;
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_decoder_kv = false;

  int64_t E() const { return n_encoder_layers; }
  int64_t D() const { return n_layers - n_encoder_layers; }
  int64_t W() const { return window; }
};

// Every key of §1 with the member it sets: the single table the TOML parser,
// the TOML writer and the HDF5 /config group all read.
struct ConfigIntKey {
  const char* key;
  int64_t Config::*member;
};
struct ConfigRealKey {
  const char* key;
  double Config::*member;
};
struct ConfigListKey {
  const char* key;
  std::vector<int64_t> Config::*member;
};
std::span<const ConfigIntKey> config_int_keys();
std::span<const ConfigRealKey> config_real_keys();
std::span<const ConfigListKey> config_list_keys();
// tie_decoder_kv is the one boolean key.

// The names of every scalar key of §1, in spec order (HDF5 /config attrs,
// TOML parsing and error messages share this list).
const std::vector<std::string>& scalar_keys();
const std::vector<std::string>& list_keys();

// Built-in names: tiny, small, v41-shape, bench, lab-flash (the lab model at the released sizes;
// `v41-flash` is the v41 family's, models/v41/config.hpp).
const std::vector<std::string>& builtin_names();
bool is_builtin(std::string_view name);
Config builtin_config(std::string_view name);  // validated; InputError if unknown

// Parses TOML text; every key required except tie_decoder_kv; unknown keys
// are errors. Throws InputError naming the key.
Config parse_config_toml(std::string_view text, const std::string& origin);
Config load_config_file(const std::filesystem::path& path);
// A built-in name, or else a path to a TOML file.
Config load_config(std::string_view name_or_path);
// Serialises every key (round-trips through parse_config_toml).
std::string to_toml(const Config& c);

// Overrides one key: "window=64", "rms_eps=1e-5", "compress_ratios=0,2,2,1",
// "tie_decoder_kv=true". The result is validated; InputError naming the key.
Config with_override(Config c, std::string_view key_eq_value);

// docs/spec.md §1 validation: throws InputError("config: <key>: <why>").
void validate(const Config& c);
// Token ids must be < V.
void validate_tokens(const Config& c, const std::vector<int32_t>& tokens);

// Bytes a run of `n_positions` would need (weights + caches + activations)
// in the given scalar size; used to refuse lab-flash on a CPU up front.
double estimate_run_bytes(const Config& c, int64_t n_positions, int scalar_bytes);

}  // namespace ced
