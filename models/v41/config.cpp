// docs/v41.md §4 (the two config files), §5 (built-ins), §6 (validation).
#include "models/v41/config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <variant>

#include "model/error.hpp"

namespace ced::v41 {
namespace {

using Json = nlohmann::ordered_json;

[[noreturn]] void fail(const std::string& origin, const std::string& key, const std::string& why) {
  throw InputError(fmt::format("v41 config: {}: {}: {}", origin, key, why));
}

// How a double is written: the release writes route_scale, swiglu_limit, norm_eps and hc_eps as
// floats (10.0, 1e-20), and the thetas and rope_factor as integers (10000, 16).
enum class RealStyle { Float, IntWhenWhole };

using Member = std::variant<int64_t V41Config::*, double V41Config::*, std::vector<int64_t> V41Config::*,
                            std::string V41Config::*, std::optional<std::string> V41Config::*,
                            std::optional<int64_t> V41Config::*, bool V41Config::*>;

struct Key {
  const char* flat;
  const char* hf;  // see V41KeyInfo::hf
  Member member;
  RealStyle style = RealStyle::Float;
  bool flat_required = true;
  bool hf_required = true;
};

constexpr auto F = RealStyle::Float;
constexpr auto I = RealStyle::IntWhenWhole;

// The one table the parsers, the writers and the cross-check read: every flat key in the order of
// the release's inference/config.json, with its place in config.json (docs/v41.md §4.2's table).
const std::vector<Key>& keys() {
  using C = V41Config;
  static const std::vector<Key> k = {
      {"vocab_size", "text_config.vocab_size", &C::vocab_size},
      {"dim", "text_config.hidden_size", &C::dim},
      {"moe_inter_dim", "text_config.moe_intermediate_size", &C::moe_inter_dim},
      {"n_layers", "text_config.num_hidden_layers", &C::n_layers},
      {"n_mtp_layers", "text_config.num_nextn_predict_layers", &C::n_mtp_layers},
      {"dspark_block_size", "text_config.dspark_block_size", &C::dspark_block_size},
      {"dspark_noise_token_id", "text_config.dspark_noise_token_id", &C::dspark_noise_token_id},
      {"dspark_target_layer_ids", "text_config.dspark_target_layer_ids", &C::dspark_target_layer_ids},
      {"dspark_markov_rank", "text_config.dspark_markov_rank", &C::dspark_markov_rank},
      {"dspark_n_routed_experts", "text_config.dspark_n_routed_experts", &C::dspark_n_routed_experts},
      {"dspark_n_activated_experts", "text_config.dspark_num_experts_per_tok", &C::dspark_n_activated_experts},
      {"n_heads", "text_config.num_attention_heads", &C::n_heads},
      {"n_routed_experts", "text_config.n_routed_experts", &C::n_routed_experts},
      {"n_shared_experts", "text_config.n_shared_experts", &C::n_shared_experts},
      {"n_activated_experts", "text_config.num_experts_per_tok", &C::n_activated_experts},
      {"score_func", "text_config.scoring_func", &C::score_func},
      {"route_scale", "text_config.routed_scaling_factor", &C::route_scale, F},
      {"swiglu_limit", "text_config.swiglu_limit", &C::swiglu_limit, F},
      {"q_lora_rank", "text_config.q_lora_rank", &C::q_lora_rank},
      {"head_dim", "text_config.head_dim", &C::head_dim},
      {"rope_head_dim", "text_config.qk_rope_head_dim", &C::rope_head_dim},
      {"norm_eps", "text_config.rms_norm_eps", &C::norm_eps, F},
      {"o_groups", "text_config.o_groups", &C::o_groups},
      {"o_lora_rank", "text_config.o_lora_rank", &C::o_lora_rank},
      {"window_size", "text_config.sliding_window", &C::window_size},
      {"kv_source_layers", "text_config.kv_source_layer_ids", &C::kv_source_layers},
      {"index_source_layers", "text_config.index_source_layer_ids", &C::index_source_layers},
      {"original_seq_len", "text_config.rope_scaling.original_max_position_embeddings", &C::original_seq_len},
      {"rope_theta", "text_config.rope_theta", &C::rope_theta, I},
      {"rope_factor", "text_config.rope_scaling.factor", &C::rope_factor, I},
      {"beta_fast", "text_config.rope_scaling.beta_fast", &C::beta_fast},
      {"beta_slow", "text_config.rope_scaling.beta_slow", &C::beta_slow},
      {"index_n_heads", "text_config.index_n_heads", &C::index_n_heads},
      {"index_head_dim", "text_config.index_head_dim", &C::index_head_dim},
      {"index_topk", "text_config.index_topk", &C::index_topk},
      {"candidate_source_layer", "text_config.candidate_source_layer_id", &C::candidate_source_layer},
      {"candidate_topk_blocks", "text_config.candidate_topk_blocks", &C::candidate_topk_blocks},
      {"candidate_block_size", "text_config.candidate_block_size", &C::candidate_block_size},
      {"hc_mult", "text_config.hc_mult", &C::hc_mult},
      {"hc_sinkhorn_iters", "text_config.hc_sinkhorn_iters", &C::hc_sinkhorn_iters},
      {"hc_eps", "text_config.hc_eps", &C::hc_eps, F},
      {"engram_layer_ids", "text_config.engram_layer_ids", &C::engram_layer_ids},
      {"engram_vocab_size", "text_config.engram_vocab_size", &C::engram_vocab_size},
      {"engram_num_embeddings", "text_config.engram_num_embeddings", &C::engram_num_embeddings},
      {"engram_max_ngram_size", "text_config.engram_max_ngram_size", &C::engram_max_ngram_size},
      {"engram_pad_id", "text_config.engram_pad_token_id", &C::engram_pad_id},
      {"engram_compressed_vocab_size", "text_config.engram_compressed_vocab_size", &C::engram_compressed_vocab_size},
      {"dtype", "quantization_config", &C::dtype},
      {"expert_dtype", "quantization_config", &C::expert_dtype},
      {"compress_rope_theta", "text_config.compress_rope_theta", &C::compress_rope_theta, I},
      {"compress_ratios", "text_config.compress_ratios", &C::compress_ratios},
      {"vision_n_layers", "vision_config.num_hidden_layers", &C::vision_n_layers},
      {"vision_dim", "vision_config.hidden_size", &C::vision_dim},
      {"vision_n_heads", "vision_config.num_attention_heads", &C::vision_n_heads},
      {"vision_inter_dim", "vision_config.intermediate_size", &C::vision_inter_dim},
      {"vision_patch_size", "vision_config.patch_size", &C::vision_patch_size},
      {"vision_downsample_ratio", "vision_config.downsample_ratio", &C::vision_downsample_ratio},
      {"vision_max_n_token", "vision_config.max_image_tokens", &C::vision_max_n_token},
      {"vision_min_pixels", "vision_config.min_pixels", &C::vision_min_pixels},
      {"vision_max_wh_ratio", "vision_config.max_wh_ratio", &C::vision_max_wh_ratio},
      {"image_token_id", "image_token_id", &C::image_token_id},
      {"engram_n_heads", "text_config.engram_n_heads", &C::engram_n_heads},
      {"engram_head_dim", "text_config.engram_head_dim", &C::engram_head_dim},
      {"vision_rope_theta", "vision_config.rope_theta", &C::vision_rope_theta, I},
      // ModelArgs fields the release's files leave at their defaults.
      {"gate_temp", "text_config.gate_temp", &C::gate_temp, F, false, false},
      {"norm_topk_prob", "text_config.norm_topk_prob", &C::norm_topk_prob, F, false, true},
  };
  return k;
}

// The per-run ModelArgs fields: known to the official code, but no model parameter.
bool is_runtime_field(const std::string& k) {
  return k == "max_batch_size" || k == "max_seq_len" || k == "temperature";
}

// ---- member <-> JSON

Json real_json(double v, RealStyle style) {
  if (style == RealStyle::IntWhenWhole && std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 0x1p53)
    return Json(static_cast<int64_t>(v));
  return Json(v);
}

Json member_json(const V41Config& c, const Key& k) {
  return std::visit(
      [&](auto m) -> Json {
        using T = std::remove_cvref_t<decltype(c.*m)>;
        const T& v = c.*m;
        if constexpr (std::is_same_v<T, double>) {
          return real_json(v, k.style);
        } else if constexpr (std::is_same_v<T, std::optional<std::string>> ||
                             std::is_same_v<T, std::optional<int64_t>>) {
          return v ? Json(*v) : Json(nullptr);
        } else {
          return Json(v);
        }
      },
      k.member);
}

int64_t need_int(const Json& v, const std::string& origin, const std::string& key) {
  if (!v.is_number_integer()) fail(origin, key, fmt::format("{} is not an integer", v.dump()));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(origin, key, fmt::format("{} is out of range", v.dump()));
  return v.get<int64_t>();
}

void set_member(V41Config& c, const Key& k, const Json& v, const std::string& origin, const std::string& key) {
  std::visit(
      [&](auto m) {
        using T = std::remove_cvref_t<decltype(c.*m)>;
        T& dst = c.*m;
        if constexpr (std::is_same_v<T, int64_t>) {
          dst = need_int(v, origin, key);
        } else if constexpr (std::is_same_v<T, double>) {
          if (!v.is_number()) fail(origin, key, fmt::format("{} is not a number", v.dump()));
          dst = v.get<double>();
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          if (!v.is_array()) fail(origin, key, fmt::format("{} is not a list of integers", v.dump()));
          dst.clear();
          for (const auto& e : v) dst.push_back(need_int(e, origin, key));
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!v.is_string()) fail(origin, key, fmt::format("{} is not a string", v.dump()));
          dst = v.get<std::string>();
        } else if constexpr (std::is_same_v<T, std::optional<std::string>>) {
          if (v.is_null()) dst.reset();
          else if (v.is_string()) dst = v.get<std::string>();
          else fail(origin, key, fmt::format("{} is neither a string nor null", v.dump()));
        } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
          if (v.is_null()) dst.reset();
          else dst = need_int(v, origin, key);
        } else {
          if (!v.is_boolean()) fail(origin, key, fmt::format("{} is not true or false", v.dump()));
          dst = v.get<bool>();
        }
      },
      k.member);
}

Json parse_object(std::string_view text, const std::string& origin) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    throw InputError(fmt::format("v41 config: {}: not valid JSON ({})", origin, what));
  }
  if (!j.is_object()) throw InputError(fmt::format("v41 config: {}: not a JSON object", origin));
  return j;
}

const Key* flat_key(const std::string& name) {
  for (const auto& k : keys())
    if (name == k.flat) return &k;
  return nullptr;
}

const Key* hf_key(const std::string& path) {
  for (const auto& k : keys())
    if (path == k.hf) return &k;
  return nullptr;
}

std::string first_and_more(const std::vector<std::string>& v) {
  return v.size() == 1 ? v[0] : fmt::format("{} (and {} more: {})", v[0], v.size() - 1,
                                            fmt::join(std::vector<std::string>(v.begin() + 1, v.end()), ", "));
}

// ---- config.json: the text_config keys with no ModelArgs field, and the writer's order

// Keys whose value the official model.py implies; a reader accepts them only with that value
// (max_position_embeddings: any integer, ModelArgs has no such field).
const Json& hf_text_fixed() {
  static const Json j = {{"model_type", "deepseek_v41_text"},   {"num_key_value_heads", 1},
                         {"hidden_act", "silu"},                {"attention_bias", false},
                         {"tie_word_embeddings", false},        {"max_position_embeddings", nullptr},
                         {"topk_method", "noaux_tc"}};
  return j;
}
constexpr int64_t kMaxPositionEmbeddings = 1048576;  // the release's; written for every config

// The released text_config's keys in its order (rope_scaling expands to the four YaRN fields).
const std::vector<std::string>& hf_text_order() {
  static const std::vector<std::string> o = {
      "model_type", "vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_lora_rank",
      "o_groups", "hidden_act", "swiglu_limit", "rms_norm_eps", "attention_bias", "tie_word_embeddings",
      "max_position_embeddings", "rope_theta", "rope_scaling", "n_routed_experts", "n_shared_experts",
      "num_experts_per_tok", "scoring_func", "topk_method", "norm_topk_prob", "routed_scaling_factor",
      "sliding_window", "compress_ratios", "compress_rope_theta", "kv_source_layer_ids", "index_source_layer_ids",
      "index_n_heads", "index_head_dim", "index_topk", "candidate_source_layer_id", "candidate_topk_blocks",
      "candidate_block_size", "hc_mult", "hc_sinkhorn_iters", "hc_eps", "engram_layer_ids", "engram_num_embeddings",
      "engram_max_ngram_size", "engram_vocab_size", "engram_n_heads", "engram_head_dim", "engram_pad_token_id",
      "engram_compressed_vocab_size", "num_nextn_predict_layers", "dspark_block_size", "dspark_noise_token_id",
      "dspark_target_layer_ids", "dspark_markov_rank", "dspark_n_routed_experts", "dspark_num_experts_per_tok"};
  return o;
}
const std::vector<std::string>& hf_rope_order() {
  static const std::vector<std::string> o = {"factor", "beta_fast", "beta_slow", "original_max_position_embeddings"};
  return o;
}
const std::vector<std::string>& hf_vision_order() {
  static const std::vector<std::string> o = {"num_hidden_layers", "hidden_size",  "num_attention_heads",
                                             "intermediate_size", "patch_size",   "rope_theta",
                                             "downsample_ratio",  "max_image_tokens", "min_pixels",
                                             "max_wh_ratio"};
  return o;
}
const std::set<std::string>& hf_top_any() {  // top-level keys a reader accepts with any value
  static const std::set<std::string> s = {"dtype", "torch_dtype", "transformers_version", "bos_token_id",
                                          "eos_token_id", "pad_token_id"};
  return s;
}
constexpr const char* kArchitecture = "DeepseekV41ForCausalLM";

const Json& quant_fixed() {
  static const Json j = {{"quant_method", "fp8"},
                         {"activation_scheme", "dynamic"},
                         {"weight_block_size", {32, 32}},
                         {"scale_fmt", "ue8m0"}};
  return j;
}

// Sets every member whose hf path lies under `prefix` from `obj`; refuses unknown keys; returns the
// keys seen. `fixed` lists keys with no ModelArgs field and the one value allowed (null: any).
void read_hf_group(V41Config& c, const Json& obj, const std::string& prefix, const Json& fixed,
                   const std::string& origin, std::set<std::string>& seen) {
  for (const auto& [k, v] : obj.items()) {
    const std::string path = prefix + k;
    if (const Key* key = hf_key(path)) {
      set_member(c, *key, v, origin, path);
      seen.insert(path);
    } else if (fixed.contains(k)) {
      const Json& want = fixed.at(k);
      if (!want.is_null() && v != want)
        fail(origin, path, fmt::format("is {}; the official model.py implies {}", v.dump(), want.dump()));
    } else {
      fail(origin, path, "unknown key");
    }
  }
}

void require_hf_keys(const std::set<std::string>& seen, const std::string& prefix, const std::string& origin) {
  std::vector<std::string> missing;
  for (const auto& k : keys())
    if (k.hf_required && std::string(k.hf).rfind(prefix, 0) == 0 && std::string(k.hf) != "quantization_config" &&
        !seen.count(k.hf))
      missing.push_back(k.hf);
  if (!missing.empty()) fail(origin, first_and_more(missing), "missing (a required key)");
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw InputError(fmt::format("v41 config: {}: cannot read the file", p.string()));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

const std::vector<V41KeyInfo>& v41_keys() {
  static const std::vector<V41KeyInfo> v = [] {
    std::vector<V41KeyInfo> out;
    for (const auto& k : keys()) out.push_back({k.flat, k.hf, k.flat_required, k.hf_required});
    return out;
  }();
  return v;
}

// ---- the flat inference/config.json

V41Config parse_v41_flat_json(std::string_view text, const std::string& origin) {
  const Json j = parse_object(text, origin);
  V41Config c;
  c.name = origin;
  for (const auto& [k, v] : j.items()) {
    const Key* key = flat_key(k);
    if (!key) {
      if (is_runtime_field(k)) fail(origin, k, "a per-run value of the official code, not a model key; remove it");
      fail(origin, k, "unknown key (not a ModelArgs field of the release)");
    }
    set_member(c, *key, v, origin, k);
  }
  std::vector<std::string> missing;
  for (const auto& k : keys())
    if (k.flat_required && !j.contains(k.flat)) missing.push_back(k.flat);
  if (!missing.empty()) fail(origin, first_and_more(missing), "missing (a required key)");
  return c;
}

std::string write_v41_flat_json(const V41Config& c) {
  const V41Config defaults;
  std::string out = "{\n";
  bool first = true;
  for (const auto& k : keys()) {
    const Json v = member_json(c, k);
    if (!k.flat_required && v == member_json(defaults, k)) continue;
    std::string value;
    if (v.is_array()) {
      std::vector<std::string> items;
      for (const auto& e : v) items.push_back(e.dump());
      value = fmt::format("[{}]", fmt::join(items, ", "));
    } else {
      value = v.dump();
    }
    out += fmt::format("{}    \"{}\": {}", first ? "" : ",\n", k.flat, value);
    first = false;
  }
  return out + "\n}\n";
}

// ---- the HF config.json

V41Config parse_v41_hf_json(std::string_view text, const std::string& origin) {
  const Json j = parse_object(text, origin);
  V41Config c;
  c.name = origin;
  std::set<std::string> seen;
  for (const auto& [k, v] : j.items()) {
    if (k == "architectures") {
      if (!v.is_array() || std::find(v.begin(), v.end(), Json(kArchitecture)) == v.end())
        fail(origin, k, fmt::format("{} does not name {}", v.dump(), kArchitecture));
    } else if (k == "model_type") {
      if (v != "deepseek_v41") fail(origin, k, fmt::format("is {}, not \"deepseek_v41\"", v.dump()));
    } else if (k == "image_token_id") {
      set_member(c, *hf_key(k), v, origin, k);
      seen.insert(k);
    } else if (k == "quantization_config" || k == "text_config" || k == "vision_config") {
      if (!v.is_object()) fail(origin, k, "not a JSON object");
    } else if (!hf_top_any().count(k)) {
      fail(origin, k, "unknown top-level key");
    }
  }
  for (const char* need : {"architectures", "model_type", "text_config", "vision_config", "image_token_id"})
    if (!j.contains(need)) fail(origin, need, "missing (a required key)");

  const Json& text_cfg = j.at("text_config");
  Json text_no_rope = Json::object();
  for (const auto& [k, v] : text_cfg.items())
    if (k != "rope_scaling") text_no_rope[k] = v;
  read_hf_group(c, text_no_rope, "text_config.", hf_text_fixed(), origin, seen);
  if (!text_cfg.contains("rope_scaling")) fail(origin, "text_config.rope_scaling", "missing (a required key)");
  const Json& rope = text_cfg.at("rope_scaling");
  if (rope.is_null()) {
    c.original_seq_len = 0;  // no YaRN; the other three fields keep the ModelArgs defaults
    for (const auto& rk : hf_rope_order()) seen.insert("text_config.rope_scaling." + rk);
  } else {
    if (!rope.is_object()) fail(origin, "text_config.rope_scaling", "neither an object nor null");
    Json rest = Json::object();
    for (const auto& [k, v] : rope.items()) {
      if (k == "rope_type" || k == "type") {
        if (v != "yarn")
          fail(origin, "text_config.rope_scaling." + k, fmt::format("is {}; the official model.py implements yarn", v.dump()));
      } else {
        rest[k] = v;
      }
    }
    if (!rope.contains("rope_type") && !rope.contains("type"))
      fail(origin, "text_config.rope_scaling.rope_type", "missing (a required key)");
    read_hf_group(c, rest, "text_config.rope_scaling.", Json::object(), origin, seen);
  }
  require_hf_keys(seen, "text_config.", origin);

  static const Json vision_fixed = {{"model_type", "deepseek_v41_vision"}};
  read_hf_group(c, j.at("vision_config"), "vision_config.", vision_fixed, origin, seen);
  require_hf_keys(seen, "vision_config.", origin);

  if (!j.contains("quantization_config")) {
    c.dtype = "bf16";
    c.expert_dtype.reset();
  } else {
    const Json& q = j.at("quantization_config");
    for (const auto& [k, v] : q.items()) {
      const std::string path = "quantization_config." + k;
      if (k == "expert_dtype") {
        if (!v.is_null() && v != "fp4") fail(origin, path, fmt::format("is {}, not \"fp4\" or null", v.dump()));
      } else if (quant_fixed().contains(k)) {
        if (v != quant_fixed().at(k))
          fail(origin, path, fmt::format("is {}; the official model.py implements {}", v.dump(), quant_fixed().at(k).dump()));
      } else {
        fail(origin, path, "unknown key");
      }
    }
    if (!q.contains("quant_method")) fail(origin, "quantization_config.quant_method", "missing (a required key)");
    c.dtype = "fp8";
    if (q.contains("expert_dtype") && q.at("expert_dtype").is_string()) c.expert_dtype = "fp4";
    else c.expert_dtype.reset();
  }
  return c;
}

std::string write_v41_hf_json(const V41Config& c) {
  const V41Config defaults;
  auto value_at = [&](const std::string& path) -> Json {
    const Key* k = hf_key(path);
    return member_json(c, *k);
  };
  Json text = Json::object();
  for (const auto& k : hf_text_order()) {
    if (k == "rope_scaling") {
      if (c.original_seq_len <= 0) {
        text[k] = nullptr;
      } else {
        Json r = Json::object();
        r["rope_type"] = "yarn";
        for (const auto& rk : hf_rope_order()) r[rk] = value_at("text_config.rope_scaling." + rk);
        text[k] = r;
      }
    } else if (k == "max_position_embeddings") {
      text[k] = kMaxPositionEmbeddings;
    } else if (hf_text_fixed().contains(k)) {
      text[k] = hf_text_fixed().at(k);
    } else {
      text[k] = value_at("text_config." + k);
    }
  }
  if (c.gate_temp != defaults.gate_temp) text["gate_temp"] = c.gate_temp;
  Json vision = Json::object();
  vision["model_type"] = "deepseek_v41_vision";
  for (const auto& k : hf_vision_order()) vision[k] = value_at("vision_config." + k);
  Json j = Json::object();
  j["architectures"] = Json::array({kArchitecture});
  j["model_type"] = "deepseek_v41";
  j["dtype"] = "bfloat16";
  j["bos_token_id"] = 0;
  j["eos_token_id"] = 1;
  j["pad_token_id"] = c.engram_pad_id;
  j["image_token_id"] = c.image_token_id;
  if (c.dtype == "fp8") {
    Json q = quant_fixed();
    q["expert_dtype"] = c.expert_dtype ? Json(*c.expert_dtype) : Json(nullptr);
    j["quantization_config"] = q;
  }
  j["text_config"] = text;
  j["vision_config"] = vision;
  return j.dump(2) + "\n";
}

// ---- cross-check and loading

std::vector<std::string> v41_config_disagreements(const V41Config& flat, const V41Config& hf) {
  std::vector<std::string> out;
  const bool no_yarn = flat.original_seq_len <= 0 && hf.original_seq_len <= 0;
  for (const auto& k : keys()) {
    const std::string hf_path = k.hf;
    if (no_yarn && hf_path.rfind("text_config.rope_scaling.", 0) == 0) continue;
    const Json a = member_json(hf, k), b = member_json(flat, k);
    if (a == b) continue;
    out.push_back(fmt::format("{} (config.json {} = {}, inference/config.json {} = {})", k.flat, k.hf, a.dump(),
                              k.flat, b.dump()));
  }
  return out;
}

V41Config load_v41_config_files(const std::optional<std::filesystem::path>& hf_config,
                                const std::optional<std::filesystem::path>& flat_config) {
  if (!hf_config && !flat_config) throw InputError("v41 config: neither config.json nor inference/config.json given");
  std::optional<V41Config> hf, flat;
  if (hf_config) hf = parse_v41_hf_json(read_file(*hf_config), hf_config->string());
  if (flat_config) flat = parse_v41_flat_json(read_file(*flat_config), flat_config->string());
  if (hf && flat) {
    const auto diff = v41_config_disagreements(*flat, *hf);
    if (!diff.empty())
      throw InputError(fmt::format("v41 config: {} and {} disagree on {} key(s): {}", hf_config->string(),
                                   flat_config->string(), diff.size(), fmt::join(diff, "; ")));
  }
  V41Config c = flat ? *flat : *hf;
  validate_v41(c);
  return c;
}

V41Config load_v41_checkpoint_config(const std::filesystem::path& dir) {
  const auto hf = dir / "config.json", flat = dir / "inference" / "config.json";
  const bool has_hf = std::filesystem::exists(hf), has_flat = std::filesystem::exists(flat);
  if (!has_hf && !has_flat)
    throw InputError(fmt::format("v41 config: {}: neither config.json nor inference/config.json is present", dir.string()));
  return load_v41_config_files(has_hf ? std::optional(hf) : std::nullopt, has_flat ? std::optional(flat) : std::nullopt);
}

// ---- Engram rows

namespace {
bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d <= n / d; d += 2)
    if (n % d == 0) return false;
  return true;
}
}  // namespace

std::vector<std::vector<int64_t>> v41_engram_primes(const V41Config& c) {
  std::set<int64_t> seen;
  std::vector<std::vector<int64_t>> primes;
  for (size_t l = 0; l < c.engram_layer_ids.size(); ++l) {
    std::vector<int64_t> layer;
    for (int64_t n = 0; n + 1 < c.engram_max_ngram_size; ++n) {
      int64_t current = c.engram_vocab_size - 1;
      for (int64_t h = 0; h < c.engram_n_heads; ++h) {
        int64_t p = current + 1;
        while (!is_prime(p) || seen.count(p)) ++p;
        seen.insert(p);
        layer.push_back(p);
        current = p;
      }
    }
    primes.push_back(std::move(layer));
  }
  return primes;
}

std::vector<int64_t> v41_engram_rows(const V41Config& c) {
  std::vector<int64_t> rows;
  for (const auto& layer : v41_engram_primes(c)) {
    int64_t sum = 0;
    for (int64_t p : layer) sum += p;
    rows.push_back(sum);
  }
  return rows;
}

}  // namespace ced::v41
