// `ced replay-budget` and `ced merge` (docs/spec.md §10): error and cost against the
// replay span B across seeds, optionally in shards that `ced merge` combines
// into the very files an unsharded run writes.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <map>
#include <filesystem>
#include <set>

#include <omp.h>

#include "checks/replay_budget.hpp"
#include "models/lab/hdf5_files.hpp"
#include "io/untrusted.hpp"
#include "model/data_root.hpp"
#include "model/error.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"

extern char** environ;

namespace ced::tools {
namespace {

using namespace ced::prop;

// Seeds are stored in float64 table columns (docs/spec.md §9.3): at most 2^53.
constexpr int64_t kMaxTableSeed = int64_t(1) << 53;

// The root attributes that describe a study; equal in every shard of it and
// in the merged file. "shard" is added to a shard's file.
const std::vector<std::string> kStudyAttrs = {"backend",        "weight_seeds",        "token_seeds",
                                              "lengths",        "replays",             "decode",
                                              "bootstrap_seed", "bootstrap_resamples", "kind_legend",
                                              "exact_replay",   "exact_decode_replay"};

template <class T>
std::string join(const std::vector<T>& v) {
  return fmt::format("{}", fmt::join(v, ","));
}

// The whole numbers of attribute `name` of shard `file`, separated by `sep`:
// InputError naming both for an empty list, an empty item ("64,,128",
// "16,21,"), anything but decimal digits, or a number past T.
template <class T>
std::vector<T> split_numbers(const std::string& file, const std::string& name, const std::string& s, char sep = ',') {
  const auto malformed = [&] {
    return InputError(fmt::format("'{}': attribute '{}' is '{}', not a list of whole numbers separated by '{}'", file,
                                  name, s, sep));
  };
  std::vector<T> v;
  for (size_t a = 0; a <= s.size();) {  // "" is one empty item
    const size_t b = std::min(s.find(sep, a), s.size());
    const char *first = s.data() + a, *last = s.data() + b;
    T x{};
    // from_chars reads a '-' into a signed T: digits only. An empty item or a number past T is an error code.
    if (std::find_if_not(first, last, [](char ch) { return ch >= '0' && ch <= '9'; }) != last ||
        std::from_chars(first, last, x).ec != std::errc())
      throw malformed();
    v.push_back(x);
    a = b + 1;
  }
  return v;
}

std::string generator() { return fmt::format("ced replay-budget (ced-harness {})", CED_VERSION); }

std::vector<std::pair<std::string, std::string>> study_attrs(const Plan& p, const BudgetOptions& o,
                                                             uint64_t bootstrap_seed) {
  const auto units = budget_units(o, false);
  std::set<uint64_t> ws, ts;
  std::set<int64_t> ns;
  for (const auto& u : units) {
    ws.insert(u.weight_seed);
    ts.insert(u.token_seed);
    ns.insert(u.n_prompt);
  }
  auto str = [](const auto& set) { return join(std::vector(set.begin(), set.end())); };
  const std::vector<std::string> values = {o.backend,
                                           str(ws),
                                           str(ts),
                                           str(ns),
                                           o.replays.empty() ? std::string("default") : join(o.replays),
                                           std::to_string(o.decode),
                                           std::to_string(bootstrap_seed),
                                           std::to_string(kBootstrapResamples),
                                           "0 prefill, 1 layer, 2 decode",
                                           std::to_string(p.exact_replay()),
                                           std::to_string(p.exact_decode_replay())};
  std::vector<std::pair<std::string, std::string>> a;
  for (size_t i = 0; i < kStudyAttrs.size(); ++i) a.emplace_back(kStudyAttrs[i], values[i]);
  return a;
}

std::string attr(const std::vector<std::pair<std::string, std::string>>& attrs, const std::string& name) {
  for (const auto& [k, v] : attrs)
    if (k == name) return v;
  throw std::runtime_error("attribute " + name + " was not read");
}

// A shard file of `ced replay-budget --shard`: every study attribute, "shard",
// /samples and /timings; InputError naming what it lacks.
TableFile read_shard(const std::string& f, const std::vector<std::string>& names) {
  TableFile t = read_untrusted_table_file(f, names, {"samples", "timings"});
  for (const std::string& a : names)
    if (std::none_of(t.attrs.begin(), t.attrs.end(), [&](const auto& kv) { return kv.first == a; }))
      throw InputError(fmt::format("'{}' is not a shard of `ced replay-budget --shard i/n` (no attribute '{}')", f, a));
  if (t.groups.size() != 2)
    throw InputError(fmt::format("'{}' is not a shard of `ced replay-budget --shard i/n` (no /samples and /timings)", f));
  return t;
}

// gnuplot's single-quoted string: a quote is written twice.
std::string gp_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("''") : std::string(1, ch);
  return q + "'";
}

// Runs gnuplot (CED_GNUPLOT names another program) on tools/replay-budget.gp;
// false when it cannot be started (the caller says the plots were skipped).
bool draw_plots(const std::string& out, const Config& c, const std::vector<BudgetAggregate>& rows) {
  std::set<int64_t> Ns;
  for (const auto& a : rows) Ns.insert(a.n_prompt);
  if (Ns.empty()) return true;
  const int64_t Nmax = *Ns.rbegin();
  std::set<int64_t> Bs;
  for (const auto& a : rows)
    if (a.n_prompt == Nmax) Bs.insert(a.replay);
  const Plan p = make_plan(c);
  auto words = [](const std::set<int64_t>& s) { return fmt::format("{}", fmt::join(s, " ")); };
  const std::string vars = fmt::format("prefix={}; config={}; Ns='{}'; Nmax={}; Bs='{}'; R={}; Rdec={}", gp_quote(out),
                                       gp_quote(c.name), words(Ns), Nmax, words(Bs), p.exact_replay(),
                                       p.exact_decode_replay());
  const char* env = std::getenv("CED_GNUPLOT");
  const std::string program = env && *env ? env : "gnuplot";
  const std::string script = (data_root() / "tools" / "replay-budget.gp").string();
  const int status = run_program({program, "-e", vars, script});
  if (status == 127) return false;  // not found
  if (status != 0) throw std::runtime_error(fmt::format("{} failed on {} (status {})", program, script, status));
  return true;
}

// What an unsharded run and `ced merge` write: PREFIX.csv, PREFIX-samples.csv,
// PREFIX.h5 (/table, /samples), the plots, and the measurements apart in
// PREFIX-timing.csv.
void write_outputs(const std::string& out, const Config& c, const std::vector<std::pair<std::string, std::string>>& attrs,
                   const BudgetData& d, uint64_t bootstrap_seed) {
  const auto rows = aggregate_budget(d.samples, bootstrap_seed);
  write_text_atomically(out + ".csv", budget_csv(rows));
  write_text_atomically(out + "-samples.csv", budget_samples_csv(d.samples));
  write_text_atomically(out + "-timing.csv", budget_timing_csv(d.timings));
  TableFile t;
  t.generator = generator();
  t.config = c;
  t.attrs = attrs;
  t.columns = aggregate_columns(rows);
  t.groups = {{"samples", sample_columns(d.samples)}};
  write_table_file(out + ".h5", t);
  const bool plotted = draw_plots(out, c, rows);
  std::fputs(budget_table(rows, d.timings, make_plan(c)).c_str(), stdout);
  std::printf("wrote %s.csv, %s-samples.csv, %s-timing.csv, %s.h5%s\n", out.c_str(), out.c_str(), out.c_str(),
              out.c_str(),
              plotted ? fmt::format(", {0}-vs-replay.svg, {0}-vs-cost.svg, {0}-layers.svg", out).c_str()
                      : "; plots skipped: gnuplot not found (install gnuplot-nox)");
}

}  // namespace

namespace {
// --shard i/n: two whole numbers with 0 <= i < n.
std::pair<int64_t, int64_t> parse_shard(const std::string& arg) {
  const size_t slash = arg.find('/');
  const std::string i = arg.substr(0, slash), n = slash == std::string::npos ? "" : arg.substr(slash + 1);
  auto whole = [](const std::string& t) {
    return !t.empty() && t.size() < 10 && t.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!whole(i) || !whole(n) || std::stoll(n) < 1 || std::stoll(i) >= std::stoll(n))
    throw InputError(fmt::format("--shard: '{}' is not i/n with 0 <= i < n", arg));
  return {std::stoll(i), std::stoll(n)};
}
}  // namespace

Runner add_replay_budget(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    BudgetOptions budget;
    std::string shard;
    uint64_t bootstrap_seed = 0;
    std::string out;
    std::vector<std::string> regimes, conventions;  // v41
    int64_t speculative = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("replay-budget", "error and cost against the replay span B, across seeds");
  o->model.add(sub);
  sub->add_option("--tokens", o->budget.lengths, "prompt lengths N (default: the smallest W·2^k above R)")
      ->transform(integer_in(1, kMaxLength));
  sub->add_option("--replay", o->budget.replays, "replay spans B (default W, 2W, 4W, ..., R-1, R, N)")
      ->transform(integer_in(1, kMaxLength));
  auto* seeds = sub->add_option("--token-seeds", "token seeds 0..S-1 (default 8)")->transform(integer_in(1, 1 << 20));
  auto* seed_list = sub->add_option("--token-seed-list", o->budget.token_seeds, "these token seeds")
                        ->transform(integer_in(0, kMaxTableSeed));
  seeds->excludes(seed_list);
  sub->add_option("--weight-seeds", o->budget.weight_seeds, "weight seeds (default 0)")
      ->transform(integer_in(0, kMaxTableSeed));
  sub->add_option("--decode", o->budget.decode, "decode steps K")->capture_default_str()->transform(integer_in(0, 1 << 20));
  sub->add_option("--backend", o->budget.backend, "backend")->capture_default_str()->transform(backend_name());
  sub->add_option("--bootstrap-seed", o->bootstrap_seed, "seed of the bootstrap resamples")
      ->capture_default_str()
      ->transform(unsigned_integer());
  sub->add_option("--shard", o->shard, "i/n: run shard i of n only and write PREFIX.h5 for `ced merge`");
  sub->add_option("--out", o->out, "output prefix")->required();
  sub->add_option("--regime", o->regimes, "v41: regimes (default release f64, docs/v41.md §8.1)");
  sub->add_option("--convention", o->conventions, "v41: replay conventions (default sglang vllm ascend, docs/v41.md §13.1)");
  sub->add_option("--speculative", o->speculative, "v41: speculative tokens of a W + k tail (atom)")
      ->transform(integer_in(0, kMaxLength));
  return {sub, [o, seeds, sub] {
            if (names_v41_family(o->model.config)) {
              refuse_given(sub, {"--decode", "--backend", "--bootstrap-seed", "--set"},
                           "not an option of the v41 study yet (docs/v41.md §13.7)");
              V41ReplayBudgetOptions v;
              v.config = o->model.config;
              v.lengths = o->budget.lengths;
              v.replays = o->budget.replays;
              v.token_seeds = o->budget.token_seeds;
              if (*seeds)
                for (int64_t s = 0, n = seeds->as<int64_t>(); s < n; ++s) v.token_seeds.push_back(uint64_t(s));
              if (v.token_seeds.empty())
                for (uint64_t s = 0; s < 8; ++s) v.token_seeds.push_back(s);
              v.weight_seeds = o->budget.weight_seeds;
              if (v.weight_seeds.empty()) v.weight_seeds = {o->model.weight_seed};
              v.regimes = o->regimes.empty() ? std::vector<std::string>{"release", "f64"} : o->regimes;
              v.conventions = o->conventions.empty() ? std::vector<std::string>{"sglang", "vllm", "ascend"} : o->conventions;
              v.speculative = o->speculative;
              v.out = o->out;
              v.out_name = std::filesystem::path(o->out).filename().string();
              v.threads = omp_get_max_threads();
              if (!o->shard.empty()) std::tie(v.shard, v.n_shards) = parse_shard(o->shard);
              v.command = fmt::format("ced replay-budget --config {} --tokens {} --token-seed-list {} --weight-seeds {} "
                                      "--regime {} --convention {}{}{}",
                                      v.config, fmt::join(v.lengths, " "), fmt::join(v.token_seeds, " "),
                                      fmt::join(v.weight_seeds, " "), fmt::join(v.regimes, " "),
                                      fmt::join(v.conventions, " "),
                                      v.replays.empty() ? "" : fmt::format(" --replay {}", fmt::join(v.replays, " ")),
                                      v.speculative ? fmt::format(" --speculative {}", v.speculative) : "");
              return replay_budget_v41(v);
            }
            refuse_given(sub, {"--regime", "--convention", "--speculative"},
                         fmt::format("an option of the v41 family; config {} is a lab config", o->model.config));
            Config c = o->model.load();
            const Plan p = make_plan(c);
            BudgetOptions& b = o->budget;
            if (*seeds)
              for (int64_t s = 0, n = seeds->as<int64_t>(); s < n; ++s) b.token_seeds.push_back(uint64_t(s));
            if (b.lengths.empty()) b.lengths = {default_budget_length(p)};
            if (b.weight_seeds.empty()) b.weight_seeds = {o->model.weight_seed};
            const bool sharded = !o->shard.empty();
            if (sharded) std::tie(b.shard, b.n_shards) = parse_shard(o->shard);
            check_writable(o->out);
            const auto attrs = study_attrs(p, b, o->bootstrap_seed);
            std::printf("ced replay-budget: config %s, weight seeds %s, token seeds %s, N %s, B %s, decode %lld, "
                        "backend %s, bootstrap seed %llu (%lld resamples)%s\n",
                        c.name.c_str(), attr(attrs, "weight_seeds").c_str(),
                        attr(attrs, "token_seeds").c_str(), attr(attrs, "lengths").c_str(),
                        attr(attrs, "replays").c_str(), (long long)b.decode, b.backend.c_str(),
                        (unsigned long long)o->bootstrap_seed, (long long)kBootstrapResamples,
                        sharded ? fmt::format(", shard {}", o->shard).c_str() : "");
            std::fflush(stdout);
            Stopwatch sw;
            BudgetData d = replay_budget(c, b, [&](int64_t done, int64_t total, const std::string& what) {
              std::fprintf(stderr, "[%lld/%lld] %7.1fs %s\n", (long long)done, (long long)total, sw.seconds(),
                           what.c_str());
            });
            if (sharded) {
              TableFile t;
              t.generator = generator();
              t.config = c;
              t.attrs = attrs;
              t.attrs.emplace_back("shard", o->shard);
              t.groups = {{"samples", sample_columns(d.samples)}, {"timings", timing_columns(d.timings)}};
              write_table_file(o->out + ".h5", t);
              std::printf("wrote shard %s: %s.h5 (%.1f s); combine the shards with `ced merge`\n", o->shard.c_str(),
                          o->out.c_str(), sw.seconds());
              return 0;
            }
            write_outputs(o->out, c, attrs, d, o->bootstrap_seed);
            std::printf("%.1f s\n", sw.seconds());
            return 0;
          }};
}

Runner add_merge(CLI::App& app) {
  struct Opts {
    std::vector<std::string> shards;
    std::string out;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("merge", "combine the shards of `ced replay-budget --shard` into its outputs");
  sub->add_option("shards", o->shards, "the shard files (PREFIX.h5 of each --shard i/n run)")->required();
  sub->add_option("--out", o->out, "output prefix")->required();
  return {sub, [o] {
            // A v41 study's shards are its OUT.json files (docs/v41.md §13.7).
            const auto json = [](const std::string& f) { return f.size() > 5 && f.ends_with(".json"); };
            if (std::all_of(o->shards.begin(), o->shards.end(), json)) return merge_v41(o->shards, o->out);
            if (std::any_of(o->shards.begin(), o->shards.end(), json))
              throw InputError("merge: the shards of one study are all .h5 (the lab model's) or all .json (a v41 one)");
            check_writable(o->out);
            std::vector<std::string> names = kStudyAttrs;
            names.push_back("shard");
            std::map<int64_t, std::string> seen;  // shard index -> file
            int64_t n_shards = -1;
            TableFile first;
            std::string first_file;  // the file `first` was read from
            BudgetData d;
            for (const std::string& f : o->shards) {
              const TableFile t = read_shard(f, names);
              const auto parts = split_numbers<int64_t>(f, "shard", attr(t.attrs, "shard"), '/');
              if (parts.size() != 2 || parts[1] < 1 || parts[0] >= parts[1])
                throw InputError(fmt::format("'{}': attribute 'shard' is '{}', not i/n", f, attr(t.attrs, "shard")));
              if (seen.empty()) {
                first = t;
                first_file = f;
                n_shards = parts[1];
              } else {
                if (t.generator != first.generator)
                  throw InputError(fmt::format("'{}' was written by {}, '{}' by {}: not shards of one study", f,
                                               t.generator, first_file, first.generator));
                // Every key, not the name: `--set` renames, a file edited by hand need not.
                if (const std::string diff = first_config_difference(t.config, first.config, "'" + f + "'",
                                                                     "'" + first_file + "'");
                    !diff.empty())
                  throw InputError(fmt::format("'{}' has another config than '{}' ({}): not shards of one study", f,
                                               first_file, diff));
                for (const std::string& a : kStudyAttrs)
                  if (attr(t.attrs, a) != attr(first.attrs, a))
                    throw InputError(fmt::format("'{}' has {} = '{}', '{}' has '{}': not shards of one study", f, a,
                                                 attr(t.attrs, a), first_file, attr(first.attrs, a)));
                if (parts[1] != n_shards)
                  throw InputError(fmt::format("'{}' is shard {} of {}, '{}' one of {}", f, parts[0], parts[1],
                                               first_file, n_shards));
              }
              if (!seen.emplace(parts[0], f).second)
                throw InputError(fmt::format("shard {}/{} given twice: '{}' and '{}'", parts[0], n_shards,
                                             seen[parts[0]], f));
              // The shard must hold exactly its units of the study.
              BudgetOptions b;
              b.lengths = split_numbers<int64_t>(f, "lengths", attr(t.attrs, "lengths"));
              b.weight_seeds = split_numbers<uint64_t>(f, "weight_seeds", attr(t.attrs, "weight_seeds"));
              b.token_seeds = split_numbers<uint64_t>(f, "token_seeds", attr(t.attrs, "token_seeds"));
              b.shard = parts[0];
              b.n_shards = parts[1];
              const auto samples = samples_from_columns(t.groups[0].second);
              std::set<std::tuple<uint64_t, int64_t, uint64_t>> want, have;
              for (const auto& u : budget_units(b, true)) want.insert({u.weight_seed, u.n_prompt, u.token_seed});
              for (const auto& s : samples) have.insert({s.weight_seed, s.drift.n_prompt, s.token_seed});
              if (want != have)
                throw InputError(fmt::format("'{}' does not hold the units of shard {}/{} (a damaged or edited shard)", f,
                                             parts[0], parts[1]));
              d.samples.insert(d.samples.end(), samples.begin(), samples.end());
              const auto timings = timings_from_columns(t.groups[1].second);
              d.timings.insert(d.timings.end(), timings.begin(), timings.end());
            }
            std::vector<int64_t> missing;
            for (int64_t i = 0; i < n_shards; ++i)
              if (!seen.count(i)) missing.push_back(i);
            if (!missing.empty())
              throw InputError(fmt::format("shard{} {} of {} missing", missing.size() > 1 ? "s" : "",
                                           fmt::join(missing, ", "), n_shards));
            sort_budget_data(d);
            std::vector<std::pair<std::string, std::string>> attrs;
            for (const std::string& a : kStudyAttrs) attrs.emplace_back(a, attr(first.attrs, a));
            const auto seeds = split_numbers<uint64_t>(first_file, "bootstrap_seed", attr(first.attrs, "bootstrap_seed"));
            if (seeds.size() != 1)
              throw InputError(fmt::format("'{}': attribute 'bootstrap_seed' is '{}', not one whole number",
                                           first_file, attr(first.attrs, "bootstrap_seed")));
            const uint64_t bootstrap_seed = seeds[0];
            std::printf("ced merge: %lld shards of config %s, bootstrap seed %llu\n", (long long)n_shards,
                        first.config.name.c_str(), (unsigned long long)bootstrap_seed);
            write_outputs(o->out, first.config, attrs, d, bootstrap_seed);
            return 0;
          }};
}

}  // namespace ced::tools
