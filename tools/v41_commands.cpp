// docs/v41.md §12: `ced export` and `ced run` for the v41 family; see v41_commands.hpp.
#include "tools/v41_commands.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backends/registry.hpp"
#include "model/error.hpp"
#include "model/run.hpp"
#include "model/hash.hpp"
#include "models/family.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/run_file.hpp"
#include "models/v41/boundary_lengths.hpp"
#include "models/v41/stress_prompts.hpp"
#include "checks/v41/spans.hpp"
#include "oracle/v41_oracle.hpp"
#include "tools/common.hpp"
#include "tools/v41_study.hpp"

namespace ced::tools {
namespace {

namespace fs = std::filesystem;

// A v41 config named by --config: a built-in, or a config file (a Hugging Face config.json, told by its
// text_config, or a flat inference/config.json).
v41::V41Config v41_config(const std::string& arg) {
  if (v41::is_v41_builtin(arg)) return v41::v41_builtin_config(arg);
  if (fs::is_directory(arg))
    throw InputError(fmt::format("--config {}: a folder is a checkpoint; run it with --checkpoint {}", arg, arg));
  std::ifstream in(arg);
  if (!in) throw InputError(fmt::format("--config {}: cannot read the file", arg));
  std::stringstream text;
  text << in.rdbuf();
  const bool hf = text.str().find("\"text_config\"") != std::string::npos;
  v41::V41Config c = hf ? v41::load_v41_config_files(fs::path(arg), std::nullopt)
                        : v41::load_v41_config_files(std::nullopt, fs::path(arg));
  c.name = arg;
  return c;
}

// The tokens: N prompt tokens and the decode steps' from the seed (the lab's generator, docs/spec.md
// §2.3, over this vocabulary), or the ids of a file (its last `decode` the steps').
std::vector<int64_t> v41_tokens(const V41RunOptions& o, const v41::V41Config& c) {
  std::vector<int64_t> t;
  if (o.token_file.empty()) {
    if (o.tokens + o.decode > kMaxLength)
      throw InputError(fmt::format("--tokens {} and --decode {}: more than {} tokens", o.tokens, o.decode, kMaxLength));
    t = v41_seeded_tokens(o.token_seed, c, o.tokens + o.decode);
    return t;
  }
  std::ifstream in(o.token_file);
  if (!in) throw InputError(fmt::format("--token-file {}: cannot read the file", o.token_file));
  for (std::string word; in >> word;) {
    int64_t v = 0;
    size_t used = 0;
    try {
      v = std::stoll(word, &used, 10);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || word.find_first_not_of("0123456789") != std::string::npos)
      throw InputError(fmt::format("--token-file {}: token {} is '{}', not a decimal id", o.token_file, t.size(), word));
    if (v >= c.vocab_size)
      throw InputError(fmt::format("--token-file {}: token {} is {}, outside [0, {}) of config {}", o.token_file,
                                   t.size(), v, c.vocab_size, c.name));
    t.push_back(v);
  }
  if (static_cast<int64_t>(t.size()) <= o.decode)
    throw InputError(fmt::format("--token-file {}: {} token ids, not more than --decode {} (the prompt needs one)",
                                 o.token_file, t.size(), o.decode));
  if (static_cast<int64_t>(t.size()) > kMaxLength)
    throw InputError(fmt::format("--token-file {}: more than {} tokens", o.token_file, kMaxLength));
  return t;
}

// FNV-1a 64 of the logits as fp32 bytes: the summary's fingerprint of a run, equal for equal bits.
std::string logits_digest(const std::vector<double>& logits) {
  const std::vector<float> f(logits.begin(), logits.end());
  return fmt::format("{:016x}", fnv1a64(std::string_view(reinterpret_cast<const char*>(f.data()), f.size() * sizeof(float))));
}

}  // namespace

v41::V41Config v41_config_named(const std::string& arg) { return v41_config(arg); }

bool names_v41_family(const std::string& config_arg) { return family_of_config(config_arg).name == "v41"; }

bool is_v41_run_file(const std::string& path) { return v41::is_untrusted_v41_run_file(path); }

int diff_v41(const V41DiffOptions& o) {
  const v41::V41DiffReport r = v41::v41_diff(o);
  std::fputs(r.text.c_str(), stdout);
  return r.pass ? 0 : 1;
}

int oracle_v41(const std::string& config, const std::vector<int64_t>& Ns, bool json) {
  const v41::V41Config c = v41_config(config);
  v41::V41OracleTable t;
  try {
    t = v41::v41_oracle_table(c, Ns);
  } catch (const std::overflow_error&) {
    // the counts are exact int64 (oracle/v41_flops.cpp): a length whose count does not fit is out of range
    throw InputError(fmt::format("--tokens: N = {} is too long for config {}: its FLOP count (docs/v41.md §14.2) "
                                 "overflows int64",
                                 *std::max_element(Ns.begin(), Ns.end()), c.name));
  }
  std::fputs((json ? v41::v41_oracle_table_json(t) + "\n" : v41::format_v41_oracle_table(t)).c_str(), stdout);
  return 0;
}

int export_v41(const V41ExportOptions& o) {
  const v41::V41Config c = v41_config(o.config);
  // The whole checkpoint is made in memory first: v41-flash is refused with its figures.
  v41::check_v41_fits_in_memory(c);
  std::printf("config %s (v41 family), weight_seed %llu\n", c.name.c_str(), (unsigned long long)o.weight_seed);
  v41::V41Checkpoint ck = v41::make_v41_random_checkpoint(c, o.weight_seed);
  for (const auto& b : o.boost) v41::apply_v41_boost(ck, b);
  v41::V41WriteOptions w;
  if (o.shard_bytes > 0) w.shard_bytes = o.shard_bytes;
  const auto files = v41::write_v41_checkpoint(o.out, ck, w);
  int64_t bytes = 0;
  for (const auto& t : ck.weights.tensors) bytes += static_cast<int64_t>(t.bytes.size());
  std::printf("wrote %s: %zu files, %zu tensors, %lld bytes of tensors, weights digest %s\n", o.out.c_str(),
              files.size(), ck.weights.tensors.size(), (long long)bytes, v41::v41_weights_digest(ck.weights).c_str());
  return 0;
}

int run_v41(const V41RunOptions& o) {
  const v41::V41Regime regime = v41::v41_regime_from_name(o.regime);
  const v41::V41Options options{v41::v41_topk_ties_from_name(o.topk_ties),
                                v41::v41_index_scores_from_name(o.index_scores),
                                v41::v41_decode_index_k_from_name(o.decode_index_k)};
  Stopwatch load_clock;
  v41::V41Checkpoint ck;
  std::string source;
  if (!o.checkpoint.empty()) {
    // The config alone first: a folder too large for this machine is refused before its shards are read.
    v41::check_v41_fits_in_memory(v41::load_v41_checkpoint_config(o.checkpoint));
    ck = v41::read_v41_checkpoint(o.checkpoint);
    ck.config.name = o.checkpoint;
    source = fmt::format("checkpoint {}", o.checkpoint);
  } else {
    const v41::V41Config c = v41_config(o.config);
    v41::check_v41_fits_in_memory(c);
    ck = v41::make_v41_random_checkpoint(c, o.weight_seed);
    source = fmt::format("random weights of weight_seed {} (as `ced export` writes them)", o.weight_seed);
  }
  const v41::V41Config& c = ck.config;
  const std::vector<int64_t> all_tokens = v41_tokens(o, c);
  const std::vector<int64_t> tokens(all_tokens.begin(), all_tokens.end() - o.decode);
  const std::string digest = v41::v41_weights_digest(ck.weights);
  std::printf("config %s (v41 family), %s, weights digest %s\n", c.name.c_str(), source.c_str(), digest.c_str());
  const auto model = make_v41_backend(o.backend, c, ck.weights, regime);
  model->set_options(options);
  model->set_captures(!o.out.empty());  // only a run file reads them
  const v41::V41EngramHashing hashing = v41::v41_checkpoint_hashing(c);
  const double load_s = load_clock.seconds();
  const int64_t N = static_cast<int64_t>(tokens.size());
  std::printf("backend %s, regime %s, top-k ties %s, index scores %s, N = %lld (%s)\n", o.backend.c_str(),
              v41::v41_regime_name(regime), o.topk_ties.c_str(), o.index_scores.c_str(), (long long)N,
              o.token_file.empty() ? fmt::format("token_seed {}", o.token_seed).c_str()
                                   : fmt::format("token ids from {}", o.token_file).c_str());
  Stopwatch forward_clock;
  const double cpu0 = process_cpu_seconds();
  v41::V41DecodeState state;
  v41::V41DecodeState* seeded = o.decode > 0 ? &state : nullptr;
  v41::V41RunRequest request;
  request.mode = o.mode;
  v41::V41ForwardResult r;
  if (o.mode == "full") {
    r = model->forward(tokens, hashing, seeded);
  } else {
    const bool resume = o.mode == "resume";
    const v41::V41ReplayConvention& convention = v41::v41_replay_convention(o.convention);
    const int64_t span = v41::v41_exact_span(model->plan(), convention);
    const ReplayPolicy p = ReplayPolicy::parse(o.replay);
    // A resume replaying every row has no tail: its recomputed rows run through every layer.
    const bool tail = !(resume && p.kind == ReplayPolicy::Kind::Full);
    const int64_t replay = p.kind == ReplayPolicy::Kind::Bounded ? v41::v41_bounded_tail(model->plan(), convention, o.speculative)
                           : p.kind == ReplayPolicy::Kind::Exact ? span
                           : p.kind == ReplayPolicy::Kind::Count ? p.count
                                                                  : N;
    request.replay = o.replay;
    if (tail) request.convention = convention.name;
    if (tail)
      std::printf("%s: convention %s (tail from layer %s, %s), replay %s = %lld of %lld rows (exact span %lld)\n",
                  o.mode.c_str(), convention.name, convention.all_layers ? "0" : "E",
                  convention.floor_first_layer ? "its window floored" : "its window whole", o.replay.c_str(),
                  (long long)std::min(replay, N), (long long)N, (long long)span);
    if (!resume) {
      r = model->forward_ced(tokens, hashing, replay, convention, seeded);
    } else {
      if (o.prefix < 1 || o.prefix > N)
        throw InputError(fmt::format("--prefix {}: a resume needs a hit H in [1, N = {}]", o.prefix, N));
      const v41::V41EncoderReplayRule& rule = v41::v41_encoder_replay_rule(o.rule);
      const int64_t rebuilt = o.rebuilt >= 0 ? o.rebuilt : model->plan().W;
      // The prefix cache: what a prefill of the first H tokens leaves (its groups are causal: the cache's bits).
      v41::V41DecodeState cold;
      (void)model->forward(std::span<const int64_t>(tokens).first(static_cast<size_t>(o.prefix)), hashing, &cold);
      const v41::V41PrefixHit hit = model->prefix_hit(cold, o.prefix);
      const v41::V41Resume at = v41::v41_resume(model->plan(), rule, o.prefix, rebuilt);
      std::printf("resume: a hit at H = %lld under rule %s adopts %lld tokens, recomputes from row %lld (%lld window "
                  "rows rebuilt)\n",
                  (long long)o.prefix, rule.name, (long long)at.hit, (long long)at.start, (long long)rebuilt);
      r = model->forward_resume(tokens, hashing, hit, rule, rebuilt, replay, tail ? &convention : nullptr, seeded);
      request.prefix_len = o.prefix;
      request.rule = rule.name;
      request.rebuilt = rebuilt;
    }
    request.n_replay = N - r.first_row;
    // A cut layer whose window is floored at the tail: its rows before the tail are nobody's output.
    if (tail) v41::v41_drop_unused_cut_rows(r, model->plan(), convention);
  }
  const double forward_s = forward_clock.seconds(), cpu = process_cpu_seconds() - cpu0;
  const size_t V = static_cast<size_t>(c.vocab_size), rows = r.logits.size() / V;
  size_t arg = 0;
  bool finite = true;
  for (size_t v = 0; v < V; ++v) {
    const double x = r.logits[(rows - 1) * V + v];
    finite = finite && std::isfinite(x);
    if (x > r.logits[(rows - 1) * V + arg]) arg = v;
  }
  for (double x : r.logits) finite = finite && std::isfinite(x);
  std::printf("load %.3f s, forward %.3f s (%.1f tokens/s, CPU %.3f s)\n", load_s, forward_s,
              static_cast<double>(N) / forward_s, cpu);
  const std::vector<double> last_row(r.logits.end() - static_cast<std::ptrdiff_t>(V), r.logits.end());
  std::printf("last position logits digest %s\n", logits_digest(last_row).c_str());
  std::printf("logits [%zu, %zu]: last position argmax %zu, all finite: %s, digest %s\n", rows, V, arg,
              finite ? "yes" : "NO", logits_digest(r.logits).c_str());
  std::optional<v41::V41DecodeRecord> decoded;
  if (o.decode > 0) {
    decoded.emplace();
    for (const auto& l : state.layers) decoded->seed.push_back({l.window, l.kv_state, l.score_state, {}, {}});
    Stopwatch decode_clock;
    for (auto t = all_tokens.end() - o.decode; t != all_tokens.end(); ++t) {
      decoded->tokens.push_back(*t);
      decoded->steps.push_back(model->decode_step(*t, hashing, state));
      for (double x : decoded->steps.back().logits) finite = finite && std::isfinite(x);
    }
    std::vector<double> step_logits;
    for (const auto& s : decoded->steps) step_logits.insert(step_logits.end(), s.logits.begin(), s.logits.end());
    const auto& last = decoded->steps.back().logits;
    const size_t step_arg = static_cast<size_t>(std::max_element(last.begin(), last.end()) - last.begin());
    std::printf("decode %lld steps (index keys %s): %.3f s, last step argmax %zu, all finite: %s, digest %s\n",
                (long long)o.decode, o.decode_index_k.c_str(), decode_clock.seconds(), step_arg, finite ? "yes" : "NO",
                logits_digest(step_logits).c_str());
  }
  if (!o.out.empty()) {
    v41::V41RunFile f;
    f.decode = std::move(decoded);
    f.generator = fmt::format("ced run (ced-harness {}; {})", CED_VERSION, o.backend);
    f.config = c;
    f.regime = regime;
    f.options = options;
    f.weights_digest = digest;
    if (o.checkpoint.empty()) f.weight_seed = o.weight_seed;
    f.tokens = tokens;
    f.request = request;
    f.result = std::move(r);
    v41::write_v41_run_file(o.out, f);
    std::printf("wrote %s\n", o.out.c_str());
  }
  return finite ? 0 : 1;
}

namespace {

// `ced spans --empirical --prefix H` on v41: the encoder replay span after a hit at H, found on the model.
int encoder_span_v41(const V41SpansOptions& o, const v41::V41Config& c, const v41::V41Plan& p, v41::V41Regime regime,
                     v41::V41Fault fault) {
  const int64_t H = o.prefix, span = v41::v41_encoder_replay_span(p, H);
  // Past the hit, the last position's own window cone through every layer must start after the rebuilt rows.
  const int64_t N = o.tokens > 0 ? o.tokens : H + (p.L - p.E) * (p.W - 1) + 1;
  if (H < 1 || H >= N) throw InputError(fmt::format("--prefix: H = {} must be in [1, N = {})", H, N));
  if (N > kMaxLength) throw InputError(fmt::format("--tokens {}: more than {} tokens", N, kMaxLength));
  V41Seeded seeded = v41_seeded_model(c, o.weight_seed, regime, fault);
  v41::V41Model& m = seeded.model;
  const std::vector<int64_t> tokens = v41_seeded_tokens(o.token_seed, c, N);
  const v41::V41EngramHashing& hashing = seeded.hashing;
  std::printf("searching the encoder replay after a hit at H = %lld of N = %lld, regime %s, weight_seed %llu, "
              "token_seed %llu (a full-mode resume; the probe reads every window key the floor leaves out as NaN)\n",
              (long long)H, (long long)N, o.regime.c_str(), (unsigned long long)o.weight_seed,
              (unsigned long long)o.token_seed);
  std::fflush(stdout);
  Stopwatch sw;
  const v41::V41FoundEncoderSpan f = v41::v41_empirical_encoder_span(m, tokens, hashing, H, [&](const std::string& l) {
    std::fprintf(stderr, "  [%7.1fs] %s\n", sw.seconds(), l.c_str());
  });
  const int64_t want = std::min(span, H);  // a span past the hit: every row rebuilt
  const bool ok = f.probe == want && f.bitwise_at_probe && f.bitwise <= f.probe;
  std::printf("%-6s %10s %8s %13s %10s %9s  %s\n", "hit", "plan span", "found", "bitwise from", "at found", "seconds",
              "verdict");
  std::printf("%-6lld %10lld %8lld %13lld %10s %9.1f  %s\n", (long long)H, (long long)span, (long long)f.probe,
              (long long)f.bitwise, f.bitwise_at_probe ? "bitwise" : "DIFFERS", sw.seconds(), ok ? "ok" : "MISMATCH");
  std::printf("found = the fewest window rows rebuilt before the hit whose last logits stay finite under the probe; "
              "bitwise from = the fewest whose last logits are the cold prefill's bits\n");
  return ok ? 0 : 1;
}

}  // namespace

int spans_v41(const V41SpansOptions& o) {
  const v41::V41Config c = v41_config(o.config);
  const v41::V41Plan p = v41::make_v41_plan(c);
  std::vector<const v41::V41ReplayConvention*> convs;
  for (const auto& name : o.conventions) convs.push_back(&v41::v41_replay_convention(name));
  if (convs.empty())
    for (const auto& conv : v41::v41_replay_conventions()) convs.push_back(&conv);
  std::printf("config %s (v41 family): L = %lld, E = %lld, W = %lld\n", c.name.c_str(), (long long)p.L,
              (long long)p.E, (long long)p.W);
  if (o.stress > 0) {  // the prompts that make ties likely, beside the boundary lengths
    if (!o.stress_out.empty()) fs::create_directories(o.stress_out);
    for (const v41::V41StressPrompt& s : v41::v41_stress_prompts(c, p, o.stress)) {
      const std::string ids = fmt::format("{}", fmt::join(s.tokens, " "));
      std::printf("%-16s %s\n  %s\n", s.name.c_str(), s.why.c_str(), ids.c_str());
      if (!o.stress_out.empty()) write_text_atomically((fs::path(o.stress_out) / (s.name + ".txt")).string(), ids + "\n");
    }
    return 0;
  }
  if (o.prefix >= 0 && !o.empirical) {
    std::printf("encoder replay after a hit at H = %lld: span %lld (every kv source's rows after the hit exact)\n",
                (long long)o.prefix, (long long)v41::v41_encoder_replay_span(p, o.prefix));
    return 0;
  }
  if (o.prefix >= 0)
    return encoder_span_v41(o, c, p, v41::v41_regime_from_name(o.regime), v41::v41_fault_from_name(o.fault));
  int64_t longest = 0;
  for (const auto* conv : convs) longest = std::max(longest, v41::v41_exact_span(p, *conv));
  if (!o.empirical) {
    std::printf("%-10s %-9s %-10s %4s %11s %12s\n", "convention", "tail from", "cut layer", "F", "exact span",
                "decode span");
    for (const auto* conv : convs)
      std::printf("%-10s %-9s %-10s %4lld %11lld %12lld\n", conv->name, conv->all_layers ? "layer 0" : "layer E",
                  conv->floor_first_layer ? "floored" : "whole", (long long)v41::v41_floored_layers(p, *conv),
                  (long long)v41::v41_exact_span(p, *conv), (long long)v41::v41_exact_decode_span(p, *conv));
    // Where the config's constants change what a layer does: the lengths a port's tests must reach.
    std::printf("boundary lengths (docs/v41.md §13.10: each constant - 1, itself, + 1):\n");
    for (const v41::V41BoundaryLength& b : v41::v41_boundary_lengths(c, p))
      std::printf("%8lld  %s\n", (long long)b.n, fmt::format("{}", fmt::join(b.why, "; ")).c_str());
    return 0;
  }
  const v41::V41Regime regime = v41::v41_regime_from_name(o.regime);
  const v41::V41Fault fault = v41::v41_fault_from_name(o.fault);
  const int64_t N = o.tokens > 0 ? o.tokens : longest + p.W;
  if (N + 1 > kMaxLength) throw InputError(fmt::format("--tokens {}: more than {} tokens", N, kMaxLength));
  V41Seeded seeded = v41_seeded_model(c, o.weight_seed, regime, fault);
  v41::V41Model& m = seeded.model;
  const v41::V41EngramHashing& hashing = seeded.hashing;
  const std::vector<int64_t> tokens = v41_seeded_tokens(o.token_seed, c, N + 1);
  std::printf("searching N = %lld (and one decode step), regime %s, weight_seed %llu, token_seed %llu; the probe "
              "reads every window key a floor leaves out as NaN\n",
              (long long)N, o.regime.c_str(), (unsigned long long)o.weight_seed, (unsigned long long)o.token_seed);
  std::fflush(stdout);
  struct Row {
    const v41::V41ReplayConvention* conv;
    v41::V41FoundSpans found;
    double seconds;
    const char* same_as;
  };
  std::vector<Row> rows;
  Stopwatch all;
  for (const auto* conv : convs) {
    // A preset whose data another's already searched has its spans (trtllm's are sglang's).
    const auto same = std::find_if(rows.begin(), rows.end(), [&](const Row& r) {
      return r.conv->all_layers == conv->all_layers && r.conv->floor_first_layer == conv->floor_first_layer;
    });
    if (same != rows.end()) {
      rows.push_back({conv, same->found, 0.0, same->conv->name});
      continue;
    }
    Stopwatch sw;
    const v41::V41FoundSpans f = v41::v41_empirical_spans(m, tokens, hashing, *conv, [&](const std::string& line) {
      std::fprintf(stderr, "  [%7.1fs] %s\n", all.seconds(), line.c_str());
    });
    rows.push_back({conv, f, sw.seconds(), nullptr});
  }
  std::printf("%-10s %11s %8s %12s %8s %13s %10s %9s  %s\n", "convention", "exact span", "found", "decode span",
              "found", "bitwise from", "at found", "seconds", "verdict");
  bool agree = true;
  for (const Row& r : rows) {
    const int64_t span = v41::v41_exact_span(p, *r.conv), dspan = v41::v41_exact_decode_span(p, *r.conv);
    // A span past the prompt cannot be found in it: the search would end at N.
    const bool ok = r.found.last_probe == std::min(span, N) && r.found.decode_probe == std::min(dspan, N) &&
                    r.found.bitwise_at_probe && r.found.last_bitwise <= r.found.last_probe;
    agree = agree && ok;
    std::printf("%-10s %11lld %8lld %12lld %8lld %13lld %10s %9s  %s\n", r.conv->name, (long long)span,
                (long long)r.found.last_probe, (long long)dspan, (long long)r.found.decode_probe,
                (long long)r.found.last_bitwise, r.found.bitwise_at_probe ? "bitwise" : "DIFFERS",
                r.same_as ? fmt::format("= {}", r.same_as).c_str() : fmt::format("{:.1f}", r.seconds).c_str(),
                ok ? "ok" : "MISMATCH");
  }
  std::printf("found = the fewest replayed rows whose last logits (decode: next step's) stay finite under the probe; "
              "bitwise from = the fewest whose last logits are the full prefill's bits (rounding can absorb the "
              "cone's far end); at found = the replay of `found` rows bitwise the prefill\n");
  return agree ? 0 : 1;
}

}  // namespace ced::tools
