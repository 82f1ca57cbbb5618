// docs/v41.md §8.1, §13: the v41 run vocabulary's tables and spans (models/v41/run_types.hpp).
#include "models/v41/run_types.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "model/error.hpp"

namespace ced::v41 {

namespace {
// The one table of regimes (docs/v41.md §8.1): each name with its value.
struct RegimeEntry {
  const char* name;
  V41Regime regime;
};
constexpr RegimeEntry kRegimes[] = {{"f64", V41Regime::f64}, {"bf16", V41Regime::bf16}, {"release", V41Regime::release}};
}  // namespace

const std::vector<std::string>& v41_regime_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& e : kRegimes) n.emplace_back(e.name);
    return n;
  }();
  return names;
}

const char* v41_regime_name(V41Regime r) {
  for (const auto& e : kRegimes)
    if (e.regime == r) return e.name;
  return "?";
}

V41Regime v41_regime_from_name(std::string_view name) {
  for (const auto& e : kRegimes)
    if (name == e.name) return e.regime;
  throw InputError(fmt::format("v41 regime '{}': unknown (known: {})", name, fmt::join(v41_regime_names(), ", ")));
}

V41TopkTies v41_topk_ties_from_name(std::string_view name) {
  if (name == "torch") return V41TopkTies::torch;
  if (name == "lowest-index") return V41TopkTies::lowest_index;
  throw InputError(fmt::format("v41 top-k ties '{}': unknown (known: torch, lowest-index)", name));
}

V41IndexScores v41_index_scores_from_name(std::string_view name) {
  if (name == "bf16") return V41IndexScores::bf16;
  if (name == "fp32") return V41IndexScores::fp32;
  throw InputError(fmt::format("v41 index scores '{}': unknown (known: bf16, fp32)", name));
}

V41DecodeIndexK v41_decode_index_k_from_name(std::string_view name) {
  if (name == "official") return V41DecodeIndexK::official;
  if (name == "owner") return V41DecodeIndexK::owner;
  throw InputError(fmt::format("v41 decode index keys '{}': unknown (known: official, owner)", name));
}

const char* v41_decode_index_k_name(V41DecodeIndexK k) { return k == V41DecodeIndexK::official ? "official" : "owner"; }

const char* v41_topk_ties_name(V41TopkTies t) { return t == V41TopkTies::torch ? "torch" : "lowest-index"; }
const char* v41_index_scores_name(V41IndexScores s) { return s == V41IndexScores::bf16 ? "bf16" : "fp32"; }

const std::vector<std::string>& v41_fault_names() {
  static const std::vector<std::string> names = {"none", "v4-q-norm", "one-rope-theta", "unrotated-compressed-keys",
                                                 "unclamped-shared-expert", "mhc-same-sublayer",
                                                 "decode-group-rope-at-step", "decode-fresh-compressor",
                                                 "ced-ring-slot-of-row", "ced-floor-on-row-index",
                                                 "ced-cut-floor-flipped", "resume-start-off-by-one",
                                                 "ced-replayed-row-ulp", "mhc-comb-transposed",
                                                 "index-topk-capped", "index-relu-dropped",
                                                 "window-ring-drops-last", "index-cache-offset",
                                                 "prefix-cache-keyed-by-length", "compressor-without-lengths",
                                                 "router-ties-lowest-index"};
  return names;
}

namespace {
// The entry of a table of named presets (the replay conventions, the encoder-replay rules): InputError naming
// the known ones.
template <class Entry>
const Entry& named_entry(const std::vector<Entry>& table, std::string_view name, const char* what) {
  std::vector<std::string> known;
  for (const Entry& e : table) {
    if (name == e.name) return e;
    known.emplace_back(e.name);
  }
  throw InputError(fmt::format("v41 {} '{}': unknown (known: {})", what, name, fmt::join(known, ", ")));
}
}  // namespace

V41Fault v41_fault_from_name(std::string_view name) {
  const auto& n = v41_fault_names();
  for (size_t i = 0; i < n.size(); ++i)
    if (name == n[i]) return static_cast<V41Fault>(i);
  throw InputError(fmt::format("v41 fault '{}': unknown (known: {})", name, fmt::join(n, ", ")));
}

namespace {
// The engines' conventions (docs/v41.md §13.1), each with the code it follows.
const std::vector<V41ReplayConvention> kConventions = {
    // name, all_layers, floor_first_layer, speculative_tail, source
    {"sglang", false, true, false,
     "sglang srt/models/deepseek_v4.py DeepseekV4Model (late_layer_start = the last kv source; "
     "DeepseekV4AttnBackend.enter_late_layer_tail floors every tail layer's SWA)"},
    {"trtllm", false, true, false,
     "TensorRT-LLM modeling_deepseekv41.py plan_decoder_replay / enter_decoder_replay (a boundary prepass of "
     "layer 20's collapse, norm, compressor and index keys on every row; the decoder queries narrowed from layer 20)"},
    {"vllm", false, false, false,
     "vllm models/deepseek_v41/nvidia/model.py DeepseekV4DecoderLayer.write_kv (layer 20 writes SWA KV, "
     "compressed KV and index K for every row) and _run_replay_layers"},
    {"atom", false, false, true,
     "ROCm ATOM atom/models/deepseek_v41/bounded_replay.py DecoderReplayModel (layer 20 on every row, layers "
     "21-39 on the tail; tail = window + speculative tokens)"},
    {"ascend", true, true, false,
     "vllm-ascend overlay (CHIRO) models/deepseek_v41/model.py: the prefill role runs layers 0-19 and "
     "write_global_source_from_encoder; the decode role's first prototype replays all 40 layers on the last "
     "128 tokens, SWA from [max(s, i - 127), i], compressed writes skipped"},
};
}  // namespace

const std::vector<V41ReplayConvention>& v41_replay_conventions() { return kConventions; }

const V41ReplayConvention& v41_replay_convention(std::string_view name) {
  return named_entry(kConventions, name, "replay convention");
}

int64_t v41_floored_layers(const V41Plan& p, const V41ReplayConvention& c) {
  const int64_t cut = c.all_layers ? 0 : p.E;
  return p.L - cut - (c.floor_first_layer ? 0 : 1);
}

int64_t v41_exact_span(const V41Plan& p, const V41ReplayConvention& c) { return 1 + v41_floored_layers(p, c) * (p.W - 1); }

int64_t v41_exact_decode_span(const V41Plan& p, const V41ReplayConvention& c) {
  return v41_floored_layers(p, c) * (p.W - 1);
}

int64_t v41_bounded_tail(const V41Plan& p, const V41ReplayConvention& c, int64_t speculative) {
  if (speculative < 0) throw InputError(fmt::format("v41 ced: {} speculative tokens", speculative));
  return p.W + (c.speculative_tail ? speculative : 0);
}

namespace {
// The engines' encoder-replay rules (docs/v41.md §13.8), each with the code it follows.
const std::vector<V41EncoderReplayRule> kEncoderReplayRules = {
    // name, adopts_short_hits, even_boundary, source
    {"vllm", false, false,
     "vllm v1/core/sched/scheduler.py Scheduler._mark_prefix_replay (replay_start = hits - min(window, hits)); "
     "SlidingWindowMLASpec.bounded_replay keeps the window out of the prefix cache"},
    {"trtllm", true, false,
     "TensorRT-LLM TRTLLM_V41_ENCODER_REPLAY: the replay starts at max(0, C - window); at an odd ratio-2 "
     "boundary the last cached raw token is re-included to rebuild the pending group"},
    {"sglang", true, true,
     "sglang srt/model_executor/encoder_swa_replay.py (replay_len(p) = min(p, 128), fold_encoder_swa_replay; "
     "run_encoder_swa_replay requires an even cached-prefix boundary)"},
};
}  // namespace

const std::vector<V41EncoderReplayRule>& v41_encoder_replay_rules() { return kEncoderReplayRules; }

const V41EncoderReplayRule& v41_encoder_replay_rule(std::string_view name) {
  return named_entry(kEncoderReplayRules, name, "encoder replay rule");
}

V41Resume v41_resume(const V41Plan& p, const V41EncoderReplayRule& rule, int64_t H, int64_t rebuilt) {
  if (H < 0 || rebuilt < 0) throw InputError(fmt::format("v41 resume: a hit of {} tokens, {} rebuilt", H, rebuilt));
  V41Resume r;
  r.hit = rule.even_boundary ? H - H % 2 : H;
  if (!rule.adopts_short_hits && r.hit < p.W) r.hit = 0;
  r.start = std::max<int64_t>(0, r.hit - rebuilt);
  for (const LayerPlan& lp : p.layers)  // a group pending at the hit: its tokens recomputed
    if (lp.owns_compressor) r.start = std::min(r.start, r.hit / lp.ratio * lp.ratio);
  return r;
}

int64_t v41_encoder_replay_span(const V41Plan& p, int64_t H) {
  int64_t span = 0;
  for (const int64_t k : p.kv_sources) span = std::max(span, k * (p.W - 1) + H % p[k].ratio);
  return span;
}

}  // namespace ced::v41
