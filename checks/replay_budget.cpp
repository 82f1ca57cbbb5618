#include "checks/replay_budget.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "backends/registry.hpp"
#include "checks/harness.hpp"
#include "model/error.hpp"
#include "models/lab/weights.hpp"
#include "oracle/analytic_flops.hpp"
#include "reference/lab/replays.hpp"

namespace ced::prop {
namespace {

const std::vector<std::string> kKinds = {"prefill", "layer", "decode"};

double kind_code(const std::string& kind) {
  return double(std::find(kKinds.begin(), kKinds.end(), kind) - kKinds.begin());
}

template <class T>
std::vector<T> sorted_distinct(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// The FLOP model's prefill of N with replay B (B = 0: full mode), last logits only, no decode.
int64_t prefill_flops(const Config& c, const Plan& p, int64_t N, int64_t B) {
  FlopQuery q;
  q.mode = B == 0 ? Mode::Full : Mode::Ced;
  if (B) q.replay = ReplayPolicy::parse(std::to_string(B));
  q.n_prompt = N;
  q.logits = LogitsScope::Last;
  return flop_model(c, p, q).total();
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean_of(const std::vector<double>& v) {
  double s = 0;  // summed in the samples' canonical order
  for (double x : v) s += x;
  return s / double(v.size());
}

// Percentile bootstrap 95 % interval of the median: nearest-rank 2.5 % and 97.5 %.
std::pair<double, double> bootstrap_median(const std::vector<double>& v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> medians(static_cast<size_t>(kBootstrapResamples)), pick(v.size());
  for (auto& m : medians) {
    // rng() % n: the standard fixes mt19937_64's stream but not
    // uniform_int_distribution's; the modulo bias (n / 2^64) is negligible.
    for (auto& x : pick) x = v[size_t(rng() % v.size())];
    m = median_of(pick);
  }
  std::sort(medians.begin(), medians.end());
  const auto at = [&](double q) { return medians[size_t(std::ceil(q * double(medians.size()))) - 1]; };
  return {at(0.025), at(0.975)};
}

auto sample_key(const BudgetSample& s) {
  return std::make_tuple(s.weight_seed, s.drift.n_prompt, s.token_seed, s.drift.replay, kind_code(s.drift.kind),
                         s.drift.step, s.drift.layer);
}

}  // namespace

int64_t default_budget_length(const Plan& p) {
  int64_t N = p.W;
  while (N <= p.exact_replay()) N *= 2;
  return N;
}

std::vector<int64_t> default_budget_replays(const Plan& p, int64_t N) {
  const int64_t R = p.exact_replay();
  std::vector<int64_t> b;
  for (int64_t x = p.W; x < R - 1; x *= 2) b.push_back(x);
  for (int64_t x : {R - 1, R, N}) b.push_back(x);
  for (auto& x : b) x = std::max<int64_t>(1, std::min(N, x));
  return sorted_distinct(b);
}

std::vector<int64_t> budget_replays(const Plan& p, int64_t N, const std::vector<int64_t>& replays) {
  if (replays.empty()) return default_budget_replays(p, N);
  std::vector<int64_t> b = replays;
  for (auto& x : b) x = std::min(N, x);
  return sorted_distinct(b);
}

std::vector<BudgetUnit> budget_units(const BudgetOptions& o, bool this_shard_only) {
  if (o.n_shards < 1 || o.shard < 0 || o.shard >= o.n_shards)
    throw InputError(fmt::format("--shard: {}/{} is not i/n with 0 <= i < n", o.shard, o.n_shards));
  const auto ws = sorted_distinct(o.weight_seeds.empty() ? std::vector<uint64_t>{0} : o.weight_seeds);
  std::vector<uint64_t> ts = o.token_seeds;
  if (ts.empty())
    for (uint64_t s = 0; s < 8; ++s) ts.push_back(s);
  ts = sorted_distinct(ts);
  const auto Ns = sorted_distinct(o.lengths);
  std::vector<BudgetUnit> units;
  int64_t k = 0;
  for (uint64_t w : ws)
    for (int64_t N : Ns)
      for (uint64_t t : ts) {
        if (!this_shard_only || k % o.n_shards == o.shard) units.push_back({w, N, t});
        ++k;
      }
  return units;
}

BudgetData replay_budget(const Config& c, const BudgetOptions& o,
                         const std::function<void(int64_t, int64_t, const std::string&)>& progress) {
  const Plan p = make_plan(c);
  const std::vector<BudgetUnit> units = budget_units(o, true);
  int64_t Nmax = 1;
  for (const auto& u : units) Nmax = std::max(Nmax, u.n_prompt);
  check_fits_in_memory(c, Nmax + o.decode, o.backend);
  BudgetData d;
  std::unique_ptr<Backend> be;
  uint64_t be_seed = 0;
  int64_t done = 0;
  for (const BudgetUnit& u : units) {
    if (!be || be_seed != u.weight_seed)
      be = o.make_backend ? o.make_backend(c, be_seed = u.weight_seed) : make_backend(o.backend, c, be_seed = u.weight_seed);
    const int64_t N = u.n_prompt, K = o.decode, V = c.vocab_size;
    const std::vector<int64_t> Bs = budget_replays(p, N, o.replays);
    // The exact reference first (ced with B = N: s = 0, bitwise the full mode, docs/spec.md §4.4).
    std::vector<ReplayPolicy> policies = {ReplayPolicy::parse(std::to_string(N))};
    for (int64_t B : Bs)
      if (B != N) policies.push_back(ReplayPolicy::parse(std::to_string(B)));
    RunRequest req;
    req.mode = Mode::Ced;
    req.n_prompt = N;
    req.decode_steps = K;
    req.tokens = make_tokens(u.token_seed, V, N + K);
    req.logits = LogitsScope::Last;
    req.capture_layers = true;
    const double full_flops = double(prefill_flops(c, p, N, 0));
    RunResult ref;
    bool have_ref = false;
    auto measure = [&](const RunResult& res) {
      const int64_t B = res.n_replay;
      auto sample = [&](const std::string& kind) {
        BudgetSample s;
        s.drift.kind = kind;
        s.drift.n_prompt = N;
        s.drift.replay = B;
        s.weight_seed = u.weight_seed;
        s.token_seed = u.token_seed;
        s.flop_ratio = double(prefill_flops(c, p, N, B)) / full_flops;
        RunRequest r = req;
        r.replay = res.replay;
        s.flops_match = flop_model(c, p, flop_query(r)).per_layer == res.flops.per_layer;
        return s;
      };
      BudgetSample pre = sample("prefill");
      fill_metrics(pre.drift, res.logits.row(0).data(), ref.logits.row(0).data(), V, true);
      d.samples.push_back(pre);
      for (int64_t k = 0; k < K; ++k) {
        BudgetSample s = sample("decode");
        s.drift.step = k;
        fill_metrics(s.drift, res.logits.row(1 + k).data(), ref.logits.row(1 + k).data(), V, true);
        d.samples.push_back(s);
      }
      for (int64_t l = p.E; l < p.L; ++l) {
        // the last prompt position: row N-1-s of the capture of layer l
        const auto &bl = res.layers[size_t(l)], &el = ref.layers[size_t(l)];
        const auto row = [&](const LayerCapture& lc) {
          return std::find(lc.positions.begin(), lc.positions.end(), N - 1) - lc.positions.begin();
        };
        BudgetSample s = sample("layer");
        s.drift.layer = l;
        fill_metrics(s.drift, bl.out.row(row(bl)).data(), el.out.row(row(el)).data(), c.d_model, false);
        d.samples.push_back(s);
      }
      d.timings.push_back({N, B, u.weight_seed, u.token_seed, res.prefill_seconds, ref.prefill_seconds,
                           res.decode_seconds});
    };
    run_replays(*be, req, policies, [&](RunResult&& res) {
      if (!have_ref) {
        ref = std::move(res);
        have_ref = true;
        if (std::find(Bs.begin(), Bs.end(), N) != Bs.end()) measure(ref);
        return;
      }
      measure(res);
    });
    if (progress)
      progress(++done, int64_t(units.size()),
               fmt::format("N = {}, weight seed {}, token seed {}", N, u.weight_seed, u.token_seed));
  }
  sort_budget_data(d);
  return d;
}

std::string check_budget_curve(const Plan& p, const std::vector<BudgetSample>& samples) {
  std::string f;
  for (const BudgetSample& s : samples) {
    const DriftRow& r = s.drift;
    const int64_t N = r.n_prompt;
    int64_t bound = 0;
    std::string what;
    if (r.kind == "prefill") {
      bound = std::min(N, p.exact_replay());
      what = "the last logits";
    } else if (r.kind == "layer") {
      bound = std::min(N, 1 + (r.layer - p.E + 1) * (p.W - 1));
      what = fmt::format("decoder layer {}'s output at N - 1", r.layer);
    } else {
      bound = std::min(N, std::max<int64_t>(1, p.exact_decode_replay()));
      what = fmt::format("decode step {}'s logits", r.step);
    }
    const std::string at = fmt::format("N = {}, B = {}, weight seed {}, token seed {}", N, r.replay, s.weight_seed,
                                       s.token_seed);
    if (r.replay >= bound && !r.exact)
      f += fmt::format("{}: {} differ from exact recovery (rel L2 {:.3e}) though B >= {}\n", at, what, r.rel_l2, bound);
    if (!s.flops_match) f += fmt::format("{} ({}): the counted FLOPs differ from the FLOP model\n", at, r.kind);
  }
  return f;
}

namespace {

// What differs between a session's result and a separate run of the same
// request, one line each, prefixed with `at`; "" when nothing does.
std::string differences(const RunResult& got, const RunResult& want, const std::string& at) {
  std::string f;
  if (got.replay.str() != want.replay.str() || got.n_replay != want.n_replay || got.replay_start != want.replay_start ||
      got.decode_steps != want.decode_steps)
    f += at + ": the request's attributes differ\n";
  if (got.positions != want.positions || !bits_equal(got.logits, want.logits)) f += at + ": the logits differ\n";
  if (got.flops.per_layer != want.flops.per_layer) f += at + ": the FLOP counts differ\n";
  if (got.layers.size() != want.layers.size()) f += at + ": the captured layers differ in number\n";
  for (size_t l = 0; l < std::min(got.layers.size(), want.layers.size()); ++l) {
    const auto &g = got.layers[l], &w = want.layers[l];
    if (g.positions != w.positions || !bits_equal(g.out, w.out) || g.has_topk != w.has_topk ||
        (g.has_topk && g.topk != w.topk))
      f += fmt::format("{}: layer {}'s capture differs\n", at, l);
  }
  return f;
}

}  // namespace

std::string check_run_replays(Backend& be, const RunRequest& req, const std::vector<ReplayPolicy>& replays) {
  std::string f;
  size_t i = 0;
  run_replays(be, req, replays, [&](RunResult&& got) {
    if (i >= replays.size()) {
      f += "run_replays handed back more results than policies\n";
      return;
    }
    RunRequest r = req;
    r.replay = replays[i++];
    f += differences(got, be.run(r), "replay " + r.replay.str());
  });
  if (i != replays.size()) f += fmt::format("run_replays handed back {} results for {} policies\n", i, replays.size());
  return f;
}

std::string check_replay_session(Backend& be, const RunRequest& base, const std::vector<RunRequest>& probes) {
  std::string f;
  const auto session = open_replays(be, base);
  for (size_t i = 0; i < probes.size(); ++i) {
    const RunRequest& r = probes[i];
    const RunResult got = session->run(r);  // before the separate run: the session must not lean on it
    f += differences(got, be.run(r),
                     fmt::format("probe {} (replay {}, decode {}, {}, logits {})", i, r.replay.str(), r.decode_steps,
                                 r.poison_truncated ? "probe" : "no probe", r.logits == LogitsScope::Last ? "last" : "all"));
  }
  return f;
}

void sort_budget_data(BudgetData& d) {
  std::stable_sort(d.samples.begin(), d.samples.end(),
                   [](const BudgetSample& a, const BudgetSample& b) { return sample_key(a) < sample_key(b); });
  std::stable_sort(d.timings.begin(), d.timings.end(), [](const BudgetTiming& a, const BudgetTiming& b) {
    return std::tie(a.weight_seed, a.n_prompt, a.token_seed, a.replay) <
           std::tie(b.weight_seed, b.n_prompt, b.token_seed, b.replay);
  });
}

std::vector<BudgetAggregate> aggregate_budget(const std::vector<BudgetSample>& samples, uint64_t bootstrap_seed) {
  // Group key (kind, N, B, step, layer), in that order: each kind's rows of
  // one N (and one B) are contiguous, the lines the plots draw.
  using Key = std::tuple<double, int64_t, int64_t, int64_t, int64_t>;
  std::map<Key, std::vector<const BudgetSample*>> groups;
  for (const auto& s : samples)
    groups[{kind_code(s.drift.kind), s.drift.n_prompt, s.drift.replay, s.drift.step, s.drift.layer}].push_back(&s);
  std::vector<BudgetAggregate> rows;
  uint64_t index = 0;
  for (const auto& [key, g] : groups) {
    BudgetAggregate a;
    a.kind = g.front()->drift.kind;
    a.n_prompt = g.front()->drift.n_prompt;
    a.replay = g.front()->drift.replay;
    a.layer = g.front()->drift.layer;
    a.step = g.front()->drift.step;
    a.n_seeds = int64_t(g.size());
    a.flop_ratio = g.front()->flop_ratio;
    std::vector<double> rel, kl, top1, top5, ex;
    for (const BudgetSample* s : g) {
      rel.push_back(s->drift.rel_l2);
      kl.push_back(s->drift.kl);
      top1.push_back(s->drift.top1);
      top5.push_back(s->drift.top5);
      ex.push_back(s->drift.exact ? 1 : 0);
      a.flops_match = a.flops_match && s->flops_match;
    }
    a.rel_l2_mean = mean_of(rel);
    a.rel_l2_median = median_of(rel);
    a.rel_l2_worst = *std::max_element(rel.begin(), rel.end());
    std::tie(a.rel_l2_ci_lo, a.rel_l2_ci_hi) = bootstrap_median(rel, bootstrap_seed + 2 * index);
    a.kl_mean = mean_of(kl);
    a.kl_median = median_of(kl);
    a.kl_worst = *std::max_element(kl.begin(), kl.end());
    std::tie(a.kl_ci_lo, a.kl_ci_hi) = bootstrap_median(kl, bootstrap_seed + 2 * index + 1);
    a.top1 = mean_of(top1);
    a.top5_mean = mean_of(top5);
    a.top5_worst = *std::min_element(top5.begin(), top5.end());
    a.exact = mean_of(ex);
    rows.push_back(a);
    ++index;
  }
  // Pareto frontier per N over the prefill rows: B ascending is cost ascending
  // (the FLOP ratio grows with B), so a row is on it iff its median is below
  // every cheaper row's.
  std::map<int64_t, double> best;
  for (auto& a : rows)
    if (a.kind == "prefill") {
      auto it = best.find(a.n_prompt);
      a.pareto = it == best.end() || a.rel_l2_median < it->second;
      if (a.pareto) best[a.n_prompt] = a.rel_l2_median;
    }
  return rows;
}

std::string budget_csv(const std::vector<BudgetAggregate>& rows) {
  std::string s =
      "kind,n_prompt,replay,layer,step,n_seeds,flop_ratio,rel_l2_mean,rel_l2_median,rel_l2_worst,rel_l2_ci_lo,"
      "rel_l2_ci_hi,kl_mean,kl_median,kl_worst,kl_ci_lo,kl_ci_hi,top1,top5_mean,top5_worst,bitwise_exact,"
      "flops_match,pareto\n";
  for (const auto& a : rows)
    s += fmt::format(
        "{},{},{},{},{},{},{:.9f},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.4f},{:.4f},"
        "{:.4f},{:.4f},{},{}\n",
        a.kind, a.n_prompt, a.replay, a.layer, a.step, a.n_seeds, a.flop_ratio, a.rel_l2_mean, a.rel_l2_median,
        a.rel_l2_worst, a.rel_l2_ci_lo, a.rel_l2_ci_hi, a.kl_mean, a.kl_median, a.kl_worst, a.kl_ci_lo, a.kl_ci_hi,
        a.top1, a.top5_mean, a.top5_worst, a.exact, a.flops_match ? 1 : 0, a.pareto ? 1 : 0);
  return s;
}

std::string budget_samples_csv(const std::vector<BudgetSample>& samples) {
  std::string s =
      "kind,n_prompt,replay,layer,step,weight_seed,token_seed,rel_l2,max_abs,kl,top1,top5,bitwise_exact,flop_ratio,"
      "flops_match\n";
  for (const auto& x : samples) {
    const DriftRow& r = x.drift;
    s += fmt::format("{},{},{},{},{},{},{},{:.6e},{:.6e},{:.6e},{:.4f},{:.4f},{},{:.9f},{}\n", r.kind, r.n_prompt,
                     r.replay, r.layer, r.step, x.weight_seed, x.token_seed, r.rel_l2, r.max_abs, r.kl, r.top1, r.top5,
                     r.exact ? 1 : 0, x.flop_ratio, x.flops_match ? 1 : 0);
  }
  return s;
}

std::string budget_timing_csv(const std::vector<BudgetTiming>& timings) {
  std::string s =
      "n_prompt,replay,weight_seed,token_seed,prefill_seconds,reference_prefill_seconds,time_ratio,decode_seconds\n";
  for (const auto& t : timings)
    s += fmt::format("{},{},{},{},{:.6f},{:.6f},{:.6f},{:.6f}\n", t.n_prompt, t.replay, t.weight_seed, t.token_seed,
                     t.prefill_seconds, t.reference_prefill_seconds, t.prefill_seconds / t.reference_prefill_seconds,
                     t.decode_seconds);
  return s;
}

std::string budget_table(const std::vector<BudgetAggregate>& rows, const std::vector<BudgetTiming>& timings,
                         const Plan& p) {
  std::map<std::pair<int64_t, int64_t>, std::vector<double>> ratio;  // (N, B): measured time ratios
  for (const auto& t : timings) ratio[{t.n_prompt, t.replay}].push_back(t.prefill_seconds / t.reference_prefill_seconds);
  std::map<std::pair<int64_t, int64_t>, double> decode_worst;  // (N, B): worst decode step's median rel L2
  for (const auto& a : rows)
    if (a.kind == "decode") {
      double& w = decode_worst[{a.n_prompt, a.replay}];
      w = std::max(w, a.rel_l2_median);
    }
  std::string s = fmt::format(
      "replay budget: ced with replay B against exact recovery, last prompt position (R = {}, decode exact from B = "
      "{})\n{:>7} {:>6} {:>5} {:>11} {:>25} {:>10} {:>10} {:>6} {:>6} {:>11} {:>10} {:>10}\n",
      p.exact_replay(), p.exact_decode_replay(), "N", "B", "seeds", "median relL2", "95% interval", "worst",
      "median KL", "top-1", "exact", "decode med", "FLOP ratio", "time ratio");
  for (const auto& a : rows) {
    if (a.kind != "prefill") continue;
    const auto it = ratio.find({a.n_prompt, a.replay});
    s += fmt::format("{:>7} {:>6} {:>5} {:>11.3e} [{:>10.3e}, {:>10.3e}] {:>10.3e} {:>10.3e} {:>6.3f} {:>6.3f} {:>11.3e} "
                     "{:>10.4f} {:>10}{}\n",
                     a.n_prompt, a.replay, a.n_seeds, a.rel_l2_median, a.rel_l2_ci_lo, a.rel_l2_ci_hi, a.rel_l2_worst,
                     a.kl_median, a.top1, a.exact, decode_worst[{a.n_prompt, a.replay}], a.flop_ratio,
                     it == ratio.end() ? std::string("-") : fmt::format("{:.4f}", median_of(it->second)),
                     a.flops_match ? "" : "  FLOP COUNT DIFFERS FROM THE MODEL");
  }
  s += "reading: the smallest B whose median last-logits rel L2 is below each level (FLOP ratio there)\n";
  std::set<int64_t> Ns;
  for (const auto& a : rows) Ns.insert(a.n_prompt);
  for (int64_t N : Ns) {
    s += fmt::format("  N = {}:", N);
    for (const auto& [name, level] : std::vector<std::pair<std::string, double>>{{"< 1e-3", 1e-3}, {"< 1e-6", 1e-6}}) {
      const BudgetAggregate* hit = nullptr;
      for (const auto& a : rows)
        if (a.kind == "prefill" && a.n_prompt == N && a.rel_l2_median < level && !hit) hit = &a;
      s += hit ? fmt::format("  {} at B = {} ({:.4f})", name, hit->replay, hit->flop_ratio)
               : fmt::format("  {} nowhere measured", name);
    }
    const BudgetAggregate* zero = nullptr;
    for (const auto& a : rows)
      if (a.kind == "prefill" && a.n_prompt == N && a.rel_l2_median == 0 && !zero) zero = &a;
    s += zero ? fmt::format("  = 0 at B = {} ({:.4f})\n", zero->replay, zero->flop_ratio) : "  = 0 nowhere measured\n";
  }
  return s;
}

Columns aggregate_columns(const std::vector<BudgetAggregate>& rows) {
  Columns c;
  auto col = [&](const std::string& name, auto get) {
    std::vector<double> v;
    for (const auto& a : rows) v.push_back(double(get(a)));
    c.emplace_back(name, std::move(v));
  };
  using A = BudgetAggregate;
  col("kind", [](const A& a) { return kind_code(a.kind); });
  col("n_prompt", [](const A& a) { return a.n_prompt; });
  col("replay", [](const A& a) { return a.replay; });
  col("layer", [](const A& a) { return a.layer; });
  col("step", [](const A& a) { return a.step; });
  col("n_seeds", [](const A& a) { return a.n_seeds; });
  col("flop_ratio", [](const A& a) { return a.flop_ratio; });
  col("rel_l2_mean", [](const A& a) { return a.rel_l2_mean; });
  col("rel_l2_median", [](const A& a) { return a.rel_l2_median; });
  col("rel_l2_worst", [](const A& a) { return a.rel_l2_worst; });
  col("rel_l2_ci_lo", [](const A& a) { return a.rel_l2_ci_lo; });
  col("rel_l2_ci_hi", [](const A& a) { return a.rel_l2_ci_hi; });
  col("kl_mean", [](const A& a) { return a.kl_mean; });
  col("kl_median", [](const A& a) { return a.kl_median; });
  col("kl_worst", [](const A& a) { return a.kl_worst; });
  col("kl_ci_lo", [](const A& a) { return a.kl_ci_lo; });
  col("kl_ci_hi", [](const A& a) { return a.kl_ci_hi; });
  col("top1", [](const A& a) { return a.top1; });
  col("top5_mean", [](const A& a) { return a.top5_mean; });
  col("top5_worst", [](const A& a) { return a.top5_worst; });
  col("bitwise_exact", [](const A& a) { return a.exact; });
  col("flops_match", [](const A& a) { return a.flops_match ? 1 : 0; });
  col("pareto", [](const A& a) { return a.pareto ? 1 : 0; });
  return c;
}

Columns sample_columns(const std::vector<BudgetSample>& samples) {
  Columns c;
  auto col = [&](const std::string& name, auto get) {
    std::vector<double> v;
    for (const auto& s : samples) v.push_back(double(get(s)));
    c.emplace_back(name, std::move(v));
  };
  using S = BudgetSample;
  col("kind", [](const S& s) { return kind_code(s.drift.kind); });
  col("n_prompt", [](const S& s) { return s.drift.n_prompt; });
  col("replay", [](const S& s) { return s.drift.replay; });
  col("layer", [](const S& s) { return s.drift.layer; });
  col("step", [](const S& s) { return s.drift.step; });
  col("weight_seed", [](const S& s) { return s.weight_seed; });
  col("token_seed", [](const S& s) { return s.token_seed; });
  col("rel_l2", [](const S& s) { return s.drift.rel_l2; });
  col("max_abs", [](const S& s) { return s.drift.max_abs; });
  col("kl", [](const S& s) { return s.drift.kl; });
  col("top1", [](const S& s) { return s.drift.top1; });
  col("top5", [](const S& s) { return s.drift.top5; });
  col("bitwise_exact", [](const S& s) { return s.drift.exact ? 1 : 0; });
  col("flop_ratio", [](const S& s) { return s.flop_ratio; });
  col("flops_match", [](const S& s) { return s.flops_match ? 1 : 0; });
  return c;
}

Columns timing_columns(const std::vector<BudgetTiming>& timings) {
  Columns c;
  auto col = [&](const std::string& name, auto get) {
    std::vector<double> v;
    for (const auto& t : timings) v.push_back(double(get(t)));
    c.emplace_back(name, std::move(v));
  };
  using T = BudgetTiming;
  col("n_prompt", [](const T& t) { return t.n_prompt; });
  col("replay", [](const T& t) { return t.replay; });
  col("weight_seed", [](const T& t) { return t.weight_seed; });
  col("token_seed", [](const T& t) { return t.token_seed; });
  col("prefill_seconds", [](const T& t) { return t.prefill_seconds; });
  col("reference_prefill_seconds", [](const T& t) { return t.reference_prefill_seconds; });
  col("decode_seconds", [](const T& t) { return t.decode_seconds; });
  return c;
}

namespace {

// The column `name` of `cols`, every value a whole number in [lo, hi] when `integer`.
const std::vector<double>& column(const Columns& cols, const std::string& group, const std::string& name,
                                  bool integer = false, double lo = 0, double hi = 0) {
  for (const auto& [n, v] : cols)
    if (n == name) {
      if (integer)
        for (double x : v)
          if (!(x >= lo && x <= hi) || x != std::floor(x))
            throw InputError(fmt::format("/{}/{}: value {} is not a whole number in [{}, {}]", group, name, x, lo, hi));
      return v;
    }
  throw InputError(fmt::format("/{}/{}: is missing", group, name));
}

constexpr double kMaxExact = 9007199254740992.0;  // 2^53: every whole number up to it is a double

}  // namespace

std::vector<BudgetSample> samples_from_columns(const Columns& cols) {
  const std::string g = "samples";
  const auto& kind = column(cols, g, "kind", true, 0, double(kKinds.size() - 1));
  const auto& n = column(cols, g, "n_prompt", true, 1, kMaxExact);
  const auto& b = column(cols, g, "replay", true, 1, kMaxExact);
  const auto& l = column(cols, g, "layer", true, -1, kMaxExact);
  const auto& st = column(cols, g, "step", true, -1, kMaxExact);
  const auto& ws = column(cols, g, "weight_seed", true, 0, kMaxExact);
  const auto& ts = column(cols, g, "token_seed", true, 0, kMaxExact);
  const auto& rel = column(cols, g, "rel_l2");
  const auto& mabs = column(cols, g, "max_abs");
  const auto& kl = column(cols, g, "kl");
  const auto& t1 = column(cols, g, "top1");
  const auto& t5 = column(cols, g, "top5");
  const auto& ex = column(cols, g, "bitwise_exact", true, 0, 1);
  const auto& fr = column(cols, g, "flop_ratio");
  const auto& fm = column(cols, g, "flops_match", true, 0, 1);
  std::vector<BudgetSample> out(kind.size());
  for (size_t i = 0; i < out.size(); ++i) {
    BudgetSample& s = out[i];
    s.drift.kind = kKinds[size_t(kind[i])];
    s.drift.n_prompt = int64_t(n[i]);
    s.drift.replay = int64_t(b[i]);
    s.drift.layer = int64_t(l[i]);
    s.drift.step = int64_t(st[i]);
    s.weight_seed = uint64_t(ws[i]);
    s.token_seed = uint64_t(ts[i]);
    s.drift.rel_l2 = rel[i];
    s.drift.max_abs = mabs[i];
    s.drift.kl = kl[i];
    s.drift.top1 = t1[i];
    s.drift.top5 = t5[i];
    s.drift.exact = ex[i] == 1;
    s.flop_ratio = fr[i];
    s.flops_match = fm[i] == 1;
  }
  return out;
}

std::vector<BudgetTiming> timings_from_columns(const Columns& cols) {
  const std::string g = "timings";
  const auto& n = column(cols, g, "n_prompt", true, 1, kMaxExact);
  const auto& b = column(cols, g, "replay", true, 1, kMaxExact);
  const auto& ws = column(cols, g, "weight_seed", true, 0, kMaxExact);
  const auto& ts = column(cols, g, "token_seed", true, 0, kMaxExact);
  const auto& ps = column(cols, g, "prefill_seconds");
  const auto& rs = column(cols, g, "reference_prefill_seconds");
  const auto& ds = column(cols, g, "decode_seconds");
  std::vector<BudgetTiming> out(n.size());
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = {int64_t(n[i]), int64_t(b[i]), uint64_t(ws[i]), uint64_t(ts[i]), ps[i], rs[i], ds[i]};
  return out;
}

}  // namespace ced::prop
