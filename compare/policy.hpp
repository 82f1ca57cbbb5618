#pragma once
// docs/spec.md §8: tolerance policies. A policy is a list of per-tensor rules read
// from TOML; the first rule whose pattern matches a tensor's name applies, a
// tensor no rule matches is an error. Every rule carries its reason.
//
//   [[rule]]
//   pattern = "runs/*/logits"        # glob, see glob_match
//   reason  = "f32 backend vs f64 reference: accumulation order differs"
//   atol = 1e-5                      # thresholds, all optional (compare.hpp Thresholds)
//   rtol = 1e-4
//   max_kl = 1e-8
//
//   [[rule]]                         # self-calibrating (see Rule::effective)
//   pattern = "runs/*/layers/*/out"
//   reason  = "scaled f32-vs-f64 reference error"
//   calibrate = true
//   alpha = 4.0
//   floor = 1e-7
//   abs_floor = 1e-6                 # optional, default: floor
//
// Keys of a rule: pattern, reason (both required, non-empty strings); atol,
// rtol, max_rel_l2, max_nmse, min_cosine, max_ulp, max_kl, max_kl_mean,
// max_kl_p99, max_kl_p999, min_top1, min_top5, min_jaccard, near_tie (numbers
// >= 0; min_cosine in [-1, 1], min_top1, min_top5 and min_jaccard in [0, 1]);
// greedy_top_n (a whole number >= 1); calibrate (bool), alpha, floor, abs_floor (numbers
// >= 0, only with calibrate = true; alpha required then). The only top-level
// key is `rule`. Anything else is an InputError naming the key and file:line.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compare/compare.hpp"

namespace ced {

// Glob over tensor names: `*` matches any run of characters except '/',
// `**` any run including '/', `?` one character except '/'; everything else
// matches itself. The whole name must match.
bool glob_match(std::string_view pattern, std::string_view name);

// The error of the reference in f32 against the reference in f64 on the same
// tensor, measured by the caller (calibration_of a compare_tensors of the
// f32 reference's tensor against the f64 reference's).
struct Calibration {
  double rel_l2 = 0;   // ||r32 - r64|| / ||r64||
  double max_abs = 0;  // max |r32 - r64|
};
Calibration calibration_of(const TensorCompare& ref32_vs_ref64);

struct Rule {
  std::string pattern;
  std::string reason;
  Thresholds thresholds;  // as written (a calibrated rule has no atol / max_rel_l2 here)
  bool calibrate = false;
  double alpha = 0;
  double floor = 0;
  std::optional<double> abs_floor;  // default: floor
  std::string origin;               // "file:line" of the [[rule]]

  // The thresholds that apply to a tensor. A self-calibrating rule scales
  // the reference error:
  //   max_rel_l2 = alpha * cal.rel_l2  + floor
  //   atol       = alpha * cal.max_abs + abs_floor   (rtol stays the rule's, default 0,
  //                so with no rtol this bounds the max abs error)
  // Every other threshold is taken as written. InputError when a calibrated
  // rule gets no calibration or a negative / non-finite one.
  Thresholds effective(std::string_view tensor, const std::optional<Calibration>& cal) const;
};

struct Policy {
  std::string origin;  // file name or a caller's label
  std::vector<Rule> rules;

  // The first rule whose pattern matches; nullptr if none.
  const Rule* match(std::string_view tensor) const;
  // The first matching rule; InputError naming the tensor (and the policy) if none.
  const Rule& rule_for(std::string_view tensor) const;
  // rule_for(tensor).effective(tensor, cal): what to pass to compare_tensors.
  Thresholds thresholds_for(std::string_view tensor, const std::optional<Calibration>& cal = std::nullopt) const;
};

// Parses policy TOML; origin names the text in messages ("file:line").
Policy parse_policy_toml(std::string_view text, const std::string& origin);
Policy load_policy_file(const std::filesystem::path& path);  // InputError if unreadable

// What was measured for one tensor: the tensor metrics, plus the logits or
// selection metrics when the tensor is one.
struct Comparison {
  std::optional<TensorCompare> tensor;
  std::optional<LogitsCompare> logits;
  std::optional<SelectionCompare> selection;
};

struct Violation {
  std::string threshold;  // "max_rel_l2", "nan", ...
  double measured = 0;
  double limit = 0;
  std::string detail;     // optional context (counts, where)
  std::string line() const;  // "max_rel_l2: measured 0.0031 > limit 0.001 (...)"
};

struct Verdict {
  std::string tensor;
  std::string pattern;  // of the rule applied (empty when judged without one)
  std::string reason;
  bool pass = true;
  std::vector<Violation> violations;
  // Thresholds the rule sets that this comparison cannot check (e.g. max_kl
  // on a tensor compared without logits metrics). Listed, not failed.
  std::vector<std::string> unchecked;

  // A headline "PASS|FAIL <tensor> (rule <pattern>: <reason>)", then one
  // line per violation and one for the unchecked thresholds, if any.
  std::vector<std::string> lines() const;
};

// Judges a comparison against thresholds. Always checked:
//   nan              NaN count of t and r together must be 0 (a NaN never passes)
//   inf_mismatch     Inf mismatches must be 0
//   invalid_selection  invalid selection entries must be 0 (selections)
// Checked when set, on the tensor metrics:
//   atol / rtol      mismatches must be 0 (measured: min_passing_atol, limit: atol)
//   max_rel_l2, max_nmse, max_ulp (upper bounds), min_cosine (lower bound)
// on the logits metrics: max_kl (against the largest per-row KL), max_kl_mean,
// max_kl_p99, max_kl_p999 (against the mean and nearest-rank quantiles of the
// per-row KL, generation.hpp), greedy_top_n (vLLM's greedy rule on the rows'
// argmaxes with N = greedy_top_n; measured: the larger rank of the two tokens
// at the first divergent row), min_top1 (against the top-1 agreement fraction),
// min_top5 (against the smallest per-row top-5 overlap); on the selection metrics:
// min_jaccard (against the smallest per-position Jaccard), near_tie (with
// scores: real disagreements must be 0; measured: worst gap).
// A numeric tensor (logits included) should always carry .tensor: its NaN
// and Inf checks are the ones no threshold can excuse. The TensorCompare must
// have been computed with th's atol and rtol, and a comparison must hold some
// metrics (std::logic_error otherwise).
Verdict judge(std::string_view tensor, const Thresholds& th, const Comparison& c);
// The same under the policy's rule for `tensor` (InputError if none matches),
// with the rule's pattern and reason in the verdict.
Verdict judge(const Policy& policy, std::string_view tensor, const Comparison& c,
              const std::optional<Calibration>& cal = std::nullopt);

std::string to_json(const Verdict& v);

}  // namespace ced
