#pragma once
// SPEC §8 over whole runs: logits, per-layer outputs and selections of a run
// `t` against a reference run `r`, aligned by layer and position, judged by a
// policy; the first divergent layer. Shared by `ced diff` and `ced gate`.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/run.hpp"
#include "compare/policy.hpp"

namespace ced {

struct TensorDiff {
  std::string name;  // "runs/<run>/logits", "runs/<run>/layers/<l>/out", ".../topk"
  int64_t layer = -1;  // -1 for logits
  Comparison comparison;
  Verdict verdict;
  bool bitwise_equal = false;
  std::vector<int64_t> positions;  // position of each compared row
  // "position p, column c" of a flat element index, for messages.
  std::string where(int64_t flat) const;
};

struct RunDiff {
  std::string run;
  std::vector<std::string> problems;  // alignment problems (missing layers, positions) — failures
  std::vector<TensorDiff> tensors;
  int64_t first_divergent_layer = -1;  // first layer whose out or topk fails the policy
  int64_t first_inexact_layer = -1;    // first layer not bitwise equal
  bool pass() const;
};

// Calibration per tensor name (the reference f32-vs-f64 error), for
// self-calibrating rules; empty when none.
using CalibrationFor = std::function<std::optional<Calibration>(const std::string& tensor)>;

RunDiff diff_runs(const std::string& run, const RunResult& t, const RunResult& r, const Policy& policy,
                  const CalibrationFor& cal = {});

// The calibration of each tensor of a run: compares an f32 reference run with
// an f64 one (same request).
std::map<std::string, Calibration> calibrate_runs(const std::string& run, const RunResult& f32,
                                                  const RunResult& f64);

// Text table of one run's diff; JSON of a list of run diffs.
std::string format_run_diff(const RunDiff& d, bool verbose);
std::string run_diffs_json(const std::vector<RunDiff>& diffs);

// A policy that fails on any difference (diff without --policy).
Policy exact_policy();

}  // namespace ced
