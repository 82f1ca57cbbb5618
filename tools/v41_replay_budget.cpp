// docs/v41.md §13.7: `ced replay-budget` on a v41 config. For every sample (weight seed, regime, N, token
// seed) the full prefill's last logits are exact recovery; each convention's replays of K rows are put
// beside them: KL, top-1, rel L2, bitwise equality, the drift of the last row's stream at every layer,
// the oracle's FLOP ratio and the measured time ratio. The tool writes the CSVs and the results page.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "compare/compare.hpp"
#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward.hpp"
#include "oracle/v41_flops.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"
#include "tools/v41_study.hpp"

namespace ced::tools {
namespace {

// One replay of one sample against its exact recovery.
struct Sample {
  std::string regime, convention;
  uint64_t weight_seed = 0, token_seed = 0;
  int64_t N = 0, K = 0;
  double kl = 0, rel_l2 = 0;
  bool top1 = false, bitwise = false;
  double flop_ratio = 0, time_ratio = 0;
  std::vector<double> drift;  // [L]: rel L2 of the last row's stream after each layer (0 below the cut)
};
// A shard's samples in its JSON file, each field by name (doubles written to read back to the same bits).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Sample, regime, convention, weight_seed, token_seed, N, K, kl, rel_l2, top1, bitwise,
                                   flop_ratio, time_ratio, drift)

// The last row's streams after a layer, from a result whose rows start at first_row.
std::span<const double> last_stream(const v41::V41ForwardResult& r, size_t layer, int64_t row) {
  const auto& out = r.layers[layer].out;
  return std::span<const double>(out).last(static_cast<size_t>(row));
}

// The replays a convention is measured at: the given list, or W, 2W, 4W, 8W, 16W, its decode span and its
// exact span; those below N only (K >= N is the full prefill itself).
std::vector<int64_t> replays_for(const V41ReplayBudgetOptions& o, const v41::V41Plan& p,
                                 const v41::V41ReplayConvention& conv, int64_t N) {
  std::set<int64_t> ks(o.replays.begin(), o.replays.end());
  if (ks.empty()) {
    for (int64_t m = 1; m <= 16; m *= 2) ks.insert(m * p.W);
    ks.insert(v41::v41_exact_decode_span(p, conv));
    ks.insert(v41::v41_exact_span(p, conv));
  }
  std::vector<int64_t> out;
  for (int64_t k : ks)
    if (k < N) out.push_back(k);
  return out;
}

std::string csv_samples(const std::vector<Sample>& s) {
  std::string t = "regime,weight_seed,N,token_seed,convention,K,kl,top1,rel_l2,bitwise,flop_ratio,time_ratio\n";
  for (const Sample& x : s)
    t += fmt::format("{},{},{},{},{},{},{:.6e},{},{:.6e},{},{:.6f},{:.4f}\n", x.regime, x.weight_seed, x.N,
                     x.token_seed, x.convention, x.K, x.kl, int(x.top1), x.rel_l2, int(x.bitwise), x.flop_ratio,
                     x.time_ratio);
  return t;
}

struct Row {
  std::string regime, convention;
  int64_t N = 0, K = 0, samples = 0;
  double kl_median = 0, kl_worst = 0, rel_median = 0, rel_worst = 0, top1 = 0, exact = 0, flop = 0, time = 0;
  std::vector<double> drift;  // [L] median over samples
};

std::vector<Row> aggregate(const std::vector<Sample>& s, int64_t L) {
  std::map<std::tuple<std::string, int64_t, std::string, int64_t>, std::vector<const Sample*>> groups;
  for (const Sample& x : s) groups[{x.regime, x.N, x.convention, x.K}].push_back(&x);
  std::vector<Row> rows;
  for (const auto& [key, g] : groups) {
    Row r;
    std::tie(r.regime, r.N, r.convention, r.K) = key;
    r.samples = static_cast<int64_t>(g.size());
    std::vector<double> kl, rel, time;
    for (const Sample* x : g) {
      kl.push_back(x->kl);
      rel.push_back(x->rel_l2);
      time.push_back(x->time_ratio);
      r.top1 += x->top1 ? 1.0 : 0.0;
      r.exact += x->bitwise ? 1.0 : 0.0;
    }
    r.kl_median = median(kl);
    r.kl_worst = *std::max_element(kl.begin(), kl.end());
    r.rel_median = median(rel);
    r.rel_worst = *std::max_element(rel.begin(), rel.end());
    r.top1 /= double(g.size());
    r.exact /= double(g.size());
    r.flop = g.front()->flop_ratio;
    r.time = median(time);
    for (int64_t l = 0; l < L; ++l) {
      std::vector<double> d;
      for (const Sample* x : g) d.push_back(x->drift[static_cast<size_t>(l)]);
      r.drift.push_back(median(d));
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string csv_rows(const std::vector<Row>& rows) {
  std::string t = "regime,N,convention,K,samples,kl_median,kl_worst,top1,rel_l2_median,rel_l2_worst,exact,flop_ratio,"
                  "time_ratio\n";
  for (const Row& r : rows)
    t += fmt::format("{},{},{},{},{},{:.6e},{:.6e},{:.4f},{:.6e},{:.6e},{:.4f},{:.6f},{:.4f}\n", r.regime, r.N,
                     r.convention, r.K, r.samples, r.kl_median, r.kl_worst, r.top1, r.rel_median, r.rel_worst, r.exact,
                     r.flop, r.time);
  return t;
}

std::string csv_drift(const std::vector<Row>& rows) {
  std::string t = "regime,N,convention,K,layer,drift_median\n";
  for (const Row& r : rows)
    for (size_t l = 0; l < r.drift.size(); ++l)
      t += fmt::format("{},{},{},{},{},{:.6e}\n", r.regime, r.N, r.convention, r.K, l, r.drift[l]);
  return t;
}

// The headline: per regime and N, for each convention its bounded replay (K = W or W + k), and the
// cheapest K at which every sample's top-1 agreed and the median KL stayed below 1e-6, with its cost.
std::string page(const V41ReplayBudgetOptions& o, const v41::V41Config& c, const v41::V41Plan& p,
                 const std::vector<Row>& rows, double wall_s, const std::string& command) {
  std::string s = fmt::format("# The replay budget on `{}`, per engine convention\n\n", c.name);
  s += fmt::format(
      "Written by `ced replay-budget` (docs/v41.md §13.7). The last prompt position's logits of each "
      "convention's CED prefill with K replayed rows against exact recovery (the full prefill's), on {} "
      "(L = {}, E = {}, W = {}), random weights of weight seeds {}, token seeds {}, regimes {}.\n\n",
      c.name, p.L, p.E, p.W, fmt::join(o.weight_seeds, ", "),
      o.token_seeds.empty() ? std::string("-") : fmt::format("{}..{}", o.token_seeds.front(), o.token_seeds.back()),
      fmt::join(o.regimes, ", "));
  if (o.merged_shards > 0)
    s += fmt::format("```sh\nfor i in $(seq 0 {1}); do {0} --shard $i/{2} --out {3}.shard$i; done  # or a Slurm array\n"
                     "ced merge {3}.shard*.json --out {3}\n```\n\n",
                     command, o.merged_shards - 1, o.merged_shards, o.out_name);
  else
    s += fmt::format("```sh\n{} --out {}\n```\n\n", command, o.out_name);
  if (o.merged_shards > 0)
    s += fmt::format("Run as {} shards (`--shard i/{}`, then `ced merge`): {:.1f} s ({:.1f} min) of wall time summed "
                     "over the shards ({} thread{} each).\n\n",
                     o.merged_shards, o.merged_shards, wall_s, wall_s / 60, o.threads, o.threads == 1 ? "" : "s");
  else
    s += fmt::format("Wall time {:.1f} s ({:.1f} min) on this machine ({} thread{}).\n\n", wall_s, wall_s / 60,
                     o.threads, o.threads == 1 ? "" : "s");
  s += "Exact spans (the plan's, docs/v41.md §13.1): ";
  std::vector<std::string> spans;
  for (const auto& name : o.conventions) {
    const auto& conv = v41::v41_replay_convention(name);
    spans.push_back(fmt::format("{} {}", name, v41::v41_exact_span(p, conv)));
  }
  s += fmt::format("{}.\n\n", fmt::join(spans, ", "));
  s += "## Headline: what each convention pays at the window, and the cheapest replay that agrees\n\n";
  s += "Columns: the bounded replay's median and worst KL(exact ‖ ced), top-1 agreement (fraction of samples) "
       "and FLOP ratio (the oracle's ced prefill over the full one, docs/v41.md §14); then the smallest K "
       "measured at which every sample's top-1 agreed and the median KL was below 1e-6, with its FLOP ratio.\n\n";
  s += "| regime | N | convention | bounded K | median KL | worst KL | top-1 | FLOP ratio | K for KL < 1e-6 | its FLOP ratio |\n";
  s += "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& regime : o.regimes)
    for (int64_t N : o.lengths)
      for (const auto& name : o.conventions) {
        const auto& conv = v41::v41_replay_convention(name);
        const int64_t B = v41::v41_bounded_tail(p, conv, o.speculative);
        const Row* bounded = nullptr;
        const Row* good = nullptr;
        for (const Row& r : rows) {
          if (r.regime != regime || r.N != N || r.convention != name) continue;
          if (r.K == B) bounded = &r;
          if (!good && r.top1 == 1.0 && r.kl_median < 1e-6) good = &r;
        }
        if (!bounded) continue;
        s += fmt::format("| {} | {} | {} | {} | {:.3e} | {:.3e} | {:.3f} | {:.4f} | {} | {} |\n", regime, N, name, B,
                         bounded->kl_median, bounded->kl_worst, bounded->top1, bounded->flop,
                         good ? fmt::format("{}", good->K) : "none below N",
                         good ? fmt::format("{:.4f}", good->flop) : "-");
      }
  s += "\n## Every replay measured\n\n";
  s += "| regime | N | convention | K | samples | median KL | worst KL | top-1 | median rel L2 | worst rel L2 | "
       "bitwise | FLOP ratio | time ratio |\n";
  s += "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Row& r : rows)
    s += fmt::format("| {} | {} | {} | {} | {} | {:.3e} | {:.3e} | {:.3f} | {:.3e} | {:.3e} | {:.3f} | {:.4f} | {:.3f} |\n",
                     r.regime, r.N, r.convention, r.K, r.samples, r.kl_median, r.kl_worst, r.top1, r.rel_median,
                     r.rel_worst, r.exact, r.flop, r.time);
  s += "\nThe time ratio is measured: the ced prefill's time (its encoding, the layers below the cut, and "
       "this replay) over the full prefill's, on the same sample; it carries the machine's noise. The FLOP ratio "
       "is the oracle's for the same ced prefill. The reference runs the cut layer on every row and then cuts it "
       "(the engines run only its sources there when it is floored), so its time ratio is above the FLOP one.\n";
  s += "\n## Drift per layer at the bounded replay\n\nThe median rel L2 of the last row's streams after each layer "
       "against the full prefill's (0 below the cut; the all-layers tail drifts from layer 0).\n\n";
  s += "| regime | N | convention |";
  std::vector<int64_t> shown;
  for (int64_t l = 0; l < p.L; l += std::max<int64_t>(1, p.L / 8)) shown.push_back(l);
  if (shown.back() != p.L - 1) shown.push_back(p.L - 1);
  if (std::find(shown.begin(), shown.end(), p.E) == shown.end()) shown.push_back(p.E);
  std::sort(shown.begin(), shown.end());
  for (int64_t l : shown) s += fmt::format(" layer {} |", l);
  s += "\n|---|---:|---|" + std::string(shown.size() * 5, ' ');
  s.resize(s.size() - shown.size() * 5);
  for (size_t i = 0; i < shown.size(); ++i) s += "---:|";
  s += "\n";
  for (const Row& r : rows) {
    const auto& conv = v41::v41_replay_convention(r.convention);
    if (r.K != v41::v41_bounded_tail(p, conv, o.speculative)) continue;
    s += fmt::format("| {} | {} | {} |", r.regime, r.N, r.convention);
    for (int64_t l : shown) s += fmt::format(" {:.2e} |", r.drift[static_cast<size_t>(l)]);
    s += "\n";
  }
  s += fmt::format("\nFiles: `{0}-samples.csv` (every replay of every sample), `{0}.csv` (this page's rows), "
                   "`{0}-drift.csv` (every layer).\n",
                   o.out_name);
  return s;
}

// A shard's file: the study it belongs to, its index, its time and its samples (every double written so
// that it reads back to the same bits).
nlohmann::json study_json(const V41ReplayBudgetOptions& o) {
  return {{"config", o.config},           {"lengths", o.lengths},     {"replays", o.replays},
          {"token_seeds", o.token_seeds}, {"weight_seeds", o.weight_seeds}, {"regimes", o.regimes},
          {"conventions", o.conventions}, {"speculative", o.speculative}, {"threads", o.threads},
          {"command", o.command}};
}

nlohmann::json shard_json(const V41ReplayBudgetOptions& o, const std::vector<Sample>& samples, double seconds) {
  nlohmann::json j = {{"kind", "ced replay-budget v41 shard"},
                      {"generator", fmt::format("ced-harness {}", CED_VERSION)},
                      {"shard", o.shard},
                      {"n_shards", o.n_shards},
                      {"seconds", seconds},
                      {"study", study_json(o)}};
  j["samples"] = samples;
  return j;
}

void write_outputs(const V41ReplayBudgetOptions& o, const v41::V41Config& c, const v41::V41Plan& p,
                   const std::vector<Sample>& samples, double wall_s);

}  // namespace

int replay_budget_v41(const V41ReplayBudgetOptions& o) {
  const v41::V41Config c = v41_config_named(o.config);
  const v41::V41Plan p = v41::make_v41_plan(c);
  v41::check_v41_fits_in_memory(c);
  if (o.lengths.empty()) throw InputError("--tokens: give the prompt lengths of a v41 study");
  for (const auto& name : o.conventions) v41::v41_replay_convention(name);  // InputError for an unknown one
  for (const auto& r : o.regimes) v41::v41_regime_from_name(r);
  check_writable(o.out);
  const v41::V41EngramHashing hashing = v41::v41_checkpoint_hashing(c);
  const int64_t row = c.hc_mult * c.dim, V = c.vocab_size;
  std::vector<Sample> samples;
  Stopwatch wall;
  int64_t unit = -1;  // the samples in study order; a shard runs those of its index modulo the shards
  for (uint64_t ws : o.weight_seeds) {
    const v41::V41Checkpoint ck = v41::make_v41_random_checkpoint(c, ws);
    for (const auto& regime_name : o.regimes) {
      v41::V41Model m(c, ck.weights, v41::v41_regime_from_name(regime_name));
      m.set_captures(false);  // the layers' outputs and logits only
      for (int64_t N : o.lengths)
        for (uint64_t ts : o.token_seeds) {
          if (++unit % o.n_shards != o.shard) continue;
          const std::vector<int64_t> tokens = v41_seeded_tokens(ts, c, N);
          // Exact recovery: the full prefill, timed. Then one encoding per cut (the engines' E, the
          // all-layers tail's 0), timed: a replay's time is its encoding's and its own, over the full one's.
          Stopwatch full_clock;
          const v41::V41ForwardResult exact = m.forward(tokens, hashing);
          const double full_s = full_clock.seconds();
          std::map<bool, v41::V41CedEncoding> encodings;
          std::map<bool, double> encoding_s;
          for (const auto& name : o.conventions) {
            const auto& conv = v41::v41_replay_convention(name);
            if (!encodings.count(conv.all_layers)) {
              Stopwatch sw;
              encodings.emplace(conv.all_layers, m.ced_encoding(tokens, hashing, conv));
              encoding_s[conv.all_layers] = sw.seconds();
            }
            const std::span<const double> want = last_logits(exact, V);
            for (int64_t K : replays_for(o, p, conv, N)) {
              Stopwatch sw;
              const v41::V41ForwardResult r = m.forward_ced(encodings.at(conv.all_layers), K, conv);
              const double t = sw.seconds();
              const std::span<const double> got = last_logits(r, V);
              const LogitsCompare lc = compare_logits(got, want, {1, V});
              Sample x{regime_name, name, ws, ts, N, K, 0, 0, false, false, 0, 0, {}};
              x.kl = lc.mean_kl;
              x.top1 = lc.top1_agree == 1;
              x.rel_l2 = rel_l2(got, want);
              x.bitwise = std::equal(got.begin(), got.end(), want.begin());
              x.flop_ratio = ced_flop_ratio(c, p, conv, N, K);
              x.time_ratio = (encoding_s.at(conv.all_layers) + t) / full_s;
              for (size_t l = 0; l < r.layers.size(); ++l)
                x.drift.push_back(rel_l2(last_stream(r, l, row), last_stream(exact, l, row)));
              samples.push_back(std::move(x));
            }
          }
          std::fprintf(stderr, "  [%7.1fs] weight seed %llu, %s, N = %lld, token seed %llu\n", wall.seconds(),
                       (unsigned long long)ws, regime_name.c_str(), (long long)N, (unsigned long long)ts);
        }
    }
  }
  if (o.n_shards > 1) {
    write_text_atomically(o.out + ".json", shard_json(o, samples, wall.seconds()).dump(1) + "\n");
    std::printf("wrote shard %lld/%lld: %s.json (%zu replays, %.1f s); combine the shards with `ced merge`\n",
                (long long)o.shard, (long long)o.n_shards, o.out.c_str(), samples.size(), wall.seconds());
    return 0;
  }
  write_outputs(o, c, p, samples, wall.seconds());
  return 0;
}

namespace {
void write_outputs(const V41ReplayBudgetOptions& o, const v41::V41Config& c, const v41::V41Plan& p,
                   const std::vector<Sample>& samples, double wall_s) {
  const std::vector<Row> rows = aggregate(samples, p.L);
  write_text_atomically(o.out + "-samples.csv", csv_samples(samples));
  write_text_atomically(o.out + ".csv", csv_rows(rows));
  write_text_atomically(o.out + "-drift.csv", csv_drift(rows));
  write_text_atomically(o.out + ".md", page(o, c, p, rows, wall_s, o.command));
  std::printf("wrote %s.md, %s.csv, %s-samples.csv, %s-drift.csv: %zu replays in %.1f s\n", o.out.c_str(),
              o.out.c_str(), o.out.c_str(), o.out.c_str(), samples.size(), wall_s);
}
}  // namespace

int merge_v41(const std::vector<std::string>& files, const std::string& out) {
  check_writable(out);
  V41ReplayBudgetOptions o;
  std::string first_file;
  nlohmann::json first_study;
  std::map<int64_t, std::string> seen;
  int64_t n_shards = 0;
  double seconds = 0;
  std::vector<Sample> samples;
  for (const std::string& f : files) {
    nlohmann::json j;
    try {
      std::ifstream in(f, std::ios::binary);
      if (!in) throw InputError("cannot read the file");
      j = nlohmann::json::parse(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
      if (j.at("kind") != "ced replay-budget v41 shard") throw InputError("not a shard of a v41 study");
      const int64_t i = j.at("shard"), n = j.at("n_shards");
      if (first_file.empty()) {
        first_file = f;
        first_study = j.at("study");
        n_shards = n;
      } else if (j.at("study") != first_study) {
        throw InputError(fmt::format("another study than '{}'s", first_file));
      } else if (n != n_shards) {
        throw InputError(fmt::format("shard {} of {}, '{}' one of {}", i, n, first_file, n_shards));
      }
      if (i < 0 || i >= n) throw InputError(fmt::format("shard {} of {}", i, n));
      if (!seen.emplace(i, f).second)
        throw InputError(fmt::format("shard {}/{} given twice (also '{}')", i, n, seen[i]));
      seconds += j.at("seconds").get<double>();
      for (Sample& x : j.at("samples").get<std::vector<Sample>>()) samples.push_back(std::move(x));
    } catch (const nlohmann::json::exception& e) {
      throw InputError(fmt::format("'{}': not a v41 study shard ({})", f, e.what()));
    } catch (const InputError& e) {
      throw InputError(fmt::format("'{}': {}", f, e.what()));
    }
  }
  std::vector<int64_t> missing;
  for (int64_t i = 0; i < n_shards; ++i)
    if (!seen.count(i)) missing.push_back(i);
  if (!missing.empty())
    throw InputError(fmt::format("shard{} {} of {} missing", missing.size() > 1 ? "s" : "", fmt::join(missing, ", "),
                                 n_shards));
  o.config = first_study.at("config");
  o.lengths = first_study.at("lengths").get<std::vector<int64_t>>();
  o.replays = first_study.at("replays").get<std::vector<int64_t>>();
  o.token_seeds = first_study.at("token_seeds").get<std::vector<uint64_t>>();
  o.weight_seeds = first_study.at("weight_seeds").get<std::vector<uint64_t>>();
  o.regimes = first_study.at("regimes").get<std::vector<std::string>>();
  o.conventions = first_study.at("conventions").get<std::vector<std::string>>();
  o.speculative = first_study.at("speculative");
  o.threads = first_study.at("threads");
  o.command = first_study.at("command");
  o.out = out;
  o.out_name = std::filesystem::path(out).filename().string();
  o.merged_shards = n_shards;
  const v41::V41Config c = v41_config_named(o.config);
  const v41::V41Plan p = v41::make_v41_plan(c);
  // The study's own order: weight seed, regime, N, token seed, then convention and K as they were run.
  auto index_of = [](const auto& v, const auto& x) { return std::find(v.begin(), v.end(), x) - v.begin(); };
  std::stable_sort(samples.begin(), samples.end(), [&](const Sample& a, const Sample& b) {
    return std::tuple(index_of(o.weight_seeds, a.weight_seed), index_of(o.regimes, a.regime), index_of(o.lengths, a.N),
                      index_of(o.token_seeds, a.token_seed)) <
           std::tuple(index_of(o.weight_seeds, b.weight_seed), index_of(o.regimes, b.regime), index_of(o.lengths, b.N),
                      index_of(o.token_seeds, b.token_seed));
  });
  const size_t units = o.weight_seeds.size() * o.regimes.size() * o.lengths.size() * o.token_seeds.size();
  std::set<std::tuple<uint64_t, std::string, int64_t, uint64_t>> have;
  for (const Sample& s : samples) have.insert({s.weight_seed, s.regime, s.N, s.token_seed});
  if (have.size() != units)
    throw InputError(fmt::format("the shards hold {} of the study's {} samples (a damaged or edited shard)",
                                 have.size(), units));
  write_outputs(o, c, p, samples, seconds);
  return 0;
}

}  // namespace ced::tools
