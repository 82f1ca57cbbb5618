#pragma once
// `ced export` and `ced run` on a config of the v41 family (docs/v41.md §12): the same commands, the
// family picked from --config (or --checkpoint), each option either meaning the same in both families
// or refused by the one that has no use for it.
#include <cstdint>
#include <string>
#include <vector>

#include "checks/v41/diff.hpp"
#include "models/v41/config.hpp"

namespace ced::tools {

// Whether a --config argument names the v41 family (models/family.hpp decides).
bool names_v41_family(const std::string& config_arg);

// `ced oracle` on a v41 config (docs/v41.md §14): the release's oracle for the prompt lengths Ns, as
// the table or JSON. InputError when a count overflows int64 at the longest N.
int oracle_v41(const std::string& config, const std::vector<int64_t>& Ns, bool json);

struct V41ExportOptions {
  std::string config;  // a v41 built-in or config file
  uint64_t weight_seed = 0;
  std::string out;     // the folder (must not exist, or be empty)
  int64_t shard_bytes = 0;  // 0: the writer's default
  std::vector<std::string> boost;  // test only: "TENSOR=K", boost_v41_weight (docs/v41.md §12.4)
};
int export_v41(const V41ExportOptions& o);

struct V41RunOptions {
  std::string config;      // a v41 built-in (random weights from weight_seed), or "" with checkpoint
  std::string checkpoint;  // a release-layout folder, "" with config
  uint64_t weight_seed = 0, token_seed = 0;
  std::string regime = "release";
  std::string topk_ties = "torch", index_scores = "bf16";  // docs/v41.md §8.7
  std::string decode_index_k = "official";                 // docs/v41.md §8.8
  int64_t decode = 0;      // teacher-forced decode steps after the prefill (the last `decode` tokens)
  std::string mode = "full";          // full | ced | resume (docs/v41.md §13, §13.8)
  std::string replay = "bounded";     // ced, resume: bounded (W) | exact (the convention's span) | full | K;
                                      // a resume with full has no tail (every recomputed row through every layer)
  std::string convention = "sglang";  // ced, resume: v41_replay_conventions()
  int64_t prefix = -1;                // resume: the prefix-cache hit H (the cache: a prefill of the first H tokens)
  int64_t rebuilt = -1;               // resume: window rows rebuilt before the hit (-1: W)
  std::string rule = "vllm";          // resume: the encoder-replay rule, v41_encoder_replay_rules()
  int64_t speculative = 0;            // ced: speculative tokens in a bounded tail (conventions that hold them)
  std::string backend = "v41-reference";
  int64_t tokens = 0;      // N seeded prompt tokens, or 0 with token_file
  std::string token_file;  // whitespace-separated token ids
  std::string out;         // the v41 run file to write ("" : print only)
};
int run_v41(const V41RunOptions& o);

// `ced spans` on a v41 config (docs/v41.md §13.5): each convention's spans as the plan states them, and
// with `empirical` as the model shows them (the floor probe's cones, the first bitwise replay).
struct V41SpansOptions {
  std::string config;
  bool empirical = false;
  int64_t tokens = -1;  // the searched prompt (default: the longest span + W)
  uint64_t weight_seed = 0, token_seed = 0;
  std::string regime = "f64";
  std::vector<std::string> conventions;  // empty: every preset
  std::string fault = "none";            // test only: a planted v41 fault
  int64_t prefix = -1;                   // >= 0: the encoder replay span after a hit of this many tokens
  int64_t stress = 0;                    // > 0: the stress prompts of this many tokens (docs/v41.md §13.12)
  std::string stress_out;                // and their folder of NAME.txt files
};
int spans_v41(const V41SpansOptions& o);

// `ced replay-budget` on a v41 config (docs/v41.md §13.7): every convention's replays against exact
// recovery over seeds, regimes and lengths; writes OUT.md (the results page), OUT.csv, OUT-samples.csv
// and OUT-drift.csv.
struct V41ReplayBudgetOptions {
  std::string config;
  std::vector<int64_t> lengths, replays;  // replays empty: W .. 16W, each convention's decode and exact spans
  std::vector<uint64_t> token_seeds, weight_seeds;
  std::vector<std::string> regimes, conventions;
  int64_t speculative = 0;
  std::string out, out_name;  // the prefix, and its file name for the page
  int threads = 1;            // for the page
  std::string command;        // the command line without --shard and --out, for the page
  int64_t shard = 0, n_shards = 1;  // with n_shards > 1: run the shard's samples, write OUT.json for `ced merge`
  int64_t merged_shards = 0;        // the page of a merge: how many shards ran it
};
int replay_budget_v41(const V41ReplayBudgetOptions& o);
// `ced merge` of v41 study shards (their OUT.json files): the unsharded run's outputs, InputError for files
// that are not the shards of one study, a shard missing or given twice.
int merge_v41(const std::vector<std::string>& files, const std::string& out);

// `ced cache-hit` on a v41 config (docs/v41.md §13.8): the prompt resumed after prefix-cache hits at each
// H under each engine's encoder-replay rule, against its cold run in each mode; OUT.md and OUT.csv with out.
struct V41CacheHitOptions {
  std::string config;
  int64_t tokens = 0;                     // 0: the largest hit + 2W
  std::vector<int64_t> hits, rebuilt;     // empty: the default sweep; W
  std::vector<std::string> rules, modes;  // empty: every rule; sglang, vllm, full
  std::string regime = "release";
  uint64_t weight_seed = 0;
  std::vector<uint64_t> token_seeds;  // empty: 0
  std::string fault = "none";  // test only
  std::string out, out_name, command;
};
int cache_hit_v41(const V41CacheHitOptions& o);

// `ced replay-error` on a v41 config (docs/v41.md §13.11): bounded replay (K = min(N, W)) under the convention
// against the full prefill, per N (default W to 8W doubling and the exact span's neighbours within it), per
// decoder layer, per decode step and per resume prefix; PREFIX.csv and PREFIX.svg.
struct V41ReplayErrorOptions {
  std::string config, regime = "release", convention = "sglang", out;
  std::vector<int64_t> lengths;
  // resume rows: the prompt resumed after a prefix-cache hit at P (rule vllm, W window rows rebuilt) with the
  // bounded tail, against the full prefill; default W/2, W, W + 1, 2W, 4W, each below N
  std::vector<int64_t> prefixes;
  int64_t decode = 4;
  uint64_t weight_seed = 0, token_seed = 0;
};
int replay_error_v41(const V41ReplayErrorOptions& o);

// `ced bench` on a v41 config (docs/v41.md §14.7): full and bounded CED prefill (and decode steps), min and
// median of `repeat` after validated warm-ups, the time ratio beside the oracle's FLOP ratio.
struct V41BenchOptions {
  std::string config, regime = "release", convention = "sglang";
  int64_t tokens = 1024, decode = 8, repeat = 3, warmup = 1;
  uint64_t weight_seed = 0, token_seed = 0;
};
int bench_v41(const V41BenchOptions& o);

// `ced verify` on a v41 config (docs/v41.md §13.9): the released architecture's sections; each failure
// appended to `failures`.
void verify_v41(const std::string& config, const std::string& golden_dir, bool skip_drift,
                std::vector<std::string>& failures);

// Its golden gate alone (docs/v41.md §12.3): every golden file of the folder against our reference, one
// line each; a folder with no golden file (missing or empty) is a failure naming it, never a pass.
void verify_v41_golden(const std::string& golden_dir, std::vector<std::string>& failures);
// `ced gate --golden DIR` on a folder of v41 golden files (is_v41_golden_dir: no policy.toml, its first file a
// v41 run file): each file (or `only`) judged by the gate against our reference under the bound model, one
// line each, the first failure and the command that reproduces it; -v each file's table. Exit 1 when one fails.
struct V41GateOptions {
  std::string dir, only;
  bool verbose = false;
  std::string accumulation = "fp32";
  double function_ulps = 2;
  std::string fault = "none";  // test only: a planted v41 fault in our reference
};
bool is_v41_golden_dir(const std::string& dir);
// `ced golden regenerate --dir DIR --official O --python PY` on the release's golden folder: the official code
// (O's run_official.py, PY's torch) run by scripts/v41-official-golden.sh into DIR. InputError naming what is
// missing; exit 1 when the script fails.
int regenerate_v41_golden(const std::string& dir, const std::string& official, const std::string& python);

// `ced diff A B` on two v41 run files of one model and prompt (tools/v41_diff.cpp): A judged against B op by
// op, by the sound gate's bounds where A's inputs to the op are B's, the rest listed as not judged. The
// checkpoint: `checkpoint`, or B's weight seed. Exit 1 when an op judged is outside its bounds.
using V41DiffOptions = v41::V41DiffOptions;
bool is_v41_run_file(const std::string& path);
int diff_v41(const V41DiffOptions& o);
int gate_v41(const V41GateOptions& o);
// A planted v41 fault (v41_fault_names) and the check (v41_ced_checks) that must fail with it.
struct V41PlantedBug {
  std::string fault, check;
};
// The ports' replay bugs `ced verify` plants, each with the check that must catch it.
const std::vector<V41PlantedBug>& v41_verify_planted_bugs();
// Its property section alone: each check named (of v41_ced_checks) on v41-tiny in each regime, one line
// each, then each bug planted on v41-tiny release and its check run, one line each; a check that passes
// with its bug planted is a failure "FAULT: the check passed with the bug planted". `ced verify` runs
// every check and v41_verify_planted_bugs().
void verify_v41_properties(const std::vector<std::string>& checks, const std::vector<V41PlantedBug>& planted,
                           std::vector<std::string>& failures);
// Its drift summary alone: each convention's bounded replay and each encoder-replay rule's resume against
// exact recovery on the config, one row each (the FLOP ratio "-" where the row has none).
void verify_v41_drift(const std::string& config, std::vector<std::string>& failures);

// A v41 config named by --config: a built-in or a config file (InputError).
v41::V41Config v41_config_named(const std::string& arg);

}  // namespace ced::tools
