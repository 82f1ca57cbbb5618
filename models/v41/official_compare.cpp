// docs/v41.md §9.4: a test-only driver that runs our prefill on the weights the official oracle
// generated and compares it with the oracle's capture (scripts/v41_official_capture.py's file), end to
// end and layer by layer with teacher forcing. It reports; it does not judge (exit 0 after a report,
// 2 on bad input). Run through scripts/v41-official-compare.sh.
//   v41_official_compare --config v41-tiny --weights W.safetensors --capture C.safetensors [--regime bf16]
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "models/v41/forward.hpp"
#include "models/v41/forward_ops.hpp"

namespace {

using namespace ced;
using namespace ced::v41;

// Per tensor kind: how far ours is from the official, in value, in bf16 and fp32 ulps, and bitwise.
struct Stat {
  int64_t n = 0, equal = 0;
  double max_abs = 0, max_ref = 0, max_ulp16 = 0, max_ulp32 = 0;
  std::string where;
};

// |d| in units of the spacing of bf16 (8 significant bits) or fp32 (24) at the official value
// (normal spacing; below the smallest normal, the subnormal step).
double ulps(double d, double ref, int bits) {
  int e = 0;
  std::frexp(std::max(std::fabs(ref), 0x1p-126), &e);
  return d / std::ldexp(1.0, e - bits);
}

struct Report {
  std::map<std::string, Stat> stats;
  std::vector<std::string> notes;

  void add(const std::string& kind, std::span<const double> ours, std::span<const double> ref, const std::string& at) {
    Stat& s = stats[kind];
    if (ours.size() != ref.size()) {
      notes.push_back(fmt::format("{} {}: {} values here, {} in the capture", kind, at, ours.size(), ref.size()));
      return;
    }
    for (size_t i = 0; i < ours.size(); ++i) {
      const double o = ours[i], r = ref[i];
      ++s.n;
      if (std::bit_cast<uint32_t>(static_cast<float>(o)) == std::bit_cast<uint32_t>(static_cast<float>(r))) ++s.equal;
      const double d = std::fabs(o - r);
      if (d > s.max_abs || std::isnan(d)) {
        s.max_abs = d;
        s.where = fmt::format("{}[{}] ours {:.9g} official {:.9g}", at, i, o, r);
      }
      s.max_ref = std::max(s.max_ref, std::fabs(r));
      s.max_ulp16 = std::max(s.max_ulp16, ulps(d, r, 8));
      s.max_ulp32 = std::max(s.max_ulp32, ulps(d, r, 24));
    }
  }

  void print(const std::string& title) const {
    fmt::print("\n== {}\n{:<28} {:>9} {:>10} {:>11} {:>9} {:>11} {:>9}  {}\n", title, "kind", "values", "bitwise",
               "max |d|", "max ulp16", "max ulp32", "max |ref|", "where the max |d| is");
    for (const auto& [k, s] : stats)
      fmt::print("{:<28} {:>9} {:>9.5f} {:>11.3g} {:>9.3g} {:>11.4g} {:>9.3g}  {}\n", k, s.n,
                 s.n ? static_cast<double>(s.equal) / static_cast<double>(s.n) : 0.0, s.max_abs, s.max_ulp16,
                 s.max_ulp32, s.max_ref, s.max_abs > 0 ? s.where : "");
    for (const auto& n : notes) fmt::print("  {}\n", n);
  }
};

struct Capture {
  SafetensorsFile f;
  bool has(const std::string& k) const { return f.find(k) != nullptr; }
  std::vector<double> get(const std::string& k) const {
    const SafetensorsTensor* t = f.find(k);
    if (!t) throw InputError("capture: no tensor " + k);
    return safetensors_values(*t);
  }
  std::vector<int64_t> ints(const std::string& k) const {
    auto v = get(k);
    return {v.begin(), v.end()};
  }
};

// Selections: rows whose index sets differ, and for each such row the positions only one side has,
// with our score of each and our k-th score (a near-tie when they are equal or one bf16 ulp apart).
void compare_topk(Report& rep, const std::string& kind, const V41LayerCapture& cap, const std::vector<int64_t>& ref,
                  int64_t N) {
  const int64_t k = cap.topk;
  if (static_cast<int64_t>(ref.size()) != N * k) {
    rep.notes.push_back(fmt::format("{}: {} indices here, {} in the capture", kind, N * k, ref.size()));
    return;
  }
  int64_t differ = 0;
  const int64_t T = k ? static_cast<int64_t>(cap.index_score.size()) / N : 0;
  for (int64_t t = 0; t < N; ++t) {
    std::set<int64_t> a, b;
    for (int64_t j = 0; j < k; ++j) {
      a.insert(cap.topk_idxs[static_cast<size_t>(t * k + j)]);
      b.insert(ref[static_cast<size_t>(t * k + j)]);
    }
    std::vector<int32_t> ours_sorted(cap.topk_idxs.begin() + t * k, cap.topk_idxs.begin() + (t + 1) * k);
    if (a == b && std::equal(ours_sorted.begin(), ours_sorted.end(), ref.begin() + t * k)) continue;
    ++differ;
    std::string only;
    auto score = [&](int64_t idx) {
      return idx < 0 ? std::string("-") : fmt::format("{:.6g}", cap.index_score[static_cast<size_t>(t * T + idx - N)]);
    };
    for (int64_t x : a)
      if (!b.count(x)) only += fmt::format(" ours-only {} (score {})", x, score(x));
    for (int64_t x : b)
      if (!a.count(x)) only += fmt::format(" official-only {} (score {})", x, score(x));
    if (a == b) only = " same set, another order";
    rep.notes.push_back(fmt::format("{} query {}:{}", kind, t, only));
  }
  Stat& s = rep.stats[kind];
  s.n += N;
  s.equal += N - differ;
}

std::vector<double> slice(const std::vector<double>& v, size_t from, size_t n) {
  return {v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(from + n)};
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> opt{{"--regime", "bf16"}};
  for (int i = 1; i + 1 < argc; i += 2) opt[argv[i]] = argv[i + 1];
  for (const char* need : {"--config", "--weights", "--capture"})
    if (!opt.count(need)) throw InputError(fmt::format("v41_official_compare: {} is required", need));
  const V41Config config = v41_builtin_config(opt["--config"]);
  const V41Regime regime = v41_regime_from_name(opt["--regime"]);
  Capture cap{read_safetensors(opt["--capture"])};
  const SafetensorsFile weights = read_safetensors(opt["--weights"]);

  // The config the oracle ran, against the built-in.
  nlohmann::json margs = nlohmann::json::parse(cap.f.metadata.at("meta"))["model_args"];
  for (const char* per_run : {"max_batch_size", "max_seq_len", "temperature"}) margs.erase(per_run);
  const V41Config official = parse_v41_flat_json(margs.dump(), "the oracle's ModelArgs");
  const auto dis = v41_config_disagreements(config, official);
  fmt::print("config {} vs the oracle's ModelArgs: {}\n", config.name, dis.empty() ? "no difference" : "");
  for (const auto& d : dis) fmt::print("  {}\n", d);

  const V41Model model(config, weights, regime);
  const std::vector<int64_t> tokens = cap.ints("input_ids");
  const int64_t N = static_cast<int64_t>(tokens.size());
  V41EngramHashing hashing;
  if (!config.engram_layer_ids.empty()) {
    hashing.token_map = cap.ints("engram_token_map");
    const auto hi = cap.ints("engram_multipliers_hi"), lo = cap.ints("engram_multipliers_lo");
    const size_t ng = static_cast<size_t>(config.engram_max_ngram_size);
    for (size_t l = 0; l < config.engram_layer_ids.size(); ++l) {
      std::vector<int64_t> m;
      for (size_t s = 0; s < ng; ++s)
        m.push_back(static_cast<int64_t>((static_cast<uint64_t>(hi[l * ng + s]) << 32) |
                                         (static_cast<uint64_t>(lo[l * ng + s]) & 0xFFFFFFFFu)));
      hashing.multipliers.push_back(m);
    }
    const auto ours = v41_engram_multipliers(config);
    fmt::print("engram multipliers: ours (NumPy's default_rng, ported) {} engram.py's\n",
               ours == hashing.multipliers ? "equal" : "DIFFER from");
    hashing.multipliers = ours;
  }
  fmt::print("regime {}, N = {}, prompt from the capture\n", v41_regime_name(regime), N);

  // The rotary tables.
  {
    Report rep;
    const fwd::Arith a(regime);
    for (const auto& [kind, yarn] : {std::pair{"swa", false}, std::pair{"compressed", true}}) {
      const auto t = fwd::rope_table(a, config.rope_head_dim, N, yarn ? config.original_seq_len : 0,
                                     yarn ? config.compress_rope_theta : config.rope_theta, config.rope_factor,
                                     config.beta_fast, config.beta_slow);
      rep.add(fmt::format("rope_{}_cos", kind), t.cos, cap.get(fmt::format("rope_{}_cos", kind)), "");
      rep.add(fmt::format("rope_{}_sin", kind), t.sin, cap.get(fmt::format("rope_{}_sin", kind)), "");
    }
    rep.print("rotary tables (precompute_freqs_cis)");
  }

  auto layer_key = [](int64_t l, const char* what) { return fmt::format("layer{}_{}", l, what); };
  // What the official passed into layer l (before its Engram when it has one).
  auto official_input = [&](int64_t l) {
    return cap.get(layer_key(l, model.plan()[l].engram ? "engram_in" : "in"));
  };
  auto compare_layer = [&](Report& rep, const V41LayerCapture& c, const std::string& tag) {
    const int64_t l = c.layer;
    const LayerPlan& lp = model.plan()[l];
    if (lp.engram) {
      std::vector<double> hid(c.hash_ids.begin(), c.hash_ids.end());
      rep.add("engram hash ids", hid, cap.get(layer_key(l, "engram_hash_ids")), fmt::format("{} layer {}", tag, l));
    }
    rep.add(fmt::format("layer{} in", l), c.in, cap.get(layer_key(l, "in")), tag);
    rep.add(fmt::format("layer{} pre_mix", l), c.pre_mix, cap.get(layer_key(l, "pre_mix")), tag);
    for (const auto& [what, v] : {std::pair{"attn_x", &c.attn_x}, std::pair{"attn_out", &c.attn_out},
                                  std::pair{"ffn_x", &c.ffn_x}, std::pair{"ffn_out", &c.ffn_out}})
      if (cap.has(layer_key(l, what)) && !v->empty())
        rep.add(fmt::format("layer{} {}", l, what), *v, cap.get(layer_key(l, what)), tag);
    for (const auto& [what, v] : {std::pair{"attn_q", &c.attn_q}, std::pair{"attn_kv", &c.attn_kv},
                                  std::pair{"attn_o", &c.attn_o}})
      if (cap.has(layer_key(l, what)) && !v->empty())
        rep.add(fmt::format("layer{} {}", l, what), *v, cap.get(layer_key(l, what)), tag);
    if (cap.has(layer_key(l, "attn_idx"))) {
      std::vector<double> ours(c.attn_idx.begin(), c.attn_idx.end());
      rep.add(fmt::format("layer{} attn_idx", l), ours, cap.get(layer_key(l, "attn_idx")), tag);
    }
    if (!c.latent.empty() && cap.has(layer_key(l, "latent")))
      rep.add(fmt::format("layer{} latent", l), c.latent, cap.get(layer_key(l, "latent")), tag);
    if (!c.experts.empty() && cap.has(layer_key(l, "gate_experts"))) {
      std::vector<double> e(c.experts.begin(), c.experts.end());
      rep.add(fmt::format("layer{} gate experts", l), e, cap.get(layer_key(l, "gate_experts")), tag);
      rep.add(fmt::format("layer{} gate weights", l), c.expert_weights, cap.get(layer_key(l, "gate_weights")), tag);
    }
    if (lp.owns_indexer && cap.has(layer_key(l, "topk_idxs")))
      compare_topk(rep, fmt::format("layer{} topk (rows equal)", l), c, cap.ints(layer_key(l, "topk_idxs")), N);
    if (lp.owns_compressor && cap.has(layer_key(l, "compress_kv")))
      rep.add(fmt::format("layer{} compress_kv", l), c.compress_kv, cap.get(layer_key(l, "compress_kv")), tag);
    if (lp.owns_index_k && cap.has(layer_key(l, "index_k")))
      rep.add(fmt::format("layer{} index_k", l), c.index_k, cap.get(layer_key(l, "index_k")), tag);
    if (lp.candidate_source && cap.has(layer_key(l, "candidates"))) {
      std::vector<double> ours(c.candidates.begin(), c.candidates.end());
      rep.add(fmt::format("layer{} candidates", l), ours, cap.get(layer_key(l, "candidates")), tag);
    }
  };

  // End to end.
  {
    Report rep;
    const V41ForwardResult r = model.forward(tokens, hashing);
    for (const auto& c : r.layers) compare_layer(rep, c, "end to end");
    rep.add("final_collapsed", r.final_collapsed, cap.get("final_collapsed"), "");
    rep.add("final_normed", r.final_normed, cap.get("final_normed"), "");
    rep.add("logits (every position)", r.logits, cap.get("logits"), "");
    const size_t V = static_cast<size_t>(config.vocab_size);
    rep.add("logits (last, official run)", slice(r.logits, (static_cast<size_t>(N) - 1) * V, V), cap.get("logits_last"), "");
    rep.print("end to end (our own streams throughout)");
  }

  // Teacher forced: every layer fed the official's input streams and pre_mix; after a source layer
  // the official's published caches and selection replace ours, so a flip stays in its layer.
  {
    Report rep;
    V41SharedAttention shared;
    const int64_t L = config.n_layers;
    for (int64_t l = 0; l < L; ++l) {
      const LayerPlan& lp = model.plan()[l];
      std::vector<int64_t> ids;
      if (lp.engram) ids = cap.ints(layer_key(l, "engram_hash_ids"));
      V41SharedAttention before = shared;
      const V41LayerCapture c = model.run_layer(l, official_input(l), cap.get(layer_key(l, "pre_mix")), N, ids, shared);
      const std::string tag = fmt::format("teacher-forced layer {}", l);
      compare_layer(rep, c, tag);
      // Each sublayer alone on the official's sublayer input.
      V41LayerCapture sa, sm;
      const auto ao = model.attention(l, cap.get(layer_key(l, "attn_x")), N, before, sa);
      rep.add(fmt::format("layer{} attn_out (forced x)", l), ao, cap.get(layer_key(l, "attn_out")), tag);
      for (const auto& [what, v] : {std::pair{"attn_q", &sa.attn_q}, std::pair{"attn_kv", &sa.attn_kv},
                                    std::pair{"attn_o", &sa.attn_o}})
        if (cap.has(layer_key(l, what)))
          rep.add(fmt::format("layer{} {} (forced x)", l, what), *v, cap.get(layer_key(l, what)), tag);
      const auto mo = model.moe(l, cap.get(layer_key(l, "ffn_x")), N, sm);
      rep.add(fmt::format("layer{} ffn_out (forced x)", l), mo, cap.get(layer_key(l, "ffn_out")), tag);
      std::vector<double> e(sm.experts.begin(), sm.experts.end());
      rep.add(fmt::format("layer{} gate experts (forced x)", l), e, cap.get(layer_key(l, "gate_experts")), tag);
      rep.add(fmt::format("layer{} gate weights (forced x)", l), sm.expert_weights, cap.get(layer_key(l, "gate_weights")), tag);
      if (l + 1 < L) {
        rep.add(fmt::format("layer{} out", l), c.out, official_input(l + 1), tag);
        rep.add(fmt::format("layer{} ffn_pre", l), c.ffn_pre, cap.get(layer_key(l + 1, "pre_mix")), tag);
      } else {
        V41ForwardResult h;
        model.head(c.out, c.ffn_pre, N, h);
        rep.add(fmt::format("layer{} out (collapsed)", l), h.final_collapsed, cap.get("final_collapsed"), tag);
      }
      if (lp.owns_compressor && cap.has(layer_key(l, "compress_kv"))) shared.compress_kv = cap.get(layer_key(l, "compress_kv"));
      if (lp.owns_index_k && cap.has(layer_key(l, "index_k"))) shared.index_k = cap.get(layer_key(l, "index_k"));
      if (lp.owns_indexer && cap.has(layer_key(l, "topk_idxs"))) {
        const auto t = cap.ints(layer_key(l, "topk_idxs"));
        shared.topk_idxs.assign(t.begin(), t.end());
      }
      if (lp.candidate_source && cap.has(layer_key(l, "candidates"))) {
        const auto cd = cap.ints(layer_key(l, "candidates"));
        shared.candidates.assign(cd.begin(), cd.end());
      }
    }
    V41ForwardResult h;
    model.head_collapsed(cap.get("final_collapsed"), N, h);
    rep.add("head: final_normed", h.final_normed, cap.get("final_normed"), "teacher-forced head");
    rep.add("head: logits", h.logits, cap.get("logits"), "teacher-forced head");
    rep.print("teacher forced (each layer fed the official's inputs and published state)");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "v41_official_compare: {}\n", e.what());
    return 2;
  }
}
