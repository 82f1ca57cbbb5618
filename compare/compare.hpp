#pragma once
// docs/spec.md §8: the comparison engine behind `ced diff` and `ced gate`.
//
// Three comparisons, each a plain function returning a plain struct:
//   compare_tensors     any tensor t against its reference r (activations, logits, ...)
//   compare_logits      [P, V] logits: KL(softmax r || softmax t), top-1 and top-5
//   compare_selections  [P, k] top-k selections: Jaccard per position, near-ties
// Thresholds (what a policy rule may set, policy.hpp) live here because the
// element-wise mismatch count needs atol/rtol and the near-tie classification
// needs near_tie. Judging a comparison against thresholds is policy.hpp's job.
//
// Arithmetic: every metric is computed in double from double inputs (a f32
// backend's values are exactly representable). Norms are two-pass with
// power-of-two scaling, so ranges like 1e-300..1e300 neither overflow nor
// underflow. No metric is NaN where the quantity is defined; undefined cases
// have a documented value.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compare/generation.hpp"

namespace ced {

// The dtype a tensor was produced in (docs/spec.md §9 run attribute `dtype`). ULP
// distances are counted in this dtype.
enum class TensorDtype { F32, F64, BF16 };
const char* dtype_name(TensorDtype d);               // "f32" | "f64" | "bf16"
TensorDtype parse_tensor_dtype(std::string_view s);  // InputError

// Every threshold a policy rule may set (docs/spec.md §8); all optional. What each is
// compared with is documented in policy.hpp (judge).
struct Thresholds {
  std::optional<double> atol;         // element-wise |t-r| - rtol*|r| <= atol
  std::optional<double> rtol;
  std::optional<double> max_rel_l2;   // ||t-r|| / ||r||
  std::optional<double> max_nmse;     // sum (t-r)^2 / sum r^2
  std::optional<double> min_cosine;
  std::optional<double> max_ulp;      // in the tensor's dtype
  std::optional<double> max_kl;       // logits: the largest per-row KL(softmax r || softmax t)
  std::optional<double> max_kl_mean;  // logits: the mean per-row KL
  std::optional<double> max_kl_p99;   // logits: the nearest-rank 99th percentile of the per-row KL
  std::optional<double> max_kl_p999;  // logits: the nearest-rank 99.9th percentile
  std::optional<int64_t> greedy_top_n;  // logits: vLLM's greedy rule over the rows' argmaxes (generation.hpp)
  std::optional<double> min_top1;     // logits: fraction of rows whose argmax agrees
  std::optional<double> min_top5;     // logits: the smallest per-row top-5 overlap |T5(t) ∩ T5(r)| / 5
  std::optional<double> min_jaccard;  // selections: the smallest per-position Jaccard index
  std::optional<double> near_tie;     // selections: largest score gap still called a near-tie
};

// Row-major multi-index of a flat index; empty when flat < 0.
std::vector<int64_t> unravel_index(int64_t flat, std::span<const int64_t> shape);

// ULP distance between a and b counted in dtype: both are first rounded to the
// dtype (f32: C++ double->float conversion, round to nearest even; bf16: that
// float rounded to nearest even on its top 16 bits), then the distance is the
// difference of their ordered integer representations. -0 and +0 are 0 apart,
// the largest finite value and +Inf are 1 apart. Symmetric. UINT64_MAX if
// either is NaN.
uint64_t ulp_distance(double a, double b, TensorDtype dtype);

// Where a metric was attained: flat and multi-dimensional index, both values.
struct Location {
  int64_t flat = -1;           // -1: no element
  std::vector<int64_t> index;  // row-major, same rank as the shape
  double t = 0;
  double r = 0;
};

struct NonFiniteCount {
  int64_t nan = 0;
  int64_t inf = 0;         // +Inf and -Inf
  int64_t first_nan = -1;  // flat index, -1: none
  int64_t first_inf = -1;
};

// docs/spec.md §8 metrics of t against reference r. Pairs are classified first:
//  - a NaN pair (t or r is NaN) is excluded from every metric but counted in
//    t_nonfinite / r_nonfinite and nan_pairs, and is always a mismatch: a NaN
//    never passes, even at the same place in both tensors;
//  - an Inf mismatch (t or r is ±Inf and t != r) has abs and rel error +Inf,
//    is always a mismatch and counts in inf_mismatches; identical infinities
//    are equal values (error 0) but still show in the Inf counts;
//  - everything else is compared as numbers (-0 == +0).
// Which pairs each metric covers:
//  max_abs_err, max_ulp, mismatches, min_passing_atol: all non-NaN pairs.
//  max_rel_err: non-NaN pairs with r != 0; pairs with r == 0 and t != 0 are
//    counted in zero_ref_nonzero instead (their |t| shows in max_abs_err).
//  rel_l2, nmse, cosine: pairs where both values are finite.
struct TensorCompare {
  std::vector<int64_t> shape;
  TensorDtype dtype = TensorDtype::F64;
  int64_t n = 0;  // elements

  NonFiniteCount t_nonfinite, r_nonfinite;
  int64_t nan_pairs = 0;       // elements where t or r is NaN
  int64_t inf_mismatches = 0;  // elements where t or r is ±Inf and t != r (no NaN)
  int64_t first_inf_mismatch = -1;
  int64_t finite_pairs = 0;    // elements the norm metrics cover

  double max_abs_err = 0;  // |t-r|; +Inf if the difference overflows double
  Location max_abs;        // first element attaining it
  double max_rel_err = 0;  // |t-r| / |r| over r != 0
  Location max_rel;
  int64_t zero_ref_nonzero = 0;  // r == 0, t != 0: relative error undefined

  // ||t-r|| / ||r||: 0 when both are zero, +Inf when only r is.
  double rel_l2 = 0;
  // sum (t-r)^2 / sum r^2: the same zero rules.
  double nmse = 0;
  // <t,r> / (||t|| ||r||) clamped to [-1, 1]: 1 when both are zero, 0 when
  // exactly one is (no direction to agree with); exactly 1 when t == r.
  double cosine = 1;

  uint64_t max_ulp = 0;  // in dtype
  Location max_ulp_at;

  // An element passes iff |t-r| - rtol*|r| <= atol, evaluated in double in
  // that order (so min_passing_atol is exact: it passes, its predecessor fails).
  double atol = 0;
  double rtol = 0;
  int64_t mismatches = 0;
  Location first_mismatch;
  // max over non-NaN pairs of |t-r| - rtol*|r|, clamped at 0 (+Inf with an
  // Inf mismatch). NaN pairs fail at any atol.
  double min_passing_atol = 0;

  bool all_finite() const {
    return t_nonfinite.nan + t_nonfinite.inf + r_nonfinite.nan + r_nonfinite.inf == 0;
  }
};

// shape: the tensor's dimensions (row-major); its product must equal t.size()
// == r.size(). Uses th.atol and th.rtol (0 when absent) for the mismatch count
// and th.rtol for min_passing_atol. InputError on size/shape mismatch or a
// negative/NaN atol or rtol.
TensorCompare compare_tensors(std::span<const double> t,  // [shape]
                              std::span<const double> r,  // [shape]
                              std::vector<int64_t> shape, const Thresholds& th, TensorDtype dtype);

// docs/spec.md §8 logits metrics of t against r, both [P, V] (rows = positions).
// KL per row: KL(softmax r || softmax t) = sum_j p_r,j (log p_r,j - log p_t,j)
// with log p = x - logsumexp(x), in double, clamped at 0. -Inf logits are
// probability 0 (a -Inf in t where p_r > 0 gives +Inf); a row with a NaN or
// +Inf in t or r, or with every logit -Inf, has KL +Inf (undefined counts as
// failing, never as NaN).
// Top-k ranking (top-1 and top-5): higher value first; equal values (-0 == +0)
// rank the larger index first, the same tie rule as the selections of docs/spec.md
// §3.4; NaN ranks below everything (larger index first among NaNs).
struct LogitsCompare {
  int64_t rows = 0;   // P
  int64_t vocab = 0;  // V
  std::vector<double> kl;  // [P]
  double mean_kl = 0;
  double max_kl = 0;
  int64_t max_kl_row = -1;  // first row attaining it
  int64_t top1_agree = 0;   // rows whose top-1 index is the same
  double top1_fraction = 1; // top1_agree / P (1 when P = 0)
  int64_t first_top1_disagreement = -1;
  int64_t topk = 5;          // min(5, V)
  double topk_overlap = 1;   // mean over rows of |topk(t) ∩ topk(r)| / topk (1 when P = 0)
  double min_topk_overlap = 1;
  int64_t min_topk_overlap_row = -1;
  KlDistribution kl_distribution;  // of kl (generation.hpp): mean and nearest-rank quantiles
  // Teacher-forced greedy (docs/spec.md §8.7): each row's argmax is its side's token,
  // rows in position order are the steps; t is side a, r side b.
  GreedyDivergence greedy;
};
LogitsCompare compare_logits(std::span<const double> t,  // [P, V]
                             std::span<const double> r,  // [P, V]
                             std::vector<int64_t> shape,  // {P, V}; InputError otherwise
                             int64_t greedy_top_n = kGreedyTopN);

// Reference scores for the near-tie classification of differing selections.
struct SelectionScores {
  // The reference's score of `entry` at selection row `row` (required).
  std::function<double(int64_t row, int64_t entry)> score;
  // The k-th (boundary) score of a row. When empty: the lowest reference
  // score among the entries the reference selected in that row; a row the
  // reference left empty has no boundary (every differing entry is real).
  std::function<double(int64_t row)> kth_score;
  // Whether a tie can explain a differing entry at all; when empty, always.
  // Files (docs/spec.md §8.3): not when the side that left the entry out left
  // nothing out (the entry was never its candidate); such an entry is real.
  std::function<bool(int64_t row, int64_t entry, bool in_t)> tie_possible;
};

struct DifferingEntry {
  int64_t row = 0;
  int64_t entry = 0;
  bool in_t = false;       // selected by t only (else by r only)
  double score = 0;        // reference score (NaN without scores; between files, estimated for an
                           // entry the reference left out: docs/spec.md §8.3)
  double gap = 0;          // |score - kth score|; +Inf when undefined (NaN score, no boundary)
  bool near_tie = false;   // gap <= near_tie
};

// docs/spec.md §8 top-k selection agreement. Rows are sets of the non-(-1) entries.
// Entries < -1 and duplicates in a row are invalid (counted, then ignored).
// Jaccard = |A ∩ B| / |A ∪ B|, 1 for two empty sets.
struct SelectionCompare {
  int64_t rows = 0;  // P
  int64_t k = 0;
  std::vector<double> jaccard;  // [P]
  double mean_jaccard = 1;      // 1 when P = 0
  double min_jaccard = 1;
  int64_t min_jaccard_row = -1; // first row attaining it
  int64_t invalid_t = 0;        // entries < -1 or duplicated within a row
  int64_t invalid_r = 0;
  int64_t differing = 0;        // entries in exactly one of the two sets, all rows
  int64_t differing_rows = 0;
  // Near-tie classification; only with scores.
  bool scored = false;
  double near_tie = 0;          // the threshold used (th.near_tie, default 0)
  int64_t near_ties = 0;
  int64_t real_disagreements = 0;
  double worst_gap = 0;         // largest gap over differing entries
  int64_t worst_gap_row = -1;
  int64_t worst_gap_entry = -1;
  // The first max_listed differing entries in row order (all counts above
  // cover every entry).
  std::vector<DifferingEntry> listed;
};
SelectionCompare compare_selections(std::span<const int64_t> t,  // [P, k], -1 padded
                                    std::span<const int64_t> r,  // [P, k], -1 padded
                                    std::vector<int64_t> shape,  // {P, k}
                                    const Thresholds& th,        // near_tie
                                    const SelectionScores* scores = nullptr, size_t max_listed = 1000);

// Formatting (compare_format.cpp). summary(): one line, counts of NaN/Inf
// first, then the metrics. to_json(): one JSON object; doubles print with the
// shortest representation that round-trips, non-finite ones as the strings
// "inf", "-inf", "nan".
std::string summary(const TensorCompare& c);
std::string summary(const LogitsCompare& c);
std::string summary(const SelectionCompare& c);
// The generation-level verdicts (generation.hpp) in words. Rows are named
// "row r", or "position p" when positions (row -> position) are given; a and b
// name the two sides of a greedy divergence.
std::string summary(const KlDistribution& d, std::span<const int64_t> positions = {});
std::string summary(const GreedyDivergence& g, std::span<const int64_t> positions = {}, std::string_view a = "a",
                    std::string_view b = "b");
std::string to_json(const TensorCompare& c);
std::string to_json(const KlDistribution& d);
std::string to_json(const GreedyDivergence& g);
std::string to_json(const LogitsCompare& c);
std::string to_json(const SelectionCompare& c);
// JSON building blocks, shared with policy.cpp and the tools.
std::string json_string(std::string_view s);  // quoted and escaped
std::string json_number(double v);            // round-trip digits or "inf"/"-inf"/"nan" strings

}  // namespace ced
