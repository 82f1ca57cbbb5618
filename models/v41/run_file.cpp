// docs/v41.md §12: the v41 run file; see run_file.hpp.
#include "models/v41/run_file.hpp"

#include <fmt/format.h>

#include <bit>
#include <functional>

#include "io/file_identity.hpp"
#include "io/h5_file_ops.hpp"
#include "io/h5_util.hpp"
#include "io/untrusted.hpp"
#include "model/error.hpp"
#include "models/v41/numerics.hpp"
#include "models/v41/plan.hpp"

namespace ced::v41 {
namespace {

// A capture's datasets: the name in /layers/L, its field, and its shape past the leading N rows
// (-1: not fixed by the config). compressed: the rows are N / ratio (or N + N / ratio for attn_kv),
// not N, so only the trailing dims are checked.
struct RealField {
  const char* name;
  std::vector<double> V41LayerCapture::*field;
  std::function<std::vector<int64_t>(const V41Config&)> tail;
  bool compressed = false;
};
struct IntField {
  const char* name;
  std::function<std::vector<int64_t>(const V41LayerCapture&)> get;
  std::function<void(V41LayerCapture&, const std::vector<int64_t>&)> set;
};

const std::vector<RealField>& real_fields() {
  using C = V41Config;
  static const std::vector<RealField> f = {
      {"engram_in", &V41LayerCapture::engram_in, [](const C& c) { return std::vector<int64_t>{c.hc_mult, c.dim}; }},
      {"in", &V41LayerCapture::in, [](const C& c) { return std::vector<int64_t>{c.hc_mult, c.dim}; }},
      {"pre_mix", &V41LayerCapture::pre_mix, [](const C& c) { return std::vector<int64_t>{c.hc_mult}; }},
      {"attn_pre", &V41LayerCapture::attn_pre, [](const C& c) { return std::vector<int64_t>{c.hc_mult}; }},
      {"attn_post", &V41LayerCapture::attn_post, [](const C& c) { return std::vector<int64_t>{c.hc_mult}; }},
      {"attn_comb", &V41LayerCapture::attn_comb, [](const C& c) { return std::vector<int64_t>{c.hc_mult, c.hc_mult}; }},
      {"ffn_pre", &V41LayerCapture::ffn_pre, [](const C& c) { return std::vector<int64_t>{c.hc_mult}; }},
      {"ffn_post", &V41LayerCapture::ffn_post, [](const C& c) { return std::vector<int64_t>{c.hc_mult}; }},
      {"ffn_comb", &V41LayerCapture::ffn_comb, [](const C& c) { return std::vector<int64_t>{c.hc_mult, c.hc_mult}; }},
      {"index_score", &V41LayerCapture::index_score, [](const C&) { return std::vector<int64_t>{-1}; }},
      {"compress_kv", &V41LayerCapture::compress_kv, [](const C& c) { return std::vector<int64_t>{c.head_dim}; }, true},
      {"index_k", &V41LayerCapture::index_k, [](const C& c) { return std::vector<int64_t>{c.index_head_dim}; }, true},
      {"attn_x", &V41LayerCapture::attn_x, [](const C& c) { return std::vector<int64_t>{c.dim}; }},
      {"attn_out", &V41LayerCapture::attn_out, [](const C& c) { return std::vector<int64_t>{c.dim}; }},
      {"ffn_x", &V41LayerCapture::ffn_x, [](const C& c) { return std::vector<int64_t>{c.dim}; }},
      {"ffn_out", &V41LayerCapture::ffn_out, [](const C& c) { return std::vector<int64_t>{c.dim}; }},
      {"latent", &V41LayerCapture::latent, [](const C& c) { return std::vector<int64_t>{c.head_dim}; }, true},
      {"attn_q", &V41LayerCapture::attn_q, [](const C& c) { return std::vector<int64_t>{c.n_heads, c.head_dim}; }},
      {"attn_kv", &V41LayerCapture::attn_kv, [](const C& c) { return std::vector<int64_t>{c.head_dim}; }, true},
      {"attn_o", &V41LayerCapture::attn_o, [](const C& c) { return std::vector<int64_t>{c.n_heads, c.head_dim}; }},
      {"expert_weights", &V41LayerCapture::expert_weights,
       [](const C& c) { return std::vector<int64_t>{c.n_activated_experts}; }},
      {"out", &V41LayerCapture::out, [](const C& c) { return std::vector<int64_t>{c.hc_mult, c.dim}; }},
  };
  return f;
}

// An integer capture of any element type, moved through int64 both ways.
template <class T>
IntField int_field(const char* name, std::vector<T> V41LayerCapture::*m) {
  return {name, [m](const V41LayerCapture& c) { return std::vector<int64_t>((c.*m).begin(), (c.*m).end()); },
          [m](V41LayerCapture& c, const std::vector<int64_t>& v) { (c.*m).assign(v.begin(), v.end()); }};
}

const std::vector<IntField>& int_fields() {
  static const std::vector<IntField> f = {
      int_field("hash_ids", &V41LayerCapture::hash_ids),
      int_field("topk_idxs", &V41LayerCapture::topk_idxs),
      int_field("candidates", &V41LayerCapture::candidates),
      int_field("attn_idx", &V41LayerCapture::attn_idx),
      int_field("experts", &V41LayerCapture::experts),
  };
  return f;
}

// A capture's shape from its size: the fixed trailing dims, the free one (-1) from what is left, and
// N rows when a dim is free, else as many rows as the size holds (the compressed counts).
std::vector<hsize_t> dims_of(size_t n, int64_t N, const std::vector<int64_t>& tail) {
  int64_t fixed = 1;
  bool free_dim = false;
  for (int64_t d : tail) d > 0 ? void(fixed *= d) : void(free_dim = true);
  const int64_t size = static_cast<int64_t>(n);
  std::vector<hsize_t> dims{static_cast<hsize_t>(free_dim ? N : size / fixed)};
  for (int64_t d : tail) dims.push_back(static_cast<hsize_t>(d > 0 ? d : size / (N * fixed)));
  return dims;
}

std::vector<double> read_values(hid_t file, const std::string& path, std::vector<int64_t>* dims) {
  if (h5::has_attr(file, path, "encoding")) {
    const std::string enc = h5::read_string_attr(file, path, "encoding");
    if (enc != "bf16") throw InputError(fmt::format("{}: encoding '{}' is not bf16", path, enc));
    const h5::Array<int64_t> bits = h5::read_ints(file, path, -1);
    std::vector<double> v(bits.values.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (bits.values[i] < 0 || bits.values[i] > 0xFFFF)
        throw InputError(fmt::format("{}: element {} is not a 16-bit pattern", path, i));
      v[i] = f32_from_bf16(static_cast<uint16_t>(bits.values[i]));
    }
    if (dims) *dims = bits.dims;
    return v;
  }
  h5::Array<double> a = h5::read_reals(file, path, -1);
  if (dims) *dims = a.dims;
  return std::move(a.values);
}

// The shape of a dataset against what the config and N imply: rank, leading N (unless compressed),
// and every fixed trailing dimension.
void check_shape(const std::string& path, const std::vector<int64_t>& dims, int64_t N, const std::vector<int64_t>& tail,
                 bool compressed, int64_t max_rows) {
  auto bad = [&](const std::string& why) { throw InputError(fmt::format("{}: {}", path, why)); };
  if (dims.size() != tail.size() + 1) bad(fmt::format("rank {}, expected {}", dims.size(), tail.size() + 1));
  if (!compressed && dims[0] != N) bad(fmt::format("{} rows, expected {}", dims[0], N));
  if (compressed && (dims[0] < 0 || dims[0] > max_rows)) bad(fmt::format("{} rows for N = {}", dims[0], N));
  for (size_t i = 0; i < tail.size(); ++i)
    if (tail[i] > 0 && dims[i + 1] != tail[i]) bad(fmt::format("dimension {} is {}, expected {}", i + 1, dims[i + 1], tail[i]));
}


// The captures of every layer under PREFIX/layers/L (PREFIX "" for the prefill, /decode/steps/S for a step).
void write_layers(hid_t file, const std::string& prefix, const std::vector<V41LayerCapture>& layers, int64_t N,
                  const V41Config& config, bool as_float) {
  h5::create_group(file, prefix + "/layers");
  for (const auto& c : layers) {
    const std::string g = fmt::format("{}/layers/{}", prefix, c.layer);
    h5::create_group(file, g);
    // A layer of a CED tail or a resumed prompt holds the rows from its first on.
    if (c.first_row != 0) h5::write_int_attr(file, g, "first_row", c.first_row);
    const int64_t rows = N - c.first_row;
    for (const auto& rf : real_fields()) {
      const auto& v = c.*rf.field;
      if (!v.empty()) h5::write_reals(file, g + "/" + rf.name, v.data(), dims_of(v.size(), rows, rf.tail(config)), as_float);
    }
    for (const auto& inf : int_fields()) {
      const auto v = inf.get(c);
      if (v.empty()) continue;
      const std::vector<hsize_t> dims{static_cast<hsize_t>(rows), static_cast<hsize_t>(static_cast<int64_t>(v.size()) / rows)};
      h5::write_ints(file, g + "/" + inf.name, v.data(), dims);
    }
  }
}

// The final collapse, norm and logits under PREFIX.
void write_head(hid_t file, const std::string& prefix, const V41ForwardResult& r, int64_t N, const V41Config& config,
                bool as_float) {
  const auto D = static_cast<hsize_t>(config.dim), V = static_cast<hsize_t>(config.vocab_size), n = static_cast<hsize_t>(N);
  h5::create_group(file, prefix + "/final");
  h5::write_reals(file, prefix + "/final/collapsed", r.final_collapsed.data(), {n, D}, as_float);
  h5::write_reals(file, prefix + "/final/normed", r.final_normed.data(), {n, D}, as_float);
  h5::write_reals(file, prefix + "/logits", r.logits.data(), {n, V}, as_float);
}

// max_rows: the most rows a compressed capture may have (2N in a prefill; a step's attn_kv is the ring
// and the compressed rows so far).
std::vector<V41LayerCapture> read_layers(hid_t file, const std::string& prefix, int64_t N, int64_t max_rows,
                                         const V41Config& config) {
  std::vector<V41LayerCapture> layers;
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string g = fmt::format("{}/layers/{}", prefix, l);
    V41LayerCapture c;
    c.layer = l;
    if (h5::exists(file, g)) {
      if (h5::has_attr(file, g, "first_row")) {
        c.first_row = h5::read_int_attr(file, g, "first_row");
        if (c.first_row < 0 || c.first_row >= N)
          throw InputError(fmt::format("{}: first_row {} is outside [0, N = {})", g, c.first_row, N));
      }
      const int64_t rows = N - c.first_row;
      for (const auto& rf : real_fields()) {
        const std::string p = g + "/" + rf.name;
        if (!h5::exists(file, p)) continue;
        std::vector<int64_t> dims;
        c.*rf.field = read_values(file, p, &dims);
        check_shape(p, dims, rows, rf.tail(config), rf.compressed, max_rows);
      }
      for (const auto& inf : int_fields()) {
        const std::string p = g + "/" + inf.name;
        if (!h5::exists(file, p)) continue;
        const h5::Array<int64_t> a = h5::read_ints(file, p, 2);
        check_shape(p, a.dims, rows, {-1}, false, max_rows);
        inf.set(c, a.values);
        if (std::string(inf.name) == "topk_idxs") c.topk = a.dims[1];
      }
    }
    layers.push_back(std::move(c));
  }
  return layers;
}

void read_head(hid_t file, const std::string& prefix, int64_t N, const V41Config& config, V41ForwardResult& r) {
  std::vector<int64_t> dims;
  r.final_collapsed = read_values(file, prefix + "/final/collapsed", &dims);
  check_shape(prefix + "/final/collapsed", dims, N, {config.dim}, false, N);
  r.final_normed = read_values(file, prefix + "/final/normed", &dims);
  check_shape(prefix + "/final/normed", dims, N, {config.dim}, false, N);
  r.logits = read_values(file, prefix + "/logits", &dims);
  check_shape(prefix + "/logits", dims, N, {config.vocab_size}, false, N);
}

// A seed dataset: [rows, width] exactly.
void write_matrix(hid_t file, const std::string& path, const std::vector<double>& v, int64_t width, bool as_float) {
  if (v.empty()) return;
  h5::write_reals(file, path, v.data(), {static_cast<hsize_t>(static_cast<int64_t>(v.size()) / width), static_cast<hsize_t>(width)},
                  as_float);
}
std::vector<double> read_matrix(hid_t file, const std::string& path, int64_t rows, int64_t width) {
  if (!h5::exists(file, path)) return {};
  std::vector<int64_t> dims;
  std::vector<double> v = read_values(file, path, &dims);
  if (dims != std::vector<int64_t>{rows, width})
    throw InputError(fmt::format("{}: shape is not [{}, {}]", path, rows, width));
  return v;
}

void write_decode(hid_t file, const V41DecodeRecord& d, const V41Config& config, bool as_float) {
  h5::create_group(file, "/decode");
  h5::write_ints(file, "/decode/tokens", d.tokens.data(), {static_cast<hsize_t>(d.tokens.size())});
  h5::create_group(file, "/decode/seed");
  h5::create_group(file, "/decode/seed/layers");
  for (size_t l = 0; l < d.seed.size(); ++l) {
    const std::string g = fmt::format("/decode/seed/layers/{}", l);
    h5::create_group(file, g);
    write_matrix(file, g + "/window", d.seed[l].window, config.head_dim, as_float);
    write_matrix(file, g + "/kv_state", d.seed[l].kv_state, config.head_dim, as_float);
    write_matrix(file, g + "/score_state", d.seed[l].score_state, config.head_dim, as_float);
  }
  h5::create_group(file, "/decode/steps");
  for (size_t s = 0; s < d.steps.size(); ++s) {
    const std::string prefix = fmt::format("/decode/steps/{}", s);
    h5::create_group(file, prefix);
    write_layers(file, prefix, d.steps[s].layers, 1, config, as_float);
    write_head(file, prefix, d.steps[s], 1, config, as_float);
  }
}

V41DecodeRecord read_decode(hid_t file, const V41Config& config, int64_t N) {
  V41DecodeRecord d;
  d.tokens = h5::read_ints(file, "/decode/tokens", 1).values;
  if (d.tokens.empty()) throw InputError("/decode/tokens: empty");
  for (size_t i = 0; i < d.tokens.size(); ++i)
    if (d.tokens[i] < 0 || d.tokens[i] >= config.vocab_size)
      throw InputError(fmt::format("/decode/tokens: token {} is {}, outside [0, {})", i, d.tokens[i], config.vocab_size));
  const int64_t total = N + static_cast<int64_t>(d.tokens.size());
  const V41Plan plan = make_v41_plan(config);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string g = fmt::format("/decode/seed/layers/{}", l);
    V41LayerCache c;
    c.window = read_matrix(file, g + "/window", config.window_size, config.head_dim);
    if (c.window.empty()) throw InputError(fmt::format("{}/window: missing", g));
    const int64_t r = plan[l].ratio;
    if (plan[l].owns_compressor && r > 1) {
      c.kv_state = read_matrix(file, g + "/kv_state", r, config.head_dim);
      c.score_state = read_matrix(file, g + "/score_state", r, config.head_dim);
      if (c.kv_state.empty() || c.score_state.empty()) throw InputError(fmt::format("{}: no compressor group state", g));
    }
    d.seed.push_back(std::move(c));
  }
  for (size_t s = 0; s < d.tokens.size(); ++s) {
    const std::string prefix = fmt::format("/decode/steps/{}", s);
    if (!h5::exists(file, prefix)) throw InputError(fmt::format("{}: missing ({} decode tokens)", prefix, d.tokens.size()));
    V41ForwardResult r;
    r.N = 1;
    r.layers = read_layers(file, prefix, 1, config.window_size + total, config);
    read_head(file, prefix, 1, config, r);
    d.steps.push_back(std::move(r));
  }
  return d;
}

// The request as root attributes; a full prefill writes only its mode.
void write_request(hid_t file, const V41RunRequest& r, int64_t first_row) {
  h5::write_string_attr(file, "/", "mode", r.mode);
  if (r.mode == "full") return;
  h5::write_string_attr(file, "/", "replay", r.replay);
  h5::write_int_attr(file, "/", "n_replay", r.n_replay);
  h5::write_int_attr(file, "/", "first_row", first_row);
  if (!r.convention.empty()) h5::write_string_attr(file, "/", "convention", r.convention);
  if (r.mode != "resume") return;
  h5::write_int_attr(file, "/", "prefix_len", r.prefix_len);
  h5::write_string_attr(file, "/", "rule", r.rule);
  h5::write_int_attr(file, "/", "rebuilt", r.rebuilt);
}

V41RunRequest read_request(hid_t file, int64_t N, int64_t& first_row) {
  V41RunRequest r;
  first_row = 0;
  if (!h5::has_attr(file, "/", "mode")) return r;  // version 1: a full prefill
  r.mode = h5::read_string_attr(file, "/", "mode");
  if (r.mode != "full" && r.mode != "ced" && r.mode != "resume")
    throw InputError(fmt::format("/: mode '{}' is not full, ced or resume", r.mode));
  if (r.mode == "full") return r;
  r.replay = h5::read_string_attr(file, "/", "replay");
  r.n_replay = h5::read_int_attr(file, "/", "n_replay");
  first_row = h5::read_int_attr(file, "/", "first_row");
  if (first_row < 0 || first_row >= N)
    throw InputError(fmt::format("/: first_row {} is outside [0, N = {})", first_row, N));
  if (r.n_replay < 1 || r.n_replay > N)
    throw InputError(fmt::format("/: n_replay {} is outside [1, N = {}]", r.n_replay, N));
  if (h5::has_attr(file, "/", "convention")) r.convention = h5::read_string_attr(file, "/", "convention");
  if (r.mode == "ced" && r.convention.empty()) throw InputError("/: a ced run without its convention");
  if (r.mode != "resume") return r;
  r.prefix_len = h5::read_int_attr(file, "/", "prefix_len");
  r.rule = h5::read_string_attr(file, "/", "rule");
  r.rebuilt = h5::read_int_attr(file, "/", "rebuilt");
  if (r.prefix_len < 1 || r.prefix_len > N)
    throw InputError(fmt::format("/: prefix_len {} is outside [1, N = {}]", r.prefix_len, N));
  if (r.rebuilt < 0) throw InputError(fmt::format("/: rebuilt {} is negative", r.rebuilt));
  return r;
}

}  // namespace

std::vector<V41CaptureTensor> v41_capture_tensors(const V41LayerCapture& c) {
  std::vector<V41CaptureTensor> out;
  for (const auto& rf : real_fields())
    if (!(c.*rf.field).empty()) out.push_back({rf.name, c.*rf.field, !rf.compressed, false});
  for (const auto& inf : int_fields()) {
    const std::vector<int64_t> v = inf.get(c);
    if (v.empty()) continue;
    const std::string name = inf.name;
    out.push_back({name, std::vector<double>(v.begin(), v.end()), true, name == "topk_idxs" || name == "attn_idx"});
  }
  return out;
}

void v41_drop_rows_before(V41LayerCapture& c, int64_t position, int64_t N) {
  if (position <= c.first_row) return;
  const size_t rows = static_cast<size_t>(N - c.first_row), drop = static_cast<size_t>(position - c.first_row);
  auto cut = [&](auto& v) {
    if (v.empty()) return;
    v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / rows * drop));
  };
  for (const auto& rf : real_fields())
    if (!rf.compressed) cut(c.*rf.field);
  for (const auto& inf : int_fields()) {  // every integer capture is per row
    std::vector<int64_t> v = inf.get(c);
    cut(v);
    inf.set(c, v);
  }
  c.first_row = position;
}

void v41_drop_unused_cut_rows(V41ForwardResult& r, const V41Plan& p, const V41ReplayConvention& c) {
  if (c.floor_first_layer && !c.all_layers && r.layers.size() > static_cast<size_t>(p.E))
    v41_drop_rows_before(r.layers[static_cast<size_t>(p.E)], r.first_row, r.N);
}

std::string v41_request_summary(const V41RunRequest& r) {
  if (r.mode == "full") return "full";
  std::string s = r.mode == "resume" ? fmt::format("resume after a hit at H = {} (rule {}, {} window rows rebuilt)",
                                                   r.prefix_len, r.rule, r.rebuilt)
                                     : std::string("ced");
  if (!r.convention.empty()) s += fmt::format(" (convention {}, replay {} = {} rows)", r.convention, r.replay, r.n_replay);
  return s;
}

void write_v41_run_file(const std::filesystem::path& path, const V41RunFile& f) {
  const bool as_float = f.regime != V41Regime::f64;
  const int64_t N = static_cast<int64_t>(f.tokens.size());
  h5::write_atomically(path, [&](hid_t file) {
    write_file_identity(file, "v41", f.generator);
    h5::write_string_attr(file, "/", "config", write_v41_flat_json(f.config));
    h5::write_string_attr(file, "/", "config_name", f.config.name);
    h5::write_string_attr(file, "/", "regime", v41_regime_name(f.regime));
    h5::write_string_attr(file, "/", "weights_digest", f.weights_digest);
    h5::write_string_attr(file, "/", "topk_ties", v41_topk_ties_name(f.options.topk_ties));
    h5::write_string_attr(file, "/", "index_scores", v41_index_scores_name(f.options.index_scores));
    h5::write_string_attr(file, "/", "decode_index_k", v41_decode_index_k_name(f.options.decode_index_k));
    if (f.weight_seed) h5::write_uint_attr(file, "/", "weight_seed", *f.weight_seed);
    write_request(file, f.request, f.result.first_row);
    h5::create_group(file, "/provenance");
    for (const auto& [k, v] : f.provenance) h5::write_string_attr(file, "/provenance", k, v);
    h5::write_ints(file, "/tokens", f.tokens.data(), {static_cast<hsize_t>(N)});
    write_layers(file, "", f.result.layers, N, f.config, as_float);
    write_head(file, "", f.result, N - f.result.first_row, f.config, as_float);
    const auto V = static_cast<hsize_t>(f.config.vocab_size);
    if (!f.logits_last.empty()) h5::write_reals(file, "/logits_last", f.logits_last.data(), {V}, as_float);
    if (!f.rope.empty()) {
      h5::create_group(file, "/rope");
      for (const auto& [k, v] : f.rope)
        h5::write_reals(file, "/rope/" + k, v.data(),
                        {static_cast<hsize_t>(N), static_cast<hsize_t>(f.config.rope_head_dim / 2)}, as_float);
    }
    if (f.decode) write_decode(file, *f.decode, f.config, as_float);
  });
}

V41RunFile read_v41_run_file(const std::filesystem::path& path) {
  return h5::read_file(path, [&](hid_t file) {
    V41RunFile f;
    const FileIdentity id = read_file_identity(file);
    if (id.family != "v41")
      throw InputError(fmt::format("/: format '{}' of the {} family is not a v41 run file", id.format, id.family));
    const int64_t want = id.format == kV41FormerFormat ? 1 : kFileFormatVersion;
    if (id.version != want)
      throw InputError(fmt::format("/: format_version {} of '{}' (this build reads '{}' {} and '{}' 1)", id.version,
                                   id.format, kFileFormat, kFileFormatVersion, kV41FormerFormat));
    f.generator = h5::read_string_attr(file, "/", "generator");
    f.config = parse_v41_flat_json(h5::read_string_attr(file, "/", "config"), "/: attribute 'config'");
    f.config.name = h5::read_string_attr(file, "/", "config_name");
    validate_v41(f.config);
    f.regime = v41_regime_from_name(h5::read_string_attr(file, "/", "regime"));
    f.weights_digest = h5::read_string_attr(file, "/", "weights_digest");
    if (h5::has_attr(file, "/", "topk_ties"))
      f.options.topk_ties = v41_topk_ties_from_name(h5::read_string_attr(file, "/", "topk_ties"));
    if (h5::has_attr(file, "/", "index_scores"))
      f.options.index_scores = v41_index_scores_from_name(h5::read_string_attr(file, "/", "index_scores"));
    if (h5::has_attr(file, "/", "decode_index_k"))
      f.options.decode_index_k = v41_decode_index_k_from_name(h5::read_string_attr(file, "/", "decode_index_k"));
    if (h5::has_attr(file, "/", "weight_seed")) f.weight_seed = h5::read_uint_attr(file, "/", "weight_seed");
    if (h5::exists(file, "/provenance")) {
      for (const auto& k : h5::attr_names(file, "/provenance"))
        f.provenance[k] = h5::read_string_attr(file, "/provenance", k);
    }
    const h5::Array<int64_t> tok = h5::read_ints(file, "/tokens", 1);
    f.tokens = tok.values;
    const int64_t N = static_cast<int64_t>(f.tokens.size());
    if (N < 1) throw InputError("/tokens: empty");
    for (size_t i = 0; i < f.tokens.size(); ++i)
      if (f.tokens[i] < 0 || f.tokens[i] >= f.config.vocab_size)
        throw InputError(fmt::format("/tokens: token {} is {}, outside [0, {})", i, f.tokens[i], f.config.vocab_size));
    f.result.N = N;
    f.request = read_request(file, N, f.result.first_row);
    f.result.layers = read_layers(file, "", N, 2 * N, f.config);
    read_head(file, "", N - f.result.first_row, f.config, f.result);
    std::vector<int64_t> dims;
    if (h5::exists(file, "/logits_last")) {
      f.logits_last = read_values(file, "/logits_last", &dims);
      if (dims != std::vector<int64_t>{f.config.vocab_size}) throw InputError("/logits_last: shape is not [vocab_size]");
    }
    if (h5::exists(file, "/rope"))
      for (const char* k : {"swa_cos", "swa_sin", "compressed_cos", "compressed_sin"}) {
        const std::string p = std::string("/rope/") + k;
        if (!h5::exists(file, p)) continue;
        f.rope[k] = read_values(file, p, &dims);
        check_shape(p, dims, N, {f.config.rope_head_dim / 2}, false, N);
      }
    if (h5::exists(file, "/decode")) f.decode = read_decode(file, f.config, N);
    return f;
  });
}

bool is_untrusted_v41_run_file(const std::filesystem::path& path) { return untrusted_file_family(path) == "v41"; }

V41RunFile read_untrusted_v41_run_file(const std::filesystem::path& path) {
  V41RunFile f;
  read_through_copy(
      path,
      [&](const std::filesystem::path& copy) {
        write_v41_run_file(copy, read_v41_run_file(path));
        return std::string();
      },
      [&](const std::filesystem::path& copy) { f = read_v41_run_file(copy); });
  return f;
}

}  // namespace ced::v41
