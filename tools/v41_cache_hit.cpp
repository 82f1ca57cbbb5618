// docs/v41.md §13.8: `ced cache-hit` on a v41 config. One prompt, its cold run in each mode (a ced prefill
// under a convention, or the full prefill), and for each hit H and each engine's encoder-replay rule the
// prompt resumed from the cache of its first H tokens: its last logits and the next decode step against
// the cold run's, bitwise where every row is rebuilt (the rule claims the cold run there), measured where
// the window is rebuilt from H - K.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "compare/compare.hpp"
#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward.hpp"
#include "tools/common.hpp"
#include "tools/v41_cache_hit.hpp"
#include "tools/v41_commands.hpp"
#include "tools/v41_study.hpp"

namespace ced::tools {
namespace cache_hit {

bool Sample::ok() const { return finite && (!claims_exact || (bitwise && step_bitwise)); }

std::vector<Row> aggregate(const std::vector<Sample>& samples) {
  std::vector<Row> rows;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    auto same = [&](const Sample& x) { return x.mode == s.mode && x.H == s.H && x.rule == s.rule && x.K == s.K; };
    if (std::any_of(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(i), same)) continue;
    Row r;
    r.first = &s;
    std::vector<double> kl, step_kl;
    for (const Sample& x : samples) {
      if (!same(x)) continue;
      ++r.n;
      r.bitwise += x.bitwise;
      r.top1 += x.top1;
      r.step_bitwise += x.step_bitwise;
      r.ok = r.ok && x.ok();
      kl.push_back(x.kl);
      step_kl.push_back(x.step_kl);
    }
    r.kl_median = median(kl);
    r.kl_worst = *std::max_element(kl.begin(), kl.end());
    r.step_kl_median = median(step_kl);
    rows.push_back(r);
  }
  return rows;
}

std::string table(const std::vector<Row>& rows, bool markdown) {
  const std::vector<std::string> head = {"mode", "H", "rule", "hit", "start", "K", "claim", "samples", "bitwise",
                                         "median KL", "worst KL", "top-1", "step bitwise", "step KL", "verdict"};
  auto line = [&](const std::vector<std::string>& c) {
    if (markdown) {
      std::string s = "|";
      for (const auto& x : c) s += " " + x + " |";
      return s + "\n";
    }
    return fmt::format("{:<7} {:>5} {:<7} {:>5} {:>5} {:>5} {:<8} {:>7} {:>7} {:>10} {:>10} {:>5} {:>12} {:>10}  {}\n",
                       c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13], c[14]);
  };
  std::string s = line(head);
  if (markdown) s += "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const Row& r : rows) {
    const Sample& f = *r.first;
    s += line({f.mode, std::to_string(f.H), f.rule, std::to_string(f.hit), std::to_string(f.start),
               std::to_string(f.K), f.claims_exact ? "exact" : "measured", std::to_string(r.n),
               fmt::format("{}/{}", r.bitwise, r.n), fmt::format("{:.3e}", r.kl_median), fmt::format("{:.3e}", r.kl_worst),
               fmt::format("{:.2f}", double(r.top1) / double(r.n)), fmt::format("{}/{}", r.step_bitwise, r.n),
               fmt::format("{:.3e}", r.step_kl_median), r.ok ? "ok" : "MISMATCH"});
  }
  return s;
}

}  // namespace cache_hit
namespace {

using cache_hit::Row;
using cache_hit::Sample;
using cache_hit::table;

// The hits of the sweep: the window's edges, the odd and even boundaries past it (none a multiple
// of the candidate block), each below N - 1 (a hit leaves the prompt's last token to compute).
std::vector<int64_t> default_hits(const v41::V41Plan& p) {
  const int64_t W = p.W;
  return {W - 1, W, W + 1, 2 * W - 1, 2 * W, 130, 131, 322, 323, 450, 451};
}

std::string csv(const std::vector<Sample>& samples) {
  std::string t = "mode,H,rule,token_seed,hit,start,K,claims_exact,bitwise,kl,top1,rel_l2,step_bitwise,step_kl,ok\n";
  for (const Sample& r : samples)
    t += fmt::format("{},{},{},{},{},{},{},{},{},{:.6e},{},{:.6e},{},{:.6e},{}\n", r.mode, r.H, r.rule, r.token_seed,
                     r.hit, r.start, r.K, int(r.claims_exact), int(r.bitwise), r.kl, int(r.top1), r.rel_l2,
                     int(r.step_bitwise), r.step_kl, int(r.ok()));
  return t;
}

}  // namespace

int cache_hit_v41(const V41CacheHitOptions& o) {
  const v41::V41Config c = v41_config_named(o.config);
  const v41::V41Plan p = v41::make_v41_plan(c);
  std::vector<const v41::V41EncoderReplayRule*> rules;
  for (const auto& name : o.rules) rules.push_back(&v41::v41_encoder_replay_rule(name));
  if (rules.empty())
    for (const auto& r : v41::v41_encoder_replay_rules()) rules.push_back(&r);
  std::vector<const v41::V41ReplayConvention*> modes;  // nullptr: the full prefill
  for (const auto& name : o.modes.empty() ? std::vector<std::string>{"sglang", "vllm", "full"} : o.modes)
    modes.push_back(name == "full" ? nullptr : &v41::v41_replay_convention(name));
  for (const auto* conv : modes)
    if (conv && conv->all_layers)
      throw InputError(fmt::format("--mode {}: the all-layers tail resumes on its prefill side, which is not modelled",
                                   conv->name));
  std::vector<int64_t> hits = o.hits.empty() ? default_hits(p) : o.hits;
  const std::vector<int64_t> rebuilt = o.rebuilt.empty() ? std::vector<int64_t>{p.W} : o.rebuilt;
  const int64_t N = o.tokens > 0 ? o.tokens : *std::max_element(hits.begin(), hits.end()) + 2 * p.W;
  if (N + 1 > kMaxLength) throw InputError(fmt::format("--tokens {}: more than {} tokens", N, kMaxLength));
  for (int64_t H : hits)
    if (H < 1 || H >= N) throw InputError(fmt::format("--hits: {} is not in [1, N = {})", H, N));
  if (!o.out.empty()) check_writable(o.out);
  V41Seeded seeded =
      v41_seeded_model(c, o.weight_seed, v41::v41_regime_from_name(o.regime), v41::v41_fault_from_name(o.fault));
  const v41::V41Model& m = seeded.model;
  const v41::V41EngramHashing& hashing = seeded.hashing;
  const std::vector<uint64_t> seeds = o.token_seeds.empty() ? std::vector<uint64_t>{0} : o.token_seeds;
  const int64_t V = c.vocab_size;
  const std::string header = fmt::format(
      "config {} (v41 family): W = {}, E = {}; N = {} and one decode step, regime {}, weight_seed {}, token seeds {}; "
      "the encoder replay span (every kv source's rows after the hit exact) {} at an even hit",
      c.name, p.W, p.E, N, o.regime, o.weight_seed, fmt::join(seeds, " "), v41::v41_encoder_replay_span(p, 0));
  std::printf("%s\n", header.c_str());
  std::fflush(stdout);
  std::vector<Sample> samples;
  Stopwatch wall;
  for (uint64_t seed : seeds) {
    std::vector<int64_t> tokens = v41_seeded_tokens(seed, c, N + 1);
    const int64_t next = tokens.back();
    tokens.pop_back();
    for (const auto* conv : modes) {
      const std::string mode = conv ? conv->name : "full";
      const int64_t R = conv ? v41::v41_bounded_tail(p, *conv, 0) : N;
      v41::V41DecodeState cold_state;
      const v41::V41ForwardResult cold =
          conv ? m.forward_ced(tokens, hashing, R, *conv, &cold_state) : m.forward(tokens, hashing, &cold_state);
      std::vector<v41::V41PrefixHit> cache;
      for (int64_t H : hits) cache.push_back(m.prefix_hit(cold_state, H));
      const std::span<const double> want = last_logits(cold, V);
      const std::vector<double> want_step = m.decode_step(next, hashing, cold_state).logits;
      for (size_t i = 0; i < hits.size(); ++i)
        for (const auto* rule : rules)
          for (int64_t K : rebuilt) {
            Sample r;
            r.mode = mode;
            r.rule = rule->name;
            r.token_seed = seed;
            r.H = hits[i];
            r.K = K;
            const v41::V41Resume at = v41::v41_resume(p, *rule, hits[i], K);
            r.hit = at.hit;
            r.start = at.start;
            r.claims_exact = at.start == 0;
            v41::V41DecodeState st;
            const v41::V41ForwardResult got = m.forward_resume(tokens, hashing, cache[i], *rule, K, R, conv, &st);
            const auto g = last_logits(got, V);
            const std::vector<double> step = m.decode_step(next, hashing, st).logits;
            auto finite = [](std::span<const double> v) {
              return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
            };
            r.finite = finite(g) && finite(step);
            r.bitwise = std::equal(g.begin(), g.end(), want.begin());
            const LogitsCompare lc = compare_logits(g, want, {1, V});
            r.kl = lc.mean_kl;
            r.top1 = lc.top1_agree == 1;
            r.rel_l2 = rel_l2(g, want);
            r.step_bitwise = step == want_step;
            r.step_kl = compare_logits(step, want_step, {1, V}).mean_kl;
            samples.push_back(r);
          }
      std::fprintf(stderr, "  [%7.1fs] token seed %llu, %s\n", wall.seconds(), (unsigned long long)seed, mode.c_str());
    }
  }
  const std::vector<Row> rows = aggregate(samples);
  std::fputs(table(rows, false).c_str(), stdout);
  const bool ok = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.ok; });
  std::printf("claim exact: the rule rebuilds every row (start 0), so the resume must be the cold run's bits, its "
              "decode step too; measured: the window rebuilt from the start, KL(cold || resumed) of the last "
              "position over the token seeds; %zu resumes in %.1f s: %s\n",
              samples.size(), wall.seconds(), ok ? "every claim held" : "a claim FAILED");
  if (!o.out.empty()) {
    std::string page = fmt::format("# Prefix-cache hits on `{}`, per encoder-replay rule\n\n", c.name);
    page += fmt::format(
        "Written by `ced cache-hit` (docs/v41.md §13.8). {}. Each row resumes the prompt from the cache of its "
        "first H tokens under the rule (the hit it adopts, its first recomputed row), with K window rows rebuilt, "
        "and puts its last logits and the next decode step beside the cold run's of the same mode.\n\n",
        header);
    page += fmt::format("```sh\n{}\n```\n\nWall time {:.1f} s on this machine.\n\n", o.command, wall.seconds());
    page += table(rows, true);
    page += fmt::format("\nVerdict: {}. Files: `{}.csv` (every resume of every seed).\n",
                        ok ? "every claim held" : "a claim FAILED",
                        o.out_name);
    write_text_atomically(o.out + ".csv", csv(samples));
    write_text_atomically(o.out + ".md", page);
    std::printf("wrote %s.md, %s.csv\n", o.out.c_str(), o.out.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace ced::tools
