#pragma once
// The replay-budget study (docs/spec.md §4.4, §7, §10 `ced replay-budget`): error
// against exact recovery and cost, per prompt length N and replay span B,
// across token (and weight) seeds, aggregated with a bootstrap interval.
// Built on the replay-error sweep's metrics (checks/replay_sweep.hpp).
//
// The unit of work is one (weight seed, N, token seed): every B of it shares
// the encoder and the source-only write (reference/lab/replays.hpp) and the exact
// reference (ced with B = N, which docs/spec.md §4.4 makes bitwise the full
// mode's), so splitting the B of one unit over shards would recompute both.
// Shard i of n takes the units k ≡ i (mod n) of the canonical order (weight
// seed, N, token seed ascending).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checks/replay_sweep.hpp"
#include "models/lab/schedule.hpp"

namespace ced::prop {

struct BudgetOptions {
  std::vector<int64_t> lengths;        // N; empty: default_budget_length
  std::vector<int64_t> replays;        // B; empty: default_budget_replays per N
  std::vector<uint64_t> token_seeds;   // empty: 0..7
  std::vector<uint64_t> weight_seeds;  // empty: {0}
  int64_t decode = 4;                  // K
  std::string backend = "reference";
  int64_t shard = 0, n_shards = 1;     // this run's units: k mod n_shards == shard
  // The backend of a weight seed; empty: the registry's `backend` (the
  // tests of the checks wrap it to plant differences).
  std::function<std::unique_ptr<Backend>(const Config&, uint64_t weight_seed)> make_backend;
};

// The smallest W·2^k above R (every default B below R then fits in N).
int64_t default_budget_length(const Plan& p);
// W, 2W, 4W, ... below R − 1, then R − 1, R and N; each min(N, .), ascending, distinct.
std::vector<int64_t> default_budget_replays(const Plan& p, int64_t N);
// The B measured at N: `replays` (default_budget_replays if empty), each
// min(N, .), ascending, distinct.
std::vector<int64_t> budget_replays(const Plan& p, int64_t N, const std::vector<int64_t>& replays);

// One unit of work.
struct BudgetUnit {
  uint64_t weight_seed = 0;
  int64_t n_prompt = 0;
  uint64_t token_seed = 0;
};
// Every unit in canonical order (lengths and seeds sorted, distinct); with
// `shard`/`n_shards`, those of that shard only.
std::vector<BudgetUnit> budget_units(const BudgetOptions& o, bool this_shard_only);

// One measurement against exact recovery: the DriftRow (kind "prefill",
// "decode" with its step, "layer" with its decoder layer) of one (N, B) and
// seed pair.
struct BudgetSample {
  DriftRow drift;
  uint64_t weight_seed = 0, token_seed = 0;
  double flop_ratio = 0;     // the oracle's: ced with B over full, last logits only, no decode (§7)
  bool flops_match = false;  // the run's instrumented count equals the FLOP model's, per layer and kind
};
// The measured wall time of one (N, B) and seed pair: the encoder and
// source-only write (once per unit, shared) plus this B's decoder and logits,
// against the same for the exact reference (B = N). Measurements: they
// differ between runs and are kept out of every output that must be
// reproducible.
struct BudgetTiming {
  int64_t n_prompt = 0, replay = 0;
  uint64_t weight_seed = 0, token_seed = 0;
  double prefill_seconds = 0, reference_prefill_seconds = 0, decode_seconds = 0;
};
struct BudgetData {
  std::vector<BudgetSample> samples;  // canonical order (sort_budget_data)
  std::vector<BudgetTiming> timings;
};

// Runs this shard's units. `progress(done, total, what)` after each unit.
BudgetData replay_budget(const Config& c, const BudgetOptions& o,
                         const std::function<void(int64_t, int64_t, const std::string&)>& progress = {});
// The canonical order: weight seed, N, token seed, B, kind, step, layer.
void sort_budget_data(BudgetData& d);

// The checks on the curve (docs/spec.md §4.4, §7), one line per failure, "" when
// none: for every sample, the last logits are bitwise exact when B >= min(N, R),
// decoder layer E+k's output at N-1 when B >= min(N, 1 + (k+1)(W-1)), every
// decode step when B >= min(N, D(W-1)); and every run's instrumented FLOP
// count equals the FLOP model's (so the oracle's ratio is the counted one).
std::string check_budget_curve(const Plan& p, const std::vector<BudgetSample>& samples);
// run_replays (reference/lab/replays.hpp) hands back, for each policy, what run() returns with
// that policy: logits, positions, captures, FLOP counts, bitwise.
std::string check_run_replays(Backend& be, const RunRequest& req, const std::vector<ReplayPolicy>& replays);
// A replay session (reference/lab/replays.hpp) opened on `base` hands back, for each
// probe in turn, what a separate run() of it returns, bitwise: the probes vary
// the replay, decode steps, dependency probe and logits' scope.
std::string check_replay_session(Backend& be, const RunRequest& base, const std::vector<RunRequest>& probes);

// One aggregated row: a (kind, N, B, step, layer) across every seed pair;
// rows in that order.
struct BudgetAggregate {
  std::string kind;
  int64_t n_prompt = 0, replay = 0, layer = -1, step = -1;
  int64_t n_seeds = 0;
  double flop_ratio = 0;
  double rel_l2_mean = 0, rel_l2_median = 0, rel_l2_worst = 0, rel_l2_ci_lo = 0, rel_l2_ci_hi = 0;
  double kl_mean = 0, kl_median = 0, kl_worst = 0, kl_ci_lo = 0, kl_ci_hi = 0;
  double top1 = 0;        // fraction of seed pairs whose top-1 agrees
  double top5_mean = 0, top5_worst = 0;
  double exact = 0;       // fraction of seed pairs bitwise equal
  bool flops_match = true;  // every seed pair's count matched the model
  bool pareto = false;    // prefill: no B of this N is as cheap (FLOP ratio) and as accurate (median rel L2)
};

inline constexpr int64_t kBootstrapResamples = 2000;
// Mean, median (of an even count, the mean of the two middle values), worst
// and the percentile bootstrap 95 % interval of the median: kBootstrapResamples
// resamples of the seed pairs (in canonical order), each of n picks
// v[rng() % n] from one std::mt19937_64 seeded with bootstrap_seed + 2·index
// (rel L2) or bootstrap_seed + 2·index + 1 (KL), index the row's; the ends
// are the nearest-rank 2.5 % and 97.5 % points of the sorted medians.
// Deterministic everywhere.
std::vector<BudgetAggregate> aggregate_budget(const std::vector<BudgetSample>& samples, uint64_t bootstrap_seed);

std::string budget_csv(const std::vector<BudgetAggregate>& rows);
std::string budget_samples_csv(const std::vector<BudgetSample>& samples);
std::string budget_timing_csv(const std::vector<BudgetTiming>& timings);
// The summary: per N, each B's median logits rel L2 [interval], worst, KL,
// top-1, decode drift and FLOP ratio (and the measured time ratio when
// timings are given), then the reading: the smallest B whose median falls
// below 1e-3, below 1e-6 and to 0, with its FLOP ratio.
std::string budget_table(const std::vector<BudgetAggregate>& rows, const std::vector<BudgetTiming>& timings,
                         const Plan& p);

// Columns for the HDF5 table file (docs/spec.md §9.3): /table (aggregate),
// /samples, /timings. String columns (kind) are coded 0 prefill, 1 layer, 2 decode.
using Columns = std::vector<std::pair<std::string, std::vector<double>>>;
Columns aggregate_columns(const std::vector<BudgetAggregate>& rows);
Columns sample_columns(const std::vector<BudgetSample>& samples);
Columns timing_columns(const std::vector<BudgetTiming>& timings);
// The inverses (`ced merge`); InputError naming the column on a missing or malformed one.
std::vector<BudgetSample> samples_from_columns(const Columns& cols);
std::vector<BudgetTiming> timings_from_columns(const Columns& cols);

}  // namespace ced::prop
