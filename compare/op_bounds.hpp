#pragma once
// Admissible results of whole ops under a declared bound model (docs/sound-bounds.md §5-§7): a linear
// layer (a dot product per output) and an RMSNorm, each computed from the inputs the implementation was
// given, and a judge that says whether an implementation's results lie inside. Family-neutral: the v41
// gate judges its head with these; any op made of the same steps can.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compare/sum_bound.hpp"

namespace ced::bounds {

// How an implementation may compute: its sums (AccumulationModel) and its elementwise functions.
struct BoundModel {
  AccumulationModel accumulation;
  // sqrt, rsqrt, exp ... within this many units in the last place of the exact result: 0.5 correctly
  // rounded, 1 for glibc and Sleef (torch's CPU), 2 for CUDA's rsqrtf. The default admits all of them.
  double function_ulps = 2;
  // Every error bound multiplied by this: 1 in every verdict; the soundness tests set 0.5 to show that
  // a bound half as wide fails a legitimate implementation somewhere (the bound has teeth).
  double scale = 1;
  std::string name() const;  // "fp32, functions within 2 ulps"
};

// A bound model as a user names it: accumulation "fp32" or "tensor-core:BITS:INTERVAL" (Hopper's FP8:
// tensor-core:14:128), functions within `function_ulps` (at least 0.5). InputError on anything else.
BoundModel parse_bound_model(const std::string& accumulation, double function_ulps = 2);

// One element of an op's output as the reference sees it: its exact value in f64 (before the output
// rounding) and the results any implementation of the model may produce.
struct BoundedValue {
  double value = 0;
  Interval admissible;
  double nearest = 0;  // value rounded to nearest in the output format: the result that uses none of the bound
};

// An op whose exact result is `value` and whose fp32 result lies in [lo, hi] (every fp32 rounding of it
// inside the bound), every deviation from `value` multiplied by `scale`: the fp32 values inside, then, for
// a narrower output (`out_bits` < 24), the round-to-nearest cast of them (§4). The last step of every
// op bound; chained ops read its `admissible` as their input intervals.
BoundedValue bounded_result(double value, double lo, double hi, double scale, int out_bits);

// y[m, j] = Σ_k x[m, k]·w[j, k] (x [M, K], w [Nout, K], row-major, as a linear layer stores its weight),
// each output rounded to `out_bits` significant bits (24: fp32, 8: bf16). The products count as exact
// when x's and w's significands fit 24 bits together (bf16 × bf16), else as fp32 products.
std::vector<BoundedValue> linear_bounds(std::span<const double> x, int64_t M, int64_t K, std::span<const double> w,
                                        int64_t Nout, const BoundModel& model, int out_bits);

// The same over inputs known only as intervals [x_lo, x_hi] (an earlier op's admissible results, chained):
// the exact sum ranges over Σ min/max(x_lo·w, x_hi·w), and the implementation's error is bounded over
// Σ max(|x_lo|, |x_hi|)·|w|. `value` is the midpoint of the exact range.
std::vector<BoundedValue> linear_bounds(std::span<const double> x_lo, std::span<const double> x_hi, int64_t M, int64_t K,
                                        std::span<const double> w, int64_t Nout, const BoundModel& model, int out_bits);

// y = w·x / sqrt(mean(x²) + eps) over rows of n (x [rows, n], w [n]) in fp32, rounded to `out_bits`:
// the release's RMSNorm (x.square().mean() + eps, rsqrt, x·r, w·(x·r), cast). Any order of the two
// products, eps as given or rounded to fp32, and 1/sqrt, rsqrt or a division are covered.
std::vector<BoundedValue> rmsnorm_bounds(std::span<const double> x, int64_t n, std::span<const double> w, double eps,
                                         const BoundModel& model, int out_bits);
// The same over inputs known only as intervals (an earlier op's admissible results, chained): the sum of
// squares ranges over the squares' least and largest values, each output over its interval times the norm's.
std::vector<BoundedValue> rmsnorm_bounds(std::span<const double> x_lo, std::span<const double> x_hi, int64_t n,
                                         std::span<const double> w, double eps, const BoundModel& model, int out_bits);

// How results sit in their intervals.
struct BoundJudgement {
  int64_t n = 0;
  int64_t outside = 0;         // results outside their interval (a NaN is outside every interval)
  int64_t first_outside = -1;  // the first one's index
  double outside_by = 0;       // how far past the nearer end it lies
  // The largest fraction of its interval's half-width (on the side it lies) a result other than the
  // exact value's own rounding uses, and where.
  double max_use = 0;
  int64_t max_use_at = -1;
  // Intervals that admit more than one value of the output format: a rounding boundary lies inside, so
  // more than one result is some legitimate implementation's.
  int64_t straddled = 0;
};
BoundJudgement judge_within(std::span<const double> results, std::span<const BoundedValue> bounds);

// A top-k selection judged against score intervals (docs/sound-bounds.md §9): `chosen` (k distinct indices
// into one row) is admissible when some values inside the intervals make it the k largest, ties included:
// no entry left out has its lower end above a chosen entry's upper end. `contested` when another
// selection is admissible too (a left-out entry's upper end reaches a chosen entry's lower end): a
// near-tie, where either choice is some legitimate implementation's.
struct TopkJudgement {
  bool admissible = false;
  bool contested = false;
  int64_t in = -1, out = -1;  // inadmissible: the chosen and the left-out entry that prove it;
                              // contested: a pair that could trade places
};
TopkJudgement judge_topk(std::span<const Interval> row, std::span<const int64_t> chosen);

// Significant bits of x's binary significand (0 for zero, infinities and NaN count as 64): whether
// products of x are exact in a format.
int significant_bits(double x);

}  // namespace ced::bounds
