#pragma once
// Forward error bounds of floating-point sums and dot products under a declared accumulation model
// (docs/sound-bounds.md): the first brick of the sound gate. A bound here holds for every order of
// evaluation and every blocking the model admits, so a result outside it is no legitimate
// implementation's; the bound is computed from Σ|x_i|, a second pass on absolute values beside the value.
#include <cstdint>
#include <string>

namespace ced::bounds {

// How an implementation accumulates a sum of n terms.
struct AccumulationModel {
  enum class Kind {
    fp32,         // fp32 partial sums, round to nearest, any order or tree (torch, MKL, oneDNN, cuBLAS, split-K)
    tensor_core,  // chunks of `promotion_interval` terms in an accumulator of `accumulator_bits`
                  // significant bits that may truncate, each chunk's partial then added in fp32 (Hopper FP8)
  };
  Kind kind = Kind::fp32;
  int accumulator_bits = 24;      // tensor_core: significant bits the accumulator keeps (Hopper FP8: about 14)
  int64_t promotion_interval = 0; // tensor_core: terms per chunk before promotion to fp32 (DeepGEMM: 128)

  static AccumulationModel fp32() { return {}; }
  static AccumulationModel tensor_core(int accumulator_bits, int64_t promotion_interval);
  std::string name() const;  // "fp32", "tensor-core(14 bits, 128)"
};

// γ_k = k·u / (1 − k·u): the relative error bound of k successive roundings of unit u. InputError
// (ced::InputError) when k·u ≥ 1: no bound of this form exists.
double gamma(int64_t k, double u);

// The largest |fl(Σ x_i) − Σ x_i| any implementation of the model can produce for n terms whose
// absolute values sum to abs_sum. products_exact: the terms are products computed exactly (bf16 × bf16,
// e4m3 × e4m3, anything × a power of two), else each product adds one rounding of fp32.
double sum_error_bound(int64_t n, double abs_sum, const AccumulationModel& model, bool products_exact = true);

// The admissible results of a value v computed by the reference with error at most ref_error, judged
// under an implementation's error bound `error` and rounded to a format of `out_bits` significant bits
// (24: fp32, 8: bf16): every representable value between the outward-rounded ends.
struct Interval {
  double lo = 0, hi = 0;
  bool contains(double x) const { return lo <= x && x <= hi; }
};
Interval admissible(double v, double error, double ref_error, int out_bits);
// [lo, hi] widened to the grid of a format of `out_bits` significant bits: the values an implementation
// whose pre-rounding result lies in [lo, hi] may give after its output rounding.
Interval rounded_outward(double lo, double hi, int out_bits);
// The values of the format in [lo, hi] (rounded inward): the results of an implementation whose result is
// itself of that format and lies in [lo, hi] (an fp32 sum whose bound includes its last rounding).
// Outward instead when no value of the format lies inside.
Interval rounded_inward(double lo, double hi, int out_bits);
// [round to nearest even (lo), the same of hi]: every result of rounding a value of [lo, hi] to nearest
// (a cast to bf16), by the rounding's monotonicity, and no other.
Interval rounded_nearest(double lo, double hi, int out_bits);

}  // namespace ced::bounds
