#pragma once
// docs/spec.md §8 over whole runs: logits, per-layer outputs and selections of a run
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
  // Selections: why §8.3's near-tie test was not possible ("" when it was,
  // or for other tensors): a side without index scores (a version-1 file).
  std::string near_tie_untested;
  // Logits: whether the policy's rule sets greedy_top_n (the greedy rule is
  // reported either way, and gates only then).
  bool greedy_gated = false;
  // "position p, column c" of a flat element index, for messages.
  std::string where(int64_t flat) const;
  // Where the verdict failed, named by position (and column for elements),
  // after the first violation: nan -> the first NaN (either side), inf_mismatch
  // -> the first Inf mismatch, atol -> the first mismatching element, max_ulp
  // -> the element of the largest ULP distance, max_kl / min_top1 / min_top5 /
  // min_jaccard -> the first row attaining the worst value (first disagreement
  // for min_top1), max_kl_mean -> the row of the largest KL, max_kl_p99 /
  // max_kl_p999 -> the first row attaining the quantile, greedy_top_n -> the
  // first divergent row, the norm metrics (max_rel_l2, max_nmse, min_cosine) -> the
  // largest absolute error. Every "first" is in index order, so among tied
  // elements the lowest (position, column) is named. "-" when passing.
  std::string worst() const;
};

struct RunDiff {
  std::string run;
  // Structural problems, each a failure: request attributes that differ, a
  // position, layer or selection present on one side only, a column count
  // that differs. Files with duplicated or unsorted positions never get here
  // (the loader refuses them, exit 2).
  std::vector<std::string> problems;
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
