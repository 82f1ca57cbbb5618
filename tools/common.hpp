#pragma once
// Shared by the `ced` subcommands: config loading, timing, atomic writes.
// Backends by name (make_backend, check_fits_in_memory) are the registry's
// (backends/registry.hpp).
#include <CLI/CLI.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backends/registry.hpp"
#include "models/lab/config.hpp"
#include "model/run.hpp"

namespace ced::tools {

// The one grammar of every integer option: decimal digits, with a leading '-'
// only where the range allows negatives, the whole text, inside [lo, hi].
// CLI11's own conversion (strtoll with base 0) accepts " 5", "0x10", octal
// "010" = 8, and "-1" for an unsigned seed (wrapping to 2^64 - 1), and clamps
// an out-of-range number instead of refusing it. Used as a transform, so a
// rejected value is a parse error (exit 2, one line) naming the option, and an
// accepted one reaches CLI11 in canonical decimal.
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator unsigned_integer();  // [0, 2^64 - 1]: the seeds

// Token counts, prefixes, decode steps and replay lengths on the command line:
// up to 2^30, so that N + decode and the §7 FLOP counts (int64) cannot
// overflow, and far past any run that fits a machine (check_fits_in_memory).
inline constexpr int64_t kMaxLength = int64_t(1) << 30;

// Options whose empty value would silently mean "not given" (--replay '' =
// bounded, --policy '' = exact, --cache-in '' = no cache): refused.
CLI::Validator non_empty();

// InputError "OPTION: why" for the first of `options` given on the command line: an option that
// means nothing for this run (the other model family's).
void refuse_given(const CLI::App* sub, std::initializer_list<const char*> options, const std::string& why);

// --backend: one of backend_names() (checked when parsed, before any work).
CLI::Validator backend_name();

// --config, --weight-seed, --token-seed: the model and its input (docs/spec.md §2).
// The lab config a --config argument names (built-in name or TOML file). A config of another model family
// (models/family.hpp) is an InputError naming its family and the backends the registry has for it: the
// commands run the lab family's backends.
Config load_lab_config(const std::string& arg);

struct ModelOptions {
  std::string config = "tiny";
  uint64_t weight_seed = 0;
  uint64_t token_seed = 0;
  std::vector<std::string> set;  // --set KEY=VALUE overrides, in order
  void add(CLI::App* sub, bool config_required = true);
  Config load() const;  // InputError
};

struct Stopwatch {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

// CPU seconds of this process so far, all threads (std::clock: user and system time): the CPU time of a
// stretch of work is the difference of two readings (a loaded machine stretches wall time, much less this).
double process_cpu_seconds();

// The first key whose TOML line differs between two configs, as "KEY is A in
// X, B in Y" ("" when they are equal). The config's name (a file path, a
// --set suffix) is not compared: it names a config, the keys are the config.
std::string first_config_difference(const Config& x, const Config& y, const std::string& x_name,
                                    const std::string& y_name);

// Writes `text` to `path` atomically (temporary file, then rename); InputError.
void write_text_atomically(const std::string& path, const std::string& text);
// Runs a program (args[0], looked up on PATH) with the process's environment and waits for it: its exit
// status, 127 when it could not be started, 128 + the signal that ended it. quiet: its output discarded.
int run_program(const std::vector<std::string>& args, bool quiet = false);
// Fails (InputError) up front if files named `out`.* cannot be written: a long study must not find out
// at its end.
void check_writable(const std::string& out);

// Each add_* registers one subcommand; main runs the one that was parsed.
struct Runner {
  CLI::App* sub = nullptr;
  std::function<int()> run;  // the exit code
};
Runner add_run(CLI::App& app);
Runner add_oracle(CLI::App& app);
Runner add_spans(CLI::App& app);
Runner add_diff(CLI::App& app);
Runner add_gate(CLI::App& app);
Runner add_golden(CLI::App& app);
Runner add_replay_error(CLI::App& app);
Runner add_verify(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_export(CLI::App& app);
Runner add_replay_budget(CLI::App& app);
Runner add_merge(CLI::App& app);
Runner add_cache_hit(CLI::App& app);
Runner add_migrate(CLI::App& app);

}  // namespace ced::tools
