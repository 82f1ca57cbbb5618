#pragma once
// Shared by the `ced` subcommands: config loading, timing, atomic writes.
// Backends by name (make_backend, check_fits_in_memory) are the registry's
// (backends/registry.hpp).
#include <CLI/CLI.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "backends/registry.hpp"
#include "model/config.hpp"
#include "model/run.hpp"

namespace ced::tools {

// --config, --weight-seed, --token-seed: the model and its input (SPEC §2).
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

// Writes `text` to `path` atomically (temporary file, then rename); InputError.
void write_text_atomically(const std::string& path, const std::string& text);

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

}  // namespace ced::tools
