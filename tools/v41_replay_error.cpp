// `ced replay-error` on a v41 config (docs/v41.md §13.11): how far a bounded CED prefill (the last W rows
// replayed under a convention) drifts from exact recovery (the full prefill), per prompt length, per decoder
// layer (the last row's output streams) and per decode step after it; the rows and files of the lab's sweep
// (checks/replay_sweep.hpp), PREFIX.csv and PREFIX.svg.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "checks/replay_sweep.hpp"
#include "model/error.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"
#include "tools/v41_study.hpp"

namespace ced::tools {

int replay_error_v41(const V41ReplayErrorOptions& o) {
  const v41::V41Config c = v41_config_named(o.config);
  const v41::V41Plan p = v41::make_v41_plan(c);
  const v41::V41ReplayConvention& conv = v41::v41_replay_convention(o.convention);
  const int64_t W = p.W, span = v41::v41_exact_span(p, conv);
  std::vector<int64_t> lengths = o.lengths;
  if (lengths.empty()) {  // W to 8W doubling, and the exact span and its neighbours where they are within 8W
    std::set<int64_t> s;
    for (int64_t n = W; n <= 8 * W; n *= 2) s.insert(n);
    for (int64_t d : {-1, 0, 1})
      if (span + d >= 1 && span + d <= 8 * W) s.insert(span + d);
    lengths.assign(s.begin(), s.end());
  }
  // The lab's resume prefixes (docs/spec.md §6): W/2, W, W + 1, 2W, 4W.
  const std::vector<int64_t> prefixes = o.prefixes.empty() ? std::vector<int64_t>{W / 2, W, W + 1, 2 * W, 4 * W} : o.prefixes;
  if (conv.all_layers && !o.prefixes.empty())
    throw InputError(fmt::format("--prefix: convention {} (the all-layers tail) resumes on its prefill side, which is "
                                 "not modelled; give a convention cut at E (sglang, trtllm, vllm)",
                                 conv.name));
  const v41::V41EncoderReplayRule& rule = v41::v41_encoder_replay_rule("vllm");
  const std::string probe = fmt::format("{}.probe", o.out);  // an unwritable prefix fails before the work
  write_text_atomically(probe, "");
  std::remove(probe.c_str());
  const v41::V41Regime regime = v41::v41_regime_from_name(o.regime);
  V41Seeded s = v41_seeded_model(c, o.weight_seed, regime);
  s.model.set_captures(true);  // the decoder layers' output streams
  std::printf("ced replay-error: config %s (v41 family), regime %s, convention %s (exact span %lld), weight_seed %llu, "
              "token_seed %llu; bounded replay K = min(N, W = %lld) against the full prefill (resume rows: after a hit at "
              "P under rule vllm, W rows rebuilt)\n",
              c.name.c_str(), o.regime.c_str(), conv.name, (long long)span, (unsigned long long)o.weight_seed,
              (unsigned long long)o.token_seed, (long long)W);
  const int64_t V = c.vocab_size, row = c.hc_mult * c.dim;
  std::vector<prop::DriftRow> rows;
  Stopwatch sw;
  for (const int64_t N : lengths) {
    const std::vector<int64_t> tokens = v41_seeded_tokens(o.token_seed, c, N + o.decode);
    const std::span<const int64_t> prompt(tokens.data(), static_cast<size_t>(N));
    const int64_t K = std::min(N, W);
    v41::V41DecodeState full_state, ced_state;
    const v41::V41ForwardResult full = s.model.forward(prompt, s.hashing, &full_state);
    const v41::V41ForwardResult ced = s.model.forward_ced(prompt, s.hashing, K, conv, &ced_state);
    prop::DriftRow r;
    r.n_prompt = N;
    r.replay = K;
    r.kind = "prefill";
    prop::fill_metrics(r, last_logits(ced, V).data(), last_logits(full, V).data(), V, true);
    rows.push_back(r);
    for (int64_t l = p.E; l < p.L; ++l) {  // the last row's output streams of each decoder layer
      const auto& a = ced.layers[static_cast<size_t>(l)].out;
      const auto& b = full.layers[static_cast<size_t>(l)].out;
      if (a.size() < static_cast<size_t>(row) || b.size() < static_cast<size_t>(row)) continue;
      prop::DriftRow d = r;
      d.kind = "layer";
      d.layer = l - p.E;
      prop::fill_metrics(d, a.data() + a.size() - static_cast<size_t>(row), b.data() + b.size() - static_cast<size_t>(row),
                         row, false);
      rows.push_back(d);
    }
    // Resumed after a hit at P (the cache: the full prefill's groups, causal), W rows rebuilt, the bounded tail.
    for (const int64_t P : prefixes) {
      if (P < 1 || P >= N || conv.all_layers) continue;
      const v41::V41PrefixHit hit = s.model.prefix_hit(full_state, P);
      const v41::V41ForwardResult res = s.model.forward_resume(prompt, s.hashing, hit, rule, W, K, &conv);
      prop::DriftRow d = r;
      d.kind = "resume";
      d.prefix = P;
      prop::fill_metrics(d, last_logits(res, V).data(), last_logits(full, V).data(), V, true);
      rows.push_back(d);
    }
    for (int64_t step = 0; step < o.decode; ++step) {
      const int64_t token = tokens[static_cast<size_t>(N + step)];
      const v41::V41ForwardResult a = s.model.decode_step(token, s.hashing, ced_state);
      const v41::V41ForwardResult b = s.model.decode_step(token, s.hashing, full_state);
      prop::DriftRow d = r;
      d.kind = "decode";
      d.step = step;
      prop::fill_metrics(d, a.logits.data(), b.logits.data(), V, true);
      rows.push_back(d);
    }
    std::fprintf(stderr, "N = %lld done (%.1f s)\n", (long long)N, sw.seconds());
  }
  write_text_atomically(o.out + ".csv", prop::drift_csv(rows));
  write_text_atomically(o.out + ".svg",
                        prop::drift_svg(rows, fmt::format("CED bounded replay drift, config {} ({})", c.name, conv.name)));
  std::fputs(prop::drift_table(rows).c_str(), stdout);
  std::printf("wrote %s.csv, %s.svg (%.1f s); no %s.h5 on the v41 family (its table file holds a lab config): the "
              "CSV holds every row\n",
              o.out.c_str(), o.out.c_str(), sw.seconds(), o.out.c_str());
  return 0;
}

}  // namespace ced::tools
