// ced._core's v41 part (docs/v41.md): the released architecture's reference, checkpoints, run files and the
// gate's per-tensor judge, for the `ced.v41` package (python/ced/v41), which wraps them as an engine a port is
// compared with. Every function calls the code the `ced` command runs; nothing is reimplemented.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "model/error.hpp"
#include "python/src/numpy_arrays.hpp"
#include "models/lab/weights.hpp"
#include "checks/v41/agreement.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/config.hpp"
#include "reference/v41/forward.hpp"
#include "models/v41/plan.hpp"
#include "checks/v41/diff.hpp"
#include "models/v41/loaded_digests.hpp"
#include "models/v41/stress_prompts.hpp"
#include "models/v41/run_file.hpp"

namespace py = pybind11;
using namespace ced;
using namespace ced::v41;

namespace {

using Doubles = py::array_t<double, py::array::c_style | py::array::forcecast>;
using Ints = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// A vector as an array of the given shape (the last dimension -1: what the size leaves); empty vectors are None,
// so a capture a layer does not have reads as absent.
template <class T, class U = T>
py::object array_of(const std::vector<T>& v, std::vector<py::ssize_t> shape) {
  if (v.empty()) return py::none();
  py::ssize_t known = 1, free = -1;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 0) free = static_cast<py::ssize_t>(i);
    else known *= shape[i];
  if (free >= 0) shape[static_cast<size_t>(free)] = known ? static_cast<py::ssize_t>(v.size()) / known : 0;
  const std::vector<U> values(v.begin(), v.end());
  return python::numpy_array(shape, values.data());
}

std::vector<double> doubles(const Doubles& a) { return {a.data(), a.data() + a.size()}; }
std::vector<int64_t> ints(const Ints& a) { return {a.data(), a.data() + a.size()}; }
std::vector<double> doubles_or_empty(const py::object& o) {
  return o.is_none() ? std::vector<double>{} : doubles(o.cast<Doubles>());
}

// One layer's captures as a dict of arrays (absent ones None), in the shapes of docs/v41.md §9.3.
py::dict capture_dict(const V41LayerCapture& cap, const V41Config& c, int64_t rows) {
  const py::ssize_t N = rows, hc = c.hc_mult, d = c.dim, H = c.n_heads, hd = c.head_dim;
  py::dict o;
  o["layer"] = cap.layer;
  o["first_row"] = cap.first_row;
  o["engram_in"] = array_of(cap.engram_in, {N, hc, d});
  o["hash_ids"] = array_of<int64_t>(cap.hash_ids, {N, -1});
  o["in"] = array_of(cap.in, {N, hc, d});
  o["pre_mix"] = array_of(cap.pre_mix, {N, hc});
  o["attn_pre"] = array_of(cap.attn_pre, {N, hc});
  o["attn_post"] = array_of(cap.attn_post, {N, hc});
  o["attn_comb"] = array_of(cap.attn_comb, {N, hc, hc});
  o["ffn_pre"] = array_of(cap.ffn_pre, {N, hc});
  o["ffn_post"] = array_of(cap.ffn_post, {N, hc});
  o["ffn_comb"] = array_of(cap.ffn_comb, {N, hc, hc});
  o["topk_idxs"] = array_of<int32_t, int64_t>(cap.topk_idxs, {N, -1});
  o["index_score"] = array_of(cap.index_score, {N, -1});
  o["compress_kv"] = array_of(cap.compress_kv, {-1, hd});
  o["index_k"] = array_of(cap.index_k, {-1, static_cast<py::ssize_t>(c.index_head_dim)});
  o["candidates"] = array_of<uint8_t>(cap.candidates, {N, -1});
  o["attn_x"] = array_of(cap.attn_x, {N, d});
  o["attn_out"] = array_of(cap.attn_out, {N, d});
  o["ffn_x"] = array_of(cap.ffn_x, {N, d});
  o["ffn_out"] = array_of(cap.ffn_out, {N, d});
  o["latent"] = array_of(cap.latent, {-1, hd});
  o["attn_q"] = array_of(cap.attn_q, {N, H, hd});
  o["attn_kv"] = array_of(cap.attn_kv, {-1, hd});
  o["attn_idx"] = array_of<int32_t, int64_t>(cap.attn_idx, {N, -1});
  o["attn_o"] = array_of(cap.attn_o, {N, H, hd});
  o["experts"] = array_of<int32_t, int64_t>(cap.experts, {N, -1});
  o["expert_weights"] = array_of(cap.expert_weights, {N, -1});
  // Without every capture a layer keeps its last row's output only: [1, hc, dim].
  o["out"] = array_of(cap.out, {-1, hc, d});
  return o;
}

py::dict result_dict(const V41ForwardResult& r, const V41Config& c) {
  py::dict o;
  const int64_t V = c.vocab_size, rows = V ? static_cast<int64_t>(r.logits.size()) / V : 0;
  o["first_row"] = r.first_row;
  o["logits"] = array_of(r.logits, {rows, V});
  o["final_collapsed"] = array_of(r.final_collapsed, {-1, c.dim});
  o["final_normed"] = array_of(r.final_normed, {-1, c.dim});
  py::list layers;
  for (const auto& cap : r.layers) {
    // a layer's rows: what its selection or output covers (a CED tail's layers ran fewer than N)
    const int64_t n = !cap.pre_mix.empty() ? static_cast<int64_t>(cap.pre_mix.size()) / c.hc_mult
                      : !cap.experts.empty() ? static_cast<int64_t>(cap.experts.size()) / c.n_activated_experts
                                             : rows;
    layers.append(capture_dict(cap, c, n));
  }
  o["layers"] = layers;
  return o;
}

py::dict request_dict(const V41RunRequest& r) {
  py::dict o;
  o["mode"] = r.mode;
  o["replay"] = r.replay;
  o["n_replay"] = r.n_replay;
  o["convention"] = r.convention;
  o["prefix_len"] = r.prefix_len;
  o["rule"] = r.rule;
  o["rebuilt"] = r.rebuilt;
  return o;
}

V41RunRequest request_from(const py::dict& d) {
  V41RunRequest r;
  auto get = [&](const char* k, auto& to) {
    if (d.contains(k) && !d[k].is_none()) to = d[k].cast<std::remove_reference_t<decltype(to)>>();
  };
  get("mode", r.mode);
  get("replay", r.replay);
  get("n_replay", r.n_replay);
  get("convention", r.convention);
  get("prefix_len", r.prefix_len);
  get("rule", r.rule);
  get("rebuilt", r.rebuilt);
  return r;
}

py::dict cache_dict(const V41LayerCache& l, const V41Config& c) {
  py::dict o;
  o["window"] = array_of(l.window, {-1, c.head_dim});
  o["kv_state"] = array_of(l.kv_state, {-1, c.head_dim});
  o["score_state"] = array_of(l.score_state, {-1, c.head_dim});
  o["compress_kv"] = array_of(l.compress_kv, {-1, c.head_dim});
  o["index_k"] = array_of(l.index_k, {-1, c.index_head_dim});
  return o;
}

py::dict config_dict(const V41Config& c) {
  py::dict o;
  o["name"] = c.name;
  o["json"] = write_v41_flat_json(c);
  return o;
}

// What a layer reads of the layers below it (model.py's shared_attn), from a dict of arrays: the latest kv
// source's compressed KV and index keys with its ratio, the latest index source's selection, the candidate pool.
V41SharedAttention shared_of(const py::dict& d, int64_t N) {
  V41SharedAttention s;
  if (d.contains("ratio") && !d["ratio"].is_none()) s.ratio = d["ratio"].cast<int64_t>();
  if (d.contains("compress_kv")) s.compress_kv = doubles_or_empty(d["compress_kv"]);
  if (d.contains("index_k")) s.index_k = doubles_or_empty(d["index_k"]);
  s.compress_rows = s.ratio > 0 ? N / s.ratio : 0;
  if (d.contains("topk_idxs") && !d["topk_idxs"].is_none()) {
    const Ints t = d["topk_idxs"].cast<Ints>();
    s.topk = t.ndim() == 2 ? t.shape(1) : 0;
    s.topk_idxs.assign(t.data(), t.data() + t.size());
  }
  if (d.contains("candidates") && !d["candidates"].is_none()) {
    const auto a = d["candidates"].cast<py::array_t<uint8_t, py::array::c_style | py::array::forcecast>>();
    s.candidates.assign(a.data(), a.data() + a.size());
  }
  return s;
}

py::dict shared_dict(const V41SharedAttention& s, const V41Config& c, int64_t N) {
  py::dict o;
  o["ratio"] = s.ratio;
  o["compress_kv"] = array_of(s.compress_kv, {-1, c.head_dim});
  o["index_k"] = array_of(s.index_k, {-1, c.index_head_dim});
  o["topk_idxs"] = array_of<int32_t, int64_t>(s.topk_idxs, {N, -1});
  o["candidates"] = array_of<uint8_t>(s.candidates, {N, -1});
  return o;
}

// The reference as a stateful engine: a checkpoint, a regime, and the decode state of its last prefill.
class Reference {
 public:
  Reference(V41Checkpoint ck, const std::string& regime)
      : ck_(std::move(ck)), model_(ck_.config, ck_.weights, v41_regime_from_name(regime)),
        hashing_(v41_checkpoint_hashing(ck_.config)), digest_(v41_weights_digest(ck_.weights)) {}

  const V41Model& model() const { return model_; }
  V41Model& model() { return model_; }
  const V41Config& config() const { return ck_.config; }
  const std::string& digest() const { return digest_; }
  // What a prefill keeps: every capture, or the small ones (V41Model::set_captures).
  void set_captures(bool all) {
    captures_ = all;
    model_.set_captures(all);
  }

  py::dict prefill(const Ints& tokens) {
    const std::vector<int64_t> t = checked(tokens);
    state_ = V41DecodeState{};
    py::gil_scoped_release nogil;
    const V41ForwardResult r = model_.forward(t, hashing_, &state_);
    py::gil_scoped_acquire gil;
    return result_dict(r, config());
  }
  py::dict prefill_ced(const Ints& tokens, int64_t replay, const std::string& convention) {
    const std::vector<int64_t> t = checked(tokens);
    const V41ReplayConvention& conv = v41_replay_convention(convention);
    if (replay < 1) throw InputError(fmt::format("replay: {} rows; a replay needs at least one", replay));
    state_ = V41DecodeState{};
    V41ForwardResult r;
    {
      py::gil_scoped_release nogil;
      r = model_.forward_ced(t, hashing_, replay, conv, &state_);
    }
    v41_drop_unused_cut_rows(r, model_.plan(), conv);
    return result_dict(r, config());
  }
  py::dict resume(const Ints& tokens, int64_t hit, const std::string& rule, int64_t replay,
                  const std::optional<std::string>& convention) {
    const std::vector<int64_t> t = checked(tokens);
    const int64_t N = static_cast<int64_t>(t.size());
    if (hit < 1 || hit > N) throw InputError(fmt::format("hit: {} tokens of a prompt of {}", hit, N));
    const V41EncoderReplayRule& r = v41_encoder_replay_rule(rule);
    const V41ReplayConvention* conv = convention ? &v41_replay_convention(*convention) : nullptr;
    V41ForwardResult out;
    {
      py::gil_scoped_release nogil;
      // the prefix cache of the hit, from a cold prefill of the hit's tokens (the groups are causal)
      V41DecodeState cold;
      model_.forward(std::span(t).first(static_cast<size_t>(hit)), hashing_, &cold);
      const V41PrefixHit cached = model_.prefix_hit(cold, hit);
      state_ = V41DecodeState{};
      out = model_.forward_resume(t, hashing_, cached, r, model_.plan().W, conv ? replay : N, conv, &state_);
    }
    if (conv) v41_drop_unused_cut_rows(out, model_.plan(), *conv);
    return result_dict(out, config());
  }
  py::dict decode(int64_t token) {
    if (state_.layers.empty()) throw InputError("decode: no prefill before it");
    check_token(token);
    V41ForwardResult r;
    {
      py::gil_scoped_release nogil;
      r = model_.decode_step(token, hashing_, state_);
    }
    return result_dict(r, config());
  }
  // One block on given streams [N, hc, dim] (before its Engram) and pre_mix [N, hc], the prompt's tokens (its
  // Engram's n-grams) and what the layers below published (shared_of); returns its captures and what it published.
  py::tuple run_layer(int64_t layer, const Doubles& streams, const Doubles& pre_mix, const Ints& tokens,
                      const py::dict& shared) {
    check_layer(layer);
    const std::vector<int64_t> t = checked(tokens);
    const int64_t N = static_cast<int64_t>(t.size());
    check_size("streams", streams.size(), N * config().hc_mult * config().dim);
    check_size("pre_mix", pre_mix.size(), N * config().hc_mult);
    V41SharedAttention s = shared_of(shared, N);
    const std::vector<int64_t> ids = layer_hash_ids(layer, t);
    const std::vector<double> x = doubles(streams), pm = doubles(pre_mix);
    V41LayerCapture cap;
    {
      py::gil_scoped_release nogil;
      const FullCaptures all(*this);
      cap = model_.run_layer(layer, x, pm, N, ids, s);
    }
    return py::make_tuple(capture_dict(cap, config(), N), shared_dict(s, config(), N));
  }
  // The attention alone on x [N, dim] (attn_norm's output): its captures (index scores among them).
  py::dict attention(int64_t layer, const Doubles& x, const py::dict& shared) {
    check_layer(layer);
    const int64_t N = x.size() / config().dim;
    check_size("x", x.size(), N * config().dim);
    V41SharedAttention s = shared_of(shared, N);
    V41LayerCapture cap;
    cap.layer = layer;
    const std::vector<double> in = doubles(x);
    std::vector<double> out;
    {
      py::gil_scoped_release nogil;
      const FullCaptures all(*this);
      out = model_.attention(layer, in, N, s, cap);
    }
    cap.attn_out = out;
    return capture_dict(cap, config(), N);
  }
  py::dict moe(int64_t layer, const Doubles& x) {
    check_layer(layer);
    const int64_t N = x.size() / config().dim;
    check_size("x", x.size(), N * config().dim);
    V41LayerCapture cap;
    cap.layer = layer;
    const std::vector<double> in = doubles(x);
    const FullCaptures all(*this);
    cap.ffn_out = model_.moe(layer, in, N, cap);
    return capture_dict(cap, config(), N);
  }
  // sparse_attn alone on q [N, H, head_dim], kv rows and index lists [N, k]: [N, H, head_dim].
  py::object attention_core(int64_t layer, const Doubles& q, const Doubles& kv, const Ints& idx) {
    check_layer(layer);
    const int64_t H = config().n_heads, hd = config().head_dim, N = q.size() / (H * hd);
    check_size("q", q.size(), N * H * hd);
    const std::vector<int64_t> wide = ints(idx);
    const std::vector<int32_t> lists(wide.begin(), wide.end());
    return array_of(model_.attention_core(layer, doubles(q), doubles(kv), lists, N), {N, H, hd});
  }
  // The attention's output projection alone on sparse_attn's output o [N, H, head_dim]: [N, dim].
  py::object attention_output(int64_t layer, const Doubles& o) {
    check_layer(layer);
    const int64_t H = config().n_heads, hd = config().head_dim, N = o.size() / (H * hd);
    check_size("o", o.size(), N * H * hd);
    return array_of(model_.attention_output(layer, doubles(o), N), {N, config().dim});
  }
  // The final collapse with the last block's ffn_pre, norm and head.
  py::dict head(const Doubles& streams, const Doubles& pre_mix) {
    const int64_t N = pre_mix.size() / config().hc_mult;
    check_size("streams", streams.size(), N * config().hc_mult * config().dim);
    V41ForwardResult r;
    model_.head(doubles(streams), doubles(pre_mix), N, r);
    return result_dict(r, config());
  }
  py::dict head_collapsed(const Doubles& collapsed) {
    const int64_t N = collapsed.size() / config().dim;
    check_size("collapsed", collapsed.size(), N * config().dim);
    V41ForwardResult r;
    model_.head_collapsed(doubles(collapsed), N, r);
    return result_dict(r, config());
  }
  std::vector<int64_t> layer_hash_ids(int64_t layer, const std::vector<int64_t>& tokens) const {
    const V41Plan& p = model_.plan();
    if (!p[layer].engram) return {};
    const auto at = std::find(p.engram_layers.begin(), p.engram_layers.end(), layer);
    const int64_t index = at - p.engram_layers.begin(), N = static_cast<int64_t>(tokens.size());
    return model_.engram_layer_hash_ids(model_.engram_hash_ids(tokens, hashing_), N, index);
  }

 private:
  // A layer or sublayer run alone shows everything it computed, whatever a prefill keeps.
  struct FullCaptures {
    explicit FullCaptures(Reference& r) : r(r) { r.model_.set_captures(true); }
    ~FullCaptures() { r.model_.set_captures(r.captures_); }
    Reference& r;
  };

  void check_token(int64_t t) const {
    if (t < 0 || t >= config().vocab_size)
      throw InputError(fmt::format("tokens: {} is outside [0, {})", t, config().vocab_size));
  }
  std::vector<int64_t> checked(const Ints& tokens) const {
    if (tokens.ndim() != 1 || tokens.size() < 1) throw InputError("tokens: want a non-empty 1-D array of token ids");
    std::vector<int64_t> t = ints(tokens);
    for (int64_t x : t) check_token(x);
    return t;
  }
  void check_layer(int64_t layer) const {
    if (layer < 0 || layer >= config().n_layers)
      throw InputError(fmt::format("layer: {} is outside [0, {})", layer, config().n_layers));
  }
  static void check_size(const char* what, py::ssize_t got, int64_t want) {
    if (got != want) throw InputError(fmt::format("{}: {} values, want {}", what, got, want));
  }

  V41Checkpoint ck_;
  V41Model model_;
  V41EngramHashing hashing_;
  std::string digest_;
  V41DecodeState state_;
  bool captures_ = true;
};

V41Config config_named(const std::string& name) {
  if (is_v41_builtin(name)) return v41_builtin_config(name);
  if (std::filesystem::is_directory(name)) {
    V41Config c = load_v41_checkpoint_config(name);
    c.name = name;
    return c;
  }
  throw InputError(fmt::format("config {}: not a v41 built-in ({}) nor a checkpoint folder", name,
                               fmt::join(v41_builtin_names(), ", ")));
}

py::dict agreement_dict(const V41TensorAgreement& r) {
  py::dict o;
  o["pass"] = r.pass;
  o["layer"] = r.layer;
  o["kind"] = r.kind;
  o["n"] = r.n;
  o["equal"] = r.equal;
  o["bitwise"] = r.bitwise();
  o["max_abs"] = r.max_abs;
  o["max_ref"] = r.max_ref;
  o["max_ulp16"] = r.max_ulp16;
  o["max_ulp32"] = r.max_ulp32;
  o["where"] = r.where;
  o["notes"] = r.notes;
  o["failure"] = r.failure;
  o["budget"] = r.bound_model.empty() ? v41_budget_reason(r.kind) : "derived bounds (" + r.bound_model + ")";
  return o;
}

// What an engine showed of one of its passes (a dict of arrays or None, names as in docs/v41.md §9.3) as a
// capture: every name it holds read; the rest left empty (not shown, not judged).
V41LayerCapture capture_from(const py::object& d) {
  V41LayerCapture c;
  if (d.is_none()) return c;
  const py::dict m = d.cast<py::dict>();
  auto reals = [&](const char* name, std::vector<double>& to) {
    if (m.contains(name) && !m[name].is_none()) to = doubles(m[name].cast<Doubles>());
  };
  auto whole = [&](const char* name, auto& to) {
    if (!m.contains(name) || m[name].is_none()) return;
    const std::vector<int64_t> v = ints(m[name].cast<Ints>());
    to.assign(v.begin(), v.end());
  };
  for (auto [name, to] : std::initializer_list<std::pair<const char*, std::vector<double>*>>{
           {"engram_in", &c.engram_in}, {"in", &c.in}, {"pre_mix", &c.pre_mix}, {"attn_pre", &c.attn_pre},
           {"attn_post", &c.attn_post}, {"attn_comb", &c.attn_comb}, {"ffn_pre", &c.ffn_pre}, {"ffn_post", &c.ffn_post},
           {"ffn_comb", &c.ffn_comb}, {"index_score", &c.index_score}, {"compress_kv", &c.compress_kv}, {"index_k", &c.index_k},
           {"attn_x", &c.attn_x}, {"attn_out", &c.attn_out}, {"ffn_x", &c.ffn_x}, {"ffn_out", &c.ffn_out}, {"latent", &c.latent},
           {"attn_q", &c.attn_q}, {"attn_kv", &c.attn_kv}, {"attn_o", &c.attn_o}, {"expert_weights", &c.expert_weights},
           {"out", &c.out}})
    reals(name, *to);
  whole("hash_ids", c.hash_ids);
  whole("topk_idxs", c.topk_idxs);
  whole("candidates", c.candidates);
  whole("attn_idx", c.attn_idx);
  whole("experts", c.experts);
  return c;
}

std::vector<double> doubles_at(const py::dict& d, const char* name) {
  return d.contains(name) ? doubles_or_empty(d[name]) : std::vector<double>{};
}

}  // namespace

void bind_v41(py::module_& m) {
  m.def("v41_builtin_names", [] { return v41_builtin_names(); });
  m.def("v41_config", [](const std::string& name) { return config_dict(config_named(name)); },
        "A v41 built-in or checkpoint folder's config: {name, json (the flat inference/config.json text)}.");
  m.def("v41_plan", [](const std::string& name) {
    const V41Config c = config_named(name);
    const V41Plan p = make_v41_plan(c);
    py::list layers;
    for (const v41::LayerPlan& lp : p.layers)
      layers.append(py::dict(py::arg("layer") = lp.layer, py::arg("ratio") = lp.ratio,
                             py::arg("role") = role_name(lp.role), py::arg("kv_src") = lp.kv_src,
                             py::arg("idx_src") = lp.idx_src, py::arg("candidate_source") = lp.candidate_source,
                             py::arg("owns_compressor") = lp.owns_compressor, py::arg("owns_indexer") = lp.owns_indexer,
                             py::arg("owns_index_k") = lp.owns_index_k, py::arg("engram") = lp.engram));
    return py::dict(py::arg("L") = p.L, py::arg("E") = p.E, py::arg("W") = p.W, py::arg("layers") = layers,
                    py::arg("hc_mult") = c.hc_mult, py::arg("dim") = c.dim, py::arg("head_dim") = c.head_dim, py::arg("vocab_size") = c.vocab_size,
                    py::arg("window_size") = c.window_size);
  });
  m.def("v41_conventions", [] {
    py::list out;
    for (const auto& c : v41_replay_conventions())
      out.append(py::dict(py::arg("name") = c.name, py::arg("all_layers") = c.all_layers,
                          py::arg("floor_first_layer") = c.floor_first_layer,
                          py::arg("speculative_tail") = c.speculative_tail, py::arg("source") = c.source));
    return out;
  });
  m.def("v41_encoder_replay_rules", [] {
    py::list out;
    for (const auto& r : v41_encoder_replay_rules()) out.append(r.name);
    return out;
  });
  m.def("v41_spans", [](const std::string& config, const std::string& convention, int64_t speculative) {
    const V41Plan p = make_v41_plan(config_named(config));
    const V41ReplayConvention& c = v41_replay_convention(convention);
    return py::dict(py::arg("exact") = v41_exact_span(p, c), py::arg("decode") = v41_exact_decode_span(p, c),
                    py::arg("bounded") = v41_bounded_tail(p, c, speculative), py::arg("window") = p.W);
  });
  m.def("v41_tokens", [](const std::string& config, int64_t n, uint64_t seed) {
    const V41Config c = config_named(config);
    if (n < 1) throw InputError(fmt::format("tokens: {} tokens; want at least 1", n));
    const std::vector<int32_t> t = make_tokens(seed, c.vocab_size, n);
    return array_of<int32_t, int64_t>(t, {n});
  }, "The first n tokens of the harness's token stream for a seed (as `ced run --tokens n --token-seed s`).");
  m.def("v41_export", [](const std::string& config, uint64_t weight_seed, const std::string& out, int64_t shard_bytes,
                         const std::vector<std::string>& boost) {
    const V41Config c = config_named(config);
    check_v41_fits_in_memory(c);
    V41Checkpoint ck = make_v41_random_checkpoint(c, weight_seed);
    for (const auto& b : boost) apply_v41_boost(ck, b);
    V41WriteOptions w;
    if (shard_bytes > 0) w.shard_bytes = shard_bytes;
    write_v41_checkpoint(out, ck, w);
    return v41_weights_digest(ck.weights);
  }, "`ced export --config C --weight-seed S --out DIR`: a release-layout folder; returns its weights digest.");

  py::class_<Reference>(m, "V41Reference", "The v41 reference on a checkpoint folder, under a regime.")
      .def(py::init([](const std::string& checkpoint, const std::string& regime) {
             V41Checkpoint ck = read_v41_checkpoint(checkpoint);
             ck.config.name = checkpoint;
             return std::make_unique<Reference>(std::move(ck), regime);
           }),
           py::arg("checkpoint"), py::arg("regime") = "release")
      .def_property_readonly("digest", &Reference::digest)
      .def_property_readonly("config", [](const Reference& r) { return config_dict(r.config()); })
      .def("set_fault", [](Reference& r, const std::string& f) { r.model().set_fault(v41_fault_from_name(f)); })
      .def("set_options", [](Reference& r, const std::string& ties, const std::string& scores,
                             const std::string& decode_index_k) {
        r.model().set_options({v41_topk_ties_from_name(ties), v41_index_scores_from_name(scores),
                               v41_decode_index_k_from_name(decode_index_k)});
      })
      .def("set_captures", &Reference::set_captures)
      .def("prefill", &Reference::prefill)
      .def("prefill_ced", &Reference::prefill_ced)
      .def("resume", &Reference::resume)
      .def("decode", &Reference::decode)
      .def("run_layer", &Reference::run_layer)
      .def("attention", &Reference::attention)
      .def("moe", &Reference::moe)
      .def("attention_core", &Reference::attention_core)
      .def("attention_output", &Reference::attention_output)
      .def("head", &Reference::head)
      .def("head_collapsed", &Reference::head_collapsed)
      .def("layer_hash_ids", [](const Reference& r, int64_t layer, const Ints& tokens) {
        const std::vector<int64_t> ids = r.layer_hash_ids(layer, ints(tokens));
        return array_of<int64_t>(ids, {tokens.size(), -1});
      });
  m.def("v41_faults", [] { return v41_fault_names(); });

  m.def("v41_read_run_file", [](const std::string& path) {
    const V41RunFile f = read_v41_run_file(path);
    py::dict o;
    o["generator"] = f.generator;
    o["config"] = config_dict(f.config);
    o["regime"] = v41_regime_name(f.regime);
    o["weights_digest"] = f.weights_digest;
    o["weight_seed"] = f.weight_seed ? py::cast(*f.weight_seed) : py::none();
    o["provenance"] = f.provenance;
    o["tokens"] = array_of<int64_t>(f.tokens, {static_cast<py::ssize_t>(f.tokens.size())});
    o["request"] = request_dict(f.request);
    o["result"] = result_dict(f.result, f.config);
    if (f.decode) {
      py::dict d;
      d["tokens"] = array_of<int64_t>(f.decode->tokens, {static_cast<py::ssize_t>(f.decode->tokens.size())});
      py::list seed, steps;
      for (const auto& l : f.decode->seed) seed.append(cache_dict(l, f.config));
      for (const auto& s : f.decode->steps) steps.append(result_dict(s, f.config));
      d["seed"] = seed;
      d["steps"] = steps;
      o["decode"] = d;
    } else {
      o["decode"] = py::none();
    }
    return o;
  }, "A v41 run file (docs/v41.md §12), read strictly: every capture as arrays, absent ones None.");
  m.def("v41_loaded_digests", [](const std::string& folder) {
    const V41Checkpoint ck = read_v41_checkpoint(folder);
    py::list out;
    for (const V41TensorDigest& d : v41_loaded_digests(ck)) out.append(py::make_tuple(d.name, d.digest));
    return out;
  }, "The canonical digest of every weight of a checkpoint folder and of its config switches (docs/v41.md §12.9).");
  m.def("v41_tensor_digest", [](const py::array_t<float, py::array::c_style | py::array::forcecast>& values,
                                const std::vector<int64_t>& shape) {
    return v41_tensor_digest(std::span<const float>(values.data(), static_cast<size_t>(values.size())), shape);
  }, py::arg("values"), py::arg("shape"),
     "FNV-1a 64 of the shape (int64s) and the float32 values, row-major (docs/v41.md §12.9's canonical form).");
  m.def("v41_stress_prompts", [](const std::string& config, int64_t n) {
    const V41Config c = config_named(config);
    py::list out;
    for (const V41StressPrompt& s : v41_stress_prompts(c, make_v41_plan(c), n))
      out.append(py::make_tuple(s.name, array_of<int64_t>(s.tokens, {static_cast<py::ssize_t>(s.tokens.size())}), s.why));
    return out;
  }, "The prompts that make ties likely (docs/v41.md §13.12): (name, ids, why) of n tokens each (one for 'single').");
  m.def("v41_config_switches", [](const std::string& config) {
    py::list out;
    for (const auto& [k, v] : v41_config_switches(config_named(config))) out.append(py::make_tuple(k, v));
    return out;
  }, "The config's switches a port's loaded digests report as config.KEY (docs/v41.md §12.9).");
  m.def("v41_diff", [](const std::string& a, const std::string& b, const std::string& checkpoint, bool verbose) {
    V41DiffReport r;
    {
      py::gil_scoped_release nogil;
      r = v41_diff({a, b, checkpoint, verbose});
    }
    return py::make_tuple(r.pass, r.text);
  }, py::arg("a"), py::arg("b"), py::arg("checkpoint") = "", py::arg("verbose") = false,
     "`ced diff A B` on two v41 run files (docs/v41.md §12.7, §12.8): (passed, the report's text).");
  m.def("v41_is_run_file", [](const std::string& path) { return is_untrusted_v41_run_file(path); },
        "Whether a file's /format is the v41 run file's (probed in a child process).");
  // The inverse of v41_read_run_file for a prefill: what a port's engine captured, in the layout ced diff and
  // ced gate read. The result dict holds logits [N, vocab] and, where the engine has them, final_collapsed,
  // final_normed and layers (capture dicts, names as in docs/v41.md §9.3; absent or None: not written).
  m.def("v41_write_run_file", [](const std::string& path, const std::string& config, const std::string& regime,
                                 const Ints& tokens, const py::dict& result, const std::string& generator,
                                 const std::string& weights_digest, std::optional<uint64_t> weight_seed,
                                 const std::map<std::string, std::string>& provenance, const py::object& request) {
    V41RunFile f;
    f.generator = generator;
    f.config = config_named(config);
    f.regime = v41_regime_from_name(regime);
    f.weights_digest = weights_digest;
    f.weight_seed = weight_seed;
    // A built-in's random weights of a named seed are known: their digest, as ced run records it.
    if (f.weights_digest.empty() && weight_seed && is_v41_builtin(config))
      f.weights_digest = v41_weights_digest(make_v41_random_checkpoint(f.config, *weight_seed).weights);
    f.provenance = provenance;
    f.tokens = ints(tokens);
    V41ForwardResult& r = f.result;
    r.N = static_cast<int64_t>(f.tokens.size());
    r.first_row = result.contains("first_row") ? result["first_row"].cast<int64_t>() : 0;
    if (!request.is_none()) f.request = request_from(request.cast<py::dict>());
    if ((r.first_row != 0) && f.request.mode == "full")
      throw InputError("first_row: a full prefill's logits start at row 0 (a ced or resume run names its mode in request=)");
    r.logits = doubles_at(result, "logits");
    r.final_collapsed = doubles_at(result, "final_collapsed");
    r.final_normed = doubles_at(result, "final_normed");
    if (result.contains("layers") && !result["layers"].is_none()) {
      int64_t l = 0;
      for (const py::handle& d : result["layers"].cast<py::list>()) {
        V41LayerCapture cap = capture_from(py::reinterpret_borrow<py::object>(d));
        cap.layer = l++;
        const py::dict m = py::reinterpret_borrow<py::object>(d).cast<py::dict>();
        if (m.contains("first_row") && !m["first_row"].is_none()) cap.first_row = m["first_row"].cast<int64_t>();
        if (cap.first_row < 0 || cap.first_row >= r.N)
          throw InputError(fmt::format("layer {}: first_row {} is outside [0, N = {})", cap.layer, cap.first_row, r.N));
        const int64_t rows = r.N - cap.first_row;
        if (!cap.topk_idxs.empty() && rows > 0) cap.topk = static_cast<int64_t>(cap.topk_idxs.size()) / rows;
        r.layers.push_back(std::move(cap));
      }
    }
    write_v41_run_file(path, f);
  }, py::arg("path"), py::arg("config"), py::arg("regime"), py::arg("tokens"), py::arg("result"),
     py::arg("generator"), py::arg("weights_digest") = "", py::arg("weight_seed") = py::none(),
     py::arg("provenance") = std::map<std::string, std::string>{}, py::arg("request") = py::none(),
     "Writes a v41 run file (docs/v41.md §12) of one prefill, atomically; the reader's checks apply to what it reads.");

  m.def("v41_judge_values", [](const std::string& pass, int64_t layer, const std::string& kind, const Doubles& ours,
                               const Doubles& official, const std::string& at, int64_t row_len) {
    V41TensorAgreement r;
    r.pass = pass;
    r.layer = layer;
    r.kind = kind;
    v41_compare_values(r, doubles(ours), doubles(official), at, row_len);
    v41_judge(r);
    return agreement_dict(r);
  }, "One tensor against the official's, judged by its kind's budget (docs/v41.md §12.4).");
  m.def("v41_judge_router", [](const Reference& ref, const std::string& pass, int64_t layer, const Doubles& ffn_x,
                               const Ints& ours_experts, const Doubles& ours_weights, const Ints& official_experts,
                               const Doubles& official_weights, const std::string& at) -> py::object {
    if (ref.model().regime() == V41Regime::f64) return py::none();  // its budgets judge (docs/sound-bounds.md §7)
    const int64_t D = ref.model().config().dim;
    if (ffn_x.size() % D != 0) throw InputError(fmt::format("router: ffn_x has {} values, not rows of {}", ffn_x.size(), D));
    V41TensorAgreement e, w;
    e.pass = w.pass = pass;
    e.layer = w.layer = layer;
    e.kind = "experts (forced x)";
    w.kind = "expert_weights (forced x)";
    const bool weights = official_weights.size() > 0 && ours_weights.size() > 0;
    if (!v41_judge_router(ref.model(), layer, doubles(ffn_x), ffn_x.size() / D, ints(ours_experts), doubles(ours_weights),
                          ints(official_experts), doubles(official_weights), {}, at, e, weights ? &w : nullptr))
      return py::none();
    return py::make_tuple(agreement_dict(e), weights ? py::object(agreement_dict(w)) : py::none());
  }, "The router on the official's MoE input judged by derived bounds (docs/sound-bounds.md §9): (experts, "
     "weights) rows, weights None without both sides' weights; None for a router the bounds do not cover.");
  m.def("v41_judge_head", [](const Reference& ref, const std::string& pass, const Doubles& collapsed,
                             const Doubles& ours_logits, const Doubles& official_logits) -> py::object {
    if (ref.model().regime() == V41Regime::f64) return py::none();
    const V41Config& c = ref.model().config();
    if (collapsed.size() % c.dim != 0) throw InputError(fmt::format("head: {} values, not rows of {}", collapsed.size(), c.dim));
    V41TensorAgreement r;
    r.pass = pass;
    r.kind = "logits (forced collapsed)";
    v41_judge_head_collapsed(ref.model(), doubles(collapsed), collapsed.size() / c.dim, doubles(ours_logits),
                             doubles(official_logits), {}, "", r);
    return py::object(agreement_dict(r));
  }, "The head's logits on the official's final collapse judged by derived bounds (the final norm's admissible "
     "values chained into the projection: docs/sound-bounds.md §5-§7); None in the f64 regime.");
  m.def("v41_judge_rows", [](const std::string& pass, int64_t layer, const std::string& kind, const Ints& ours,
                             const Ints& official, int64_t rows, const Doubles& scores, int64_t offset) {
    V41TensorAgreement r;
    r.pass = pass;
    r.layer = layer;
    r.kind = kind;
    v41_compare_rows(r, ints(ours), ints(official), rows, doubles(scores), offset);
    v41_judge(r);
    return agreement_dict(r);
  }, "Index lists row by row against the official's, judged by their kind's budget.");
  m.def("v41_judge_teacher_forced", [](const Reference& ref, const std::string& golden, const py::function& layer) {
    const V41RunFile off = read_v41_run_file(golden);
    const V41Config& c = ref.model().config();
    const int64_t N = off.result.N;
    const V41Agreement a = v41_agreement_forced(ref.model(), off, [&](int64_t l, const V41SharedAttention& before) {
      const py::dict d = layer(l, shared_dict(before, c, N)).cast<py::dict>();
      V41ForcedLayer f;
      if (d.contains("hash_ids") && !d["hash_ids"].is_none()) f.hash_ids = ints(d["hash_ids"].cast<Ints>());
      f.block = capture_from(d.contains("block") ? py::object(d["block"]) : py::none());
      f.attention = capture_from(d.contains("attention") ? py::object(d["attention"]) : py::none());
      f.moe = capture_from(d.contains("moe") ? py::object(d["moe"]) : py::none());
      f.attn_out = doubles_at(d, "attn_out");
      f.attn_o = doubles_at(d, "attn_o");
      f.attn_out_of_o = doubles_at(d, "attn_out_of_o");
      f.ffn_out = doubles_at(d, "ffn_out");
      return f;
    });
    py::list rows;
    for (const V41TensorAgreement& r : a.rows) rows.append(agreement_dict(r));
    return rows;
  }, "The C++ gate's teacher-forced pass (docs/v41.md §12.4, docs/sound-bounds.md) with an engine as the side "
     "under test: layer(l, shared) returns what it computed of layer l on the golden file's inputs (a dict: block, "
     "attention, moe captures, attn_out, attn_o, attn_out_of_o, ffn_out, hash_ids; None or absent: not shown, not "
     "judged). Every kind judged by the bounds the C++ gate uses; its rows as dicts.");
  m.def("v41_budget_kinds", [] { return v41_budget_kinds(); });
}
