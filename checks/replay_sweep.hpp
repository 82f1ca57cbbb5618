#pragma once
// The replay-error sweep (docs/spec.md §4–§6, §10 `ced replay-error`): how far bounded
// replay drifts from exact recovery, per prompt length, per decoder layer,
// per decode step, and for resumed prefixes.
#include <functional>
#include <string>
#include <vector>

#include "models/lab/schedule.hpp"

namespace ced::prop {

struct DriftRow {
  std::string kind;  // "prefill" | "layer" | "decode" | "resume"
  int64_t n_prompt = 0;
  int64_t replay = 0;   // B of the bounded run
  int64_t prefix = -1;  // resume P
  int64_t layer = -1;   // "layer": decoder layer
  int64_t step = -1;    // "decode": step 0..K-1
  double rel_l2 = 0, max_abs = 0, kl = 0;
  double top1 = 1;  // fraction agreeing
  bool exact = false;  // bitwise equal
  double top5 = 1;     // top-5 overlap / 5 (logits)
};

// The metrics of one row of n values t (bounded) against r (exact): rel L2,
// max abs, bitwise equality and, for logits, KL, top-1 and top-5.
void fill_metrics(DriftRow& row, const double* t, const double* r, int64_t n, bool logits);

struct SweepOptions {
  std::vector<int64_t> lengths;   // empty: W..64W doubling, plus R-1, R, R+1, D(W-1)
  std::vector<int64_t> prefixes;  // empty: W/2, W, W+1, 2W, 4W (below N)
  int64_t decode = 4;
  std::string backend = "reference";
  uint64_t weight_seed = 0, token_seed = 0;
};

std::vector<int64_t> default_lengths(const Plan& p);

// Compares ced bounded against exact recovery (the full mode, which equals
// ced exact at the last position) for each N. `progress(done, total)`.
std::vector<DriftRow> replay_sweep(const Config& c, const SweepOptions& o,
                                   const std::function<void(int64_t, int64_t, const std::string&)>& progress = {});

std::string drift_csv(const std::vector<DriftRow>& rows);
std::string drift_table(const std::vector<DriftRow>& rows);  // readable summary
// An SVG plot: prefill drift (last logits rel L2) and decode drift against N
// (log scale), and the per-layer drift at the largest N.
std::string drift_svg(const std::vector<DriftRow>& rows, const std::string& title);

}  // namespace ced::prop
