// docs/v41.md §13.9: the CED property suite on the released architecture. See v41_ced_checks.hpp.
#include "checks/v41_ced_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "model/error.hpp"
#include "checks/v41/spans.hpp"

namespace ced::v41 {
namespace {

using Tokens = std::vector<int64_t>;

std::span<const int64_t> prompt_of(const Tokens& t) { return std::span<const int64_t>(t).first(t.size() - 1); }

const char* kConventions[] = {"sglang", "vllm", "ascend"};

std::string every_row_replayed(V41Model& m, const V41EngramHashing& h, const Tokens& t) {
  const auto p = prompt_of(t);
  const V41ForwardResult full = m.forward(p, h);
  for (const char* name : kConventions)
    if (m.forward_ced(p, h, static_cast<int64_t>(p.size()), v41_replay_convention(name)).logits != full.logits)
      return fmt::format("{}: the replay of every row is not the prefill", name);
  return "";
}

std::string bounded_within_window(V41Model& m, const V41EngramHashing& h, const Tokens& t) {
  const std::span<const int64_t> p = std::span<const int64_t>(t).first(static_cast<size_t>(m.plan().W));
  const V41ForwardResult full = m.forward(p, h);
  for (const char* name : kConventions)
    if (m.forward_ced(p, h, m.plan().W, v41_replay_convention(name)).logits != full.logits)
      return fmt::format("{}: the bounded replay of a prompt of W tokens is not its prefill", name);
  return "";
}

std::string spans_found(V41Model& m, const V41EngramHashing& h, const Tokens& t) {
  for (const char* name : kConventions) {
    const V41ReplayConvention& conv = v41_replay_convention(name);
    const int64_t span = v41_exact_span(m.plan(), conv), dspan = v41_exact_decode_span(m.plan(), conv);
    if (span >= static_cast<int64_t>(t.size()) - 1) continue;  // past the prompt: ascend on a short one
    const V41FoundSpans f = v41_empirical_spans(m, t, h, conv);
    if (f.last_probe != span || f.decode_probe != dspan || !f.bitwise_at_probe)
      return fmt::format("{}: found {} / {} (plan {} / {}){}", name, f.last_probe, f.decode_probe, span, dspan,
                         f.bitwise_at_probe ? "" : ", not bitwise at it");
  }
  return "";
}

std::string vllm_keeps_layer_e(V41Model& m, const V41EngramHashing& h, const Tokens& t) {
  const auto p = prompt_of(t);
  const int64_t E = m.plan().E, W = m.plan().W, row = m.config().hc_mult * m.config().dim;
  const V41ForwardResult full = m.forward(p, h);
  const V41ForwardResult ced = m.forward_ced(p, h, W, v41_replay_convention("vllm"));
  const auto& f = full.layers[static_cast<size_t>(E)].out;
  const auto& c = ced.layers[static_cast<size_t>(E)].out;
  if (c.size() < static_cast<size_t>(W * row) || !std::equal(f.end() - W * row, f.end(), c.end() - W * row))
    return fmt::format("layer {}'s tail rows differ from the prefill's", E);
  return "";
}

std::string decode_after_ced(V41Model& m, const V41EngramHashing& h, const Tokens& t) {
  const auto p = prompt_of(t);
  V41DecodeState a;
  m.forward(p, h, &a);
  const std::vector<double> want = m.decode_step(t.back(), h, a).logits;
  for (const char* name : kConventions) {
    const V41ReplayConvention& conv = v41_replay_convention(name);
    const int64_t dspan = v41_exact_decode_span(m.plan(), conv);
    if (dspan >= static_cast<int64_t>(p.size())) continue;
    V41DecodeState b;
    m.forward_ced(p, h, dspan, conv, &b);
    if (m.decode_step(t.back(), h, b).logits != want)
      return fmt::format("{}: the step after a ced prefill of {} rows is not the prefill's", name, dspan);
  }
  return "";
}

std::string source_write(V41Model& m, const V41EngramHashing& h, const Tokens& t) {
  // An odd prompt: a ratio-2 source keeps a pending token in its group state.
  const auto p = prompt_of(t).first(t.size() % 2 ? t.size() - 2 : t.size() - 1);
  const int64_t N = static_cast<int64_t>(p.size());
  V41DecodeState st;
  const V41ForwardResult full = m.forward(p, h, &st);
  for (const LayerPlan& lp : m.plan().layers) {
    if (!lp.owns_compressor || lp.engram) continue;
    const V41LayerCapture& cap = full.layers[static_cast<size_t>(lp.layer)];
    const V41LayerCache w = m.source_write(lp.layer, cap.in, cap.pre_mix, N);
    const V41LayerCache& want = st.layers[static_cast<size_t>(lp.layer)];
    if (w.compress_kv != want.compress_kv || w.index_k != want.index_k || w.kv_state != want.kv_state ||
        w.score_state != want.score_state)
      return fmt::format("layer {}: the source-only write is not the prefill's cache", lp.layer);
  }
  return "";
}

std::string resume_short_hit(V41Model& m, const V41EngramHashing& h, const Tokens& t) {
  const auto p = prompt_of(t);
  const int64_t W = m.plan().W;
  for (const char* name : {"sglang", "vllm"}) {
    const V41ReplayConvention& conv = v41_replay_convention(name);
    V41DecodeState cold;
    const std::vector<double> logits = m.forward_ced(p, h, W, conv, &cold).logits;
    for (const auto& rule : v41_encoder_replay_rules())
      for (int64_t H : {W - 1, W})
        if (m.forward_resume(p, h, m.prefix_hit(cold, H), rule, W, W, &conv).logits != logits)
          return fmt::format("{}, rule {}: the resume after a hit of {} is not the cold run", name, rule.name, H);
  }
  return "";
}

std::string encoder_span(V41Model& m, const V41EngramHashing& h, const Tokens& t) {
  const auto p = prompt_of(t);
  const V41Plan& plan = m.plan();
  const int64_t H = static_cast<int64_t>(p.size()) - (plan.L - plan.E) * (plan.W - 1) - 1;
  const int64_t span = v41_encoder_replay_span(plan, H);
  if (H <= span) return fmt::format("the prompt of {} tokens leaves no hit past the encoder replay span", p.size());
  const V41FoundEncoderSpan f = v41_empirical_encoder_span(m, p, h, H);
  if (f.probe != span || !f.bitwise_at_probe)
    return fmt::format("hit {}: found {} (plan {}){}", H, f.probe, span, f.bitwise_at_probe ? "" : ", not bitwise");
  return "";
}

}  // namespace

const std::vector<V41Check>& v41_ced_checks() {
  using Fn = std::string (*)(V41Model&, const V41EngramHashing&, const Tokens&);
  // Layer E's tail rows and the kv sources' inputs are read from the captures: every check keeps them all.
  auto with_captures = [](Fn f) {
    return [f](V41Model& m, const V41EngramHashing& h, const Tokens& t) {
      m.set_captures(true);
      return f(m, h, t);
    };
  };
  static const std::vector<V41Check> c = {
      {"every row replayed is the prefill", with_captures(every_row_replayed)},
      {"bounded = prefill when N <= W", with_captures(bounded_within_window)},
      {"spans found are the plan's, bitwise at them", with_captures(spans_found)},
      {"vllm keeps layer E's tail exact", with_captures(vllm_keeps_layer_e)},
      {"decode after ced of the decode span is the prefill's", with_captures(decode_after_ced)},
      {"source-only write = the prefill's cache", with_captures(source_write)},
      {"resume after a hit of at most W is the cold run", with_captures(resume_short_hit)},
      {"encoder replay span found is the plan's, bitwise at it", with_captures(encoder_span)},
  };
  return c;
}

const V41Check& v41_ced_check(const std::string& name) {
  std::vector<std::string> known;
  for (const V41Check& c : v41_ced_checks()) {
    if (name == c.name) return c;
    known.emplace_back(c.name);
  }
  throw InputError(fmt::format("v41 check '{}': unknown (known: {})", name, fmt::join(known, "; ")));
}

}  // namespace ced::v41
