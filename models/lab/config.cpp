// docs/spec.md §1.
#include "models/lab/config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "model/error.hpp"

namespace ced {
namespace {

[[noreturn]] void fail(const std::string& key, const std::string& why) {
  throw InputError(fmt::format("config: {}: {}", key, why));
}

std::vector<int64_t> repeat(std::initializer_list<std::pair<int64_t, int64_t>> runs) {
  std::vector<int64_t> v;
  for (auto [value, count] : runs) v.insert(v.end(), static_cast<size_t>(count), value);
  return v;
}

// DSv4.1 Flash's layer schedule (docs/spec.md §1), shared by v41-shape, bench, lab-flash.
void set_v41_schedule(Config& c) {
  c.n_layers = 40;
  c.n_encoder_layers = 20;
  c.window = 128;
  c.compress_ratios = repeat({{0, 2}, {2, 18}, {1, 20}});
  c.kv_source_layers = {2, 8, 14, 20};
  c.index_source_layers = {2, 8, 14, 20, 24, 28, 32, 36};
  c.candidate_source_layer = 20;
  c.candidate_block_size = 8;
  c.routed_scaling_factor = 1.5;
  c.rms_eps = 1e-6;
  c.rope_theta = 10000.0;
}

Config make_tiny() {
  // Every layer kind in 8 layers: 0 SWA-only; 1 Full r=2; 2 Reindex r=2;
  // 3 Reuse r=2; 4 = E Full r=1 and candidate source; 5 Reuse; 6 Reindex
  // inside the pool; 7 Reuse.
  Config c;
  c.name = "tiny";
  c.vocab_size = 97;
  c.d_model = 32;
  c.n_layers = 8;
  c.n_encoder_layers = 4;
  c.n_heads = 4;
  c.head_dim = 16;
  c.rope_dim = 8;
  c.q_lora_rank = 16;
  c.window = 4;
  c.compress_ratios = {0, 2, 2, 2, 1, 1, 1, 1};
  c.kv_source_layers = {1, 4};
  c.index_source_layers = {1, 2, 4, 6};
  c.index_n_heads = 2;
  c.index_head_dim = 8;
  c.index_topk = 3;
  c.candidate_source_layer = 4;
  c.candidate_block_size = 2;
  c.candidate_topk_blocks = 3;
  c.o_groups = 2;
  c.o_lora_rank = 8;
  c.n_routed_experts = 4;
  c.n_active_experts = 2;
  c.n_shared_experts = 1;
  c.moe_dim = 16;
  c.routed_scaling_factor = 1.5;
  return c;
}

Config make_small() {
  Config c;
  c.name = "small";
  c.vocab_size = 211;
  c.d_model = 64;
  c.n_layers = 12;
  c.n_encoder_layers = 6;
  c.n_heads = 4;
  c.head_dim = 16;
  c.rope_dim = 8;
  c.q_lora_rank = 32;
  c.window = 8;
  c.compress_ratios = repeat({{0, 1}, {2, 5}, {1, 6}});
  c.kv_source_layers = {1, 6};
  c.index_source_layers = {1, 3, 6, 8, 10};
  c.index_n_heads = 2;
  c.index_head_dim = 16;
  c.index_topk = 8;
  c.candidate_source_layer = 6;
  c.candidate_block_size = 4;
  c.candidate_topk_blocks = 4;
  c.o_groups = 2;
  c.o_lora_rank = 16;
  c.n_routed_experts = 4;
  c.n_active_experts = 2;
  c.n_shared_experts = 1;
  c.moe_dim = 32;
  c.routed_scaling_factor = 1.5;
  return c;
}

Config make_v41_shape() {
  Config c;
  set_v41_schedule(c);
  c.name = "v41-shape";
  c.vocab_size = 1021;
  c.d_model = 64;
  c.n_heads = 4;
  c.head_dim = 32;
  c.rope_dim = 16;
  c.q_lora_rank = 32;
  c.index_n_heads = 2;
  c.index_head_dim = 16;
  c.index_topk = 32;
  c.candidate_topk_blocks = 16;
  c.o_groups = 2;
  c.o_lora_rank = 32;
  c.n_routed_experts = 8;
  c.n_active_experts = 2;
  c.n_shared_experts = 1;
  c.moe_dim = 32;
  return c;
}

Config make_bench() {
  Config c;
  set_v41_schedule(c);
  c.name = "bench";
  c.vocab_size = 8191;
  c.d_model = 1024;
  c.n_heads = 8;
  c.head_dim = 64;
  c.rope_dim = 32;
  c.q_lora_rank = 256;
  c.index_n_heads = 4;
  c.index_head_dim = 64;
  c.index_topk = 128;
  c.candidate_topk_blocks = 64;
  c.o_groups = 4;
  c.o_lora_rank = 128;
  c.n_routed_experts = 8;
  c.n_active_experts = 2;
  c.n_shared_experts = 1;
  c.moe_dim = 256;
  return c;
}

Config make_lab_flash() {
  Config c;
  set_v41_schedule(c);
  c.name = "lab-flash";
  c.vocab_size = 129280;
  c.d_model = 5120;
  c.n_heads = 64;
  c.head_dim = 512;
  c.rope_dim = 64;
  c.q_lora_rank = 1280;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.candidate_topk_blocks = 2048;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.n_routed_experts = 384;
  c.n_active_experts = 6;
  c.n_shared_experts = 1;
  c.moe_dim = 2304;
  return c;
}

// `v` parsed as one N, the whole text; InputError naming `key` otherwise.
template <class N>
N parse_whole(const std::string& key, const std::string& v, const char* what) {
  N x{};
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) fail(key, fmt::format("'{}' is not {}", v, what));
  return x;
}

bool sorted_unique(const std::vector<int64_t>& v) {
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] <= v[i - 1]) return false;
  return true;
}

bool contains(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

using IntKey = ConfigIntKey;
using RealKey = ConfigRealKey;
using ListKey = ConfigListKey;

constexpr IntKey kIntKeys[] = {
    {"vocab_size", &Config::vocab_size},
    {"d_model", &Config::d_model},
    {"n_layers", &Config::n_layers},
    {"n_encoder_layers", &Config::n_encoder_layers},
    {"n_heads", &Config::n_heads},
    {"head_dim", &Config::head_dim},
    {"rope_dim", &Config::rope_dim},
    {"q_lora_rank", &Config::q_lora_rank},
    {"window", &Config::window},
    {"index_n_heads", &Config::index_n_heads},
    {"index_head_dim", &Config::index_head_dim},
    {"index_topk", &Config::index_topk},
    {"candidate_source_layer", &Config::candidate_source_layer},
    {"candidate_block_size", &Config::candidate_block_size},
    {"candidate_topk_blocks", &Config::candidate_topk_blocks},
    {"o_groups", &Config::o_groups},
    {"o_lora_rank", &Config::o_lora_rank},
    {"n_routed_experts", &Config::n_routed_experts},
    {"n_active_experts", &Config::n_active_experts},
    {"n_shared_experts", &Config::n_shared_experts},
    {"moe_dim", &Config::moe_dim},
};
constexpr RealKey kRealKeys[] = {
    {"routed_scaling_factor", &Config::routed_scaling_factor},
    {"rms_eps", &Config::rms_eps},
    {"rope_theta", &Config::rope_theta},
};
constexpr ListKey kListKeys[] = {
    {"compress_ratios", &Config::compress_ratios},
    {"kv_source_layers", &Config::kv_source_layers},
    {"index_source_layers", &Config::index_source_layers},
};

}  // namespace

std::span<const ConfigIntKey> config_int_keys() { return kIntKeys; }
std::span<const ConfigRealKey> config_real_keys() { return kRealKeys; }
std::span<const ConfigListKey> config_list_keys() { return kListKeys; }

const std::vector<std::string>& scalar_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& e : kIntKeys) k.emplace_back(e.key);
    for (const auto& e : kRealKeys) k.emplace_back(e.key);
    k.emplace_back("tie_decoder_kv");
    return k;
  }();
  return keys;
}

const std::vector<std::string>& list_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& e : kListKeys) k.emplace_back(e.key);
    return k;
  }();
  return keys;
}

namespace {

// The one table of built-ins: each name with the function that makes it.
struct Builtin {
  const char* name;
  Config (*make)();
};
constexpr Builtin kBuiltins[] = {
    {"tiny", make_tiny}, {"small", make_small}, {"v41-shape", make_v41_shape}, {"bench", make_bench},
    {"lab-flash", make_lab_flash}};

}  // namespace

const std::vector<std::string>& builtin_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& b : kBuiltins) n.emplace_back(b.name);
    return n;
  }();
  return names;
}

bool is_builtin(std::string_view name) {
  return std::any_of(std::begin(kBuiltins), std::end(kBuiltins), [&](const Builtin& b) { return name == b.name; });
}

Config builtin_config(std::string_view name) {
  for (const auto& b : kBuiltins)
    if (name == b.name) {
      Config c = b.make();
      validate(c);
      return c;
    }
  throw InputError(fmt::format("config: unknown built-in '{}' (built-ins: {})", name, fmt::join(builtin_names(), ", ")));
}

void validate(const Config& c) {
  const int64_t L = c.n_layers, E = c.n_encoder_layers;
  if (L < 2) fail("n_layers", "must be at least 2 (one encoder and one decoder layer)");
  if (E < 1 || E >= L) fail("n_encoder_layers", fmt::format("must satisfy 1 <= E < L = {} (got {})", L, E));
  for (const auto& k : kIntKeys) {
    const std::string key = k.key;
    const int64_t v = c.*k.member;
    if (key == "n_routed_experts" || key == "n_shared_experts") {
      if (v < 0) fail(key, fmt::format("must be >= 0 (got {})", v));
    } else if (key == "candidate_source_layer" || key == "candidate_block_size" ||
               key == "candidate_topk_blocks" || key == "n_active_experts") {
      // checked below, conditionally
    } else if (v <= 0) {
      fail(key, fmt::format("must be positive (got {})", v));
    }
  }
  if (c.n_routed_experts > 0 && (c.n_active_experts < 1 || c.n_active_experts > c.n_routed_experts))
    fail("n_active_experts", fmt::format("must satisfy 1 <= n_active_experts <= n_routed_experts = {} (got {})",
                                         c.n_routed_experts, c.n_active_experts));
  if (c.n_routed_experts == 0 && c.n_active_experts < 0)
    fail("n_active_experts", "must be >= 0");
  if (c.n_heads % c.o_groups != 0)
    fail("o_groups", fmt::format("must divide n_heads = {} (got {})", c.n_heads, c.o_groups));
  if (c.rope_dim % 2 != 0) fail("rope_dim", fmt::format("must be even (got {})", c.rope_dim));
  if (c.rope_dim > c.head_dim) fail("rope_dim", fmt::format("must be <= head_dim = {}", c.head_dim));
  if (c.rope_dim > c.index_head_dim) fail("rope_dim", fmt::format("must be <= index_head_dim = {}", c.index_head_dim));
  if (static_cast<int64_t>(c.compress_ratios.size()) != L)
    fail("compress_ratios", fmt::format("must have n_layers = {} entries (got {})", L, c.compress_ratios.size()));
  for (size_t l = 0; l < c.compress_ratios.size(); ++l)
    if (c.compress_ratios[l] < 0) fail("compress_ratios", fmt::format("layer {}: ratio must be >= 0", l));
  for (const auto* lk : {&kListKeys[1], &kListKeys[2]}) {
    const auto& v = c.*lk->member;
    if (!sorted_unique(v)) fail(lk->key, "must be sorted without duplicates");
    for (int64_t l : v) {
      if (l < 0 || l >= L) fail(lk->key, fmt::format("layer {} out of range [0, {})", l, L));
      if (c.compress_ratios[static_cast<size_t>(l)] <= 0)
        fail(lk->key, fmt::format("layer {} has compress ratio 0; sources need r > 0", l));
    }
  }
  for (int64_t l : c.kv_source_layers)
    if (!contains(c.index_source_layers, l))
      fail("index_source_layers", fmt::format("must contain every kv source (missing {})", l));
  if (!contains(c.kv_source_layers, E))
    fail("kv_source_layers", fmt::format("layer E = {} must be a kv source", E));
  for (int64_t l = 0; l < L; ++l) {
    const int64_t r = c.compress_ratios[static_cast<size_t>(l)];
    if (r == 0) continue;
    int64_t src = -1;
    for (int64_t s : c.kv_source_layers)
      if (s <= l) src = s;
    if (src < 0) fail("kv_source_layers", fmt::format("layer {} has r = {} but no kv source at or below it", l, r));
    if (c.compress_ratios[static_cast<size_t>(src)] != r)
      fail("compress_ratios", fmt::format("layer {} has r = {} but its kv source {} has r = {}", l, r, src,
                                          c.compress_ratios[static_cast<size_t>(src)]));
  }
  if (c.tie_decoder_kv)
    for (int64_t l : c.kv_source_layers)
      if (l > E && c.compress_ratios[static_cast<size_t>(l)] != c.compress_ratios[static_cast<size_t>(E)])
        fail("tie_decoder_kv", fmt::format("decoder kv source {} must have layer E's ratio", l));
  const int64_t cs = c.candidate_source_layer;
  if (cs < -1 || cs >= L) fail("candidate_source_layer", fmt::format("must satisfy -1 <= value < {} (got {})", L, cs));
  if (cs >= 0) {
    if (!contains(c.index_source_layers, cs)) fail("candidate_source_layer", "must be an index source");
    if (c.candidate_block_size <= 0) fail("candidate_block_size", "must be positive");
    if (c.candidate_topk_blocks <= 0) fail("candidate_topk_blocks", "must be positive");
    for (int64_t l : c.index_source_layers)
      if (l > cs && c.compress_ratios[static_cast<size_t>(l)] != c.compress_ratios[static_cast<size_t>(cs)])
        fail("index_source_layers",
             fmt::format("index source {} after the candidate source must have its ratio", l));
  }
  if (!(c.rms_eps > 0)) fail("rms_eps", "must be > 0");
  if (!(c.rope_theta > 0)) fail("rope_theta", "must be > 0");
  if (!(c.routed_scaling_factor > 0)) fail("routed_scaling_factor", "must be > 0");
}

void validate_tokens(const Config& c, const std::vector<int32_t>& tokens) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      throw InputError(fmt::format("tokens: token {} at index {} is out of range [0, {})", tokens[i], i,
                                   c.vocab_size));
}

Config with_override(Config c, std::string_view kv) {
  const auto eq = kv.find('=');
  if (eq == std::string_view::npos) throw InputError(fmt::format("--set: '{}' is not KEY=VALUE", kv));
  const std::string key(kv.substr(0, eq)), value(kv.substr(eq + 1));
  auto to_int = [&](const std::string& v) { return parse_whole<int64_t>(key, v, "an integer"); };
  bool done = false;
  for (const auto& k : kIntKeys)
    if (key == k.key) c.*k.member = to_int(value), done = true;
  for (const auto& k : kRealKeys)
    if (key == k.key) c.*k.member = parse_whole<double>(key, value, "a number"), done = true;
  for (const auto& k : kListKeys)
    if (key == k.key) {
      // Every comma separates two integers: "4,128," and "4,,128" are refused
      // (getline would drop a trailing empty item); "" is the empty list.
      std::vector<int64_t> v;
      for (size_t from = 0; !value.empty();) {
        const size_t comma = value.find(',', from);
        v.push_back(to_int(value.substr(from, comma == std::string::npos ? std::string::npos : comma - from)));
        if (comma == std::string::npos) break;
        from = comma + 1;
      }
      c.*k.member = std::move(v);
      done = true;
    }
  if (key == "tie_decoder_kv") {
    if (value != "true" && value != "false") fail(key, "must be true or false");
    c.tie_decoder_kv = value == "true";
    done = true;
  }
  if (!done) fail(key, "unknown key (--set)");
  c.name += fmt::format("[{}]", kv);
  validate(c);
  return c;
}

Config parse_config_toml(std::string_view text, const std::string& origin) {
  toml::table tbl;
  try {
    tbl = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw InputError(fmt::format("config: {}:{}:{}: {}", origin, src.begin.line, src.begin.column,
                                 e.description()));
  }
  Config c;
  c.name = origin;
  std::set<std::string> known;
  auto need = [&](const char* key) -> const toml::node& {
    known.insert(key);
    const toml::node* n = tbl.get(key);
    if (!n) fail(key, fmt::format("missing in {}", origin));
    return *n;
  };
  for (const auto& k : kIntKeys) {
    const auto& n = need(k.key);
    auto v = n.value_exact<int64_t>();
    if (!v) fail(k.key, "must be an integer");
    c.*k.member = *v;
  }
  for (const auto& k : kRealKeys) {
    const auto& n = need(k.key);
    auto v = n.value<double>();  // integers are accepted as reals
    if (!v || !(n.is_floating_point() || n.is_integer())) fail(k.key, "must be a number");
    c.*k.member = *v;
  }
  for (const auto& k : kListKeys) {
    const auto& n = need(k.key);
    const auto* arr = n.as_array();
    if (!arr) fail(k.key, "must be an array of integers");
    std::vector<int64_t> v;
    for (const auto& e : *arr) {
      auto x = e.value_exact<int64_t>();
      if (!x) fail(k.key, "must be an array of integers");
      v.push_back(*x);
    }
    c.*k.member = std::move(v);
  }
  known.insert("tie_decoder_kv");
  if (const toml::node* n = tbl.get("tie_decoder_kv")) {
    auto v = n->value_exact<bool>();
    if (!v) fail("tie_decoder_kv", "must be a boolean");
    c.tie_decoder_kv = *v;
  }
  for (const auto& [key, _] : tbl)
    if (!known.count(std::string(key.str())))
      fail(std::string(key.str()), fmt::format("unknown key in {}", origin));
  validate(c);
  return c;
}

Config load_config_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("config: cannot read '{}' (not a built-in name either: {})", path.string(),
                                        fmt::join(builtin_names(), ", ")));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config_toml(ss.str(), path.string());
}

Config load_config(std::string_view name_or_path) {
  if (is_builtin(name_or_path)) return builtin_config(name_or_path);
  return load_config_file(std::filesystem::path(name_or_path));
}

std::string to_toml(const Config& c) {
  std::string s;
  for (const auto& k : kIntKeys) s += fmt::format("{} = {}\n", k.key, c.*k.member);
  for (const auto& k : kRealKeys) s += fmt::format("{} = {:.17g}\n", k.key, c.*k.member);
  for (const auto& k : kListKeys) s += fmt::format("{} = [{}]\n", k.key, fmt::join(c.*k.member, ", "));
  s += fmt::format("tie_decoder_kv = {}\n", c.tie_decoder_kv ? "true" : "false");
  return s;
}

double estimate_run_bytes(const Config& c, int64_t n, int scalar_bytes) {
  const double d = c.d_model, H = c.n_heads, hd = c.head_dim, q = c.q_lora_rank;
  const double ih = c.index_n_heads, ihd = c.index_head_dim;
  double per_layer = d * q + q * H * hd + d * hd + 2 * d + q + hd + H + H * hd * c.o_lora_rank +
                     c.o_groups * c.o_lora_rank * d + (c.n_routed_experts + c.n_shared_experts) * 3.0 * d * c.moe_dim +
                     d * c.n_routed_experts + c.n_routed_experts;
  double weights = per_layer * c.n_layers + 2.0 * c.vocab_size * d + d;
  weights += double(c.kv_source_layers.size()) * (2 * d * hd + hd + hd * ihd + ihd);
  for (size_t i = 0; i < c.index_source_layers.size(); ++i) weights += q * ih * ihd + d * ih;
  // Per position: every layer's input row and local entry, the global
  // entries and index keys of each kv source, the logits row.
  double per_pos = c.n_layers * (d + hd + H * hd) + c.vocab_size;
  for (int64_t l : c.kv_source_layers) per_pos += (hd + ihd) / double(c.compress_ratios[size_t(l)]);
  return (weights + per_pos * double(n)) * scalar_bytes;
}

}  // namespace ced
