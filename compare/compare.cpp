// docs/spec.md §8: tensor, logits and selection comparisons (formatting: compare_format.cpp).
#include "compare/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>
#include <utility>

#include "compare/logits_rows.hpp"
#include "model/error.hpp"

namespace ced {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Product of the dims; InputError for negative dims or a mismatch with n.
void check_shape(const char* what, std::span<const int64_t> shape, size_t n) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) throw InputError(fmt::format("{}: negative dimension {} in shape", what, d));
    if (d != 0 && count > std::numeric_limits<int64_t>::max() / d)
      throw InputError(fmt::format("{}: shape overflows int64", what));
    count *= d;
  }
  if (static_cast<uint64_t>(count) != n)
    throw InputError(fmt::format("{}: shape holds {} elements but the tensors have {}", what, count, n));
}

void check_tolerance(const char* name, double v) {
  if (!(v >= 0)) throw InputError(fmt::format("compare: {} must be >= 0 (got {})", name, v));
}

// x * 2^-e without overflow or needless underflow: exact whenever the result
// is a normal number. e is ilogb of a maximum, so |x| * 2^-e < 2.
struct Pow2Scale {
  double f1 = 1, f2 = 1;
  explicit Pow2Scale(int e) {
    // 2^-e needs two factors when -e > 1023 (subnormal maxima).
    if (-e > 1023) {
      f1 = std::ldexp(1.0, 1023);
      f2 = std::ldexp(1.0, -e - 1023);
    } else {
      f1 = std::ldexp(1.0, -e);
    }
  }
  double operator()(double x) const { return x * f1 * f2; }
};

int exponent_of(double max_abs) { return max_abs > 0 ? std::ilogb(max_abs) : 0; }

// Ordered integer keys: monotone in the value, -0 and +0 map to 0.
int64_t ordered_key64(double v) {
  const uint64_t u = std::bit_cast<uint64_t>(v);
  const int64_t mag = static_cast<int64_t>(u & 0x7FFFFFFFFFFFFFFFull);
  return (u >> 63) ? -mag : mag;
}
int64_t ordered_key32(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  const int64_t mag = static_cast<int64_t>(u & 0x7FFFFFFFu);
  return (u >> 31) ? -mag : mag;
}
uint16_t to_bf16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);  // RNE; Inf stays Inf (NaN excluded by caller)
  return static_cast<uint16_t>(rounded >> 16);
}
int64_t ordered_key16(uint16_t b) {
  const int64_t mag = b & 0x7FFF;
  return (b >> 15) ? -mag : mag;
}
uint64_t key_distance(int64_t a, int64_t b) {
  // The difference of two keys fits in uint64 even when it overflows int64.
  return a >= b ? static_cast<uint64_t>(a) - static_cast<uint64_t>(b)
                : static_cast<uint64_t>(b) - static_cast<uint64_t>(a);
}

Location locate(int64_t flat, std::span<const int64_t> shape, std::span<const double> t,
                std::span<const double> r) {
  Location loc;
  loc.flat = flat;
  if (flat >= 0) {
    loc.index = unravel_index(flat, shape);
    loc.t = t[static_cast<size_t>(flat)];
    loc.r = r[static_cast<size_t>(flat)];
  }
  return loc;
}

}  // namespace

const char* dtype_name(TensorDtype d) {
  switch (d) {
    case TensorDtype::F32: return "f32";
    case TensorDtype::F64: return "f64";
    case TensorDtype::BF16: return "bf16";
  }
  return "?";
}

TensorDtype parse_tensor_dtype(std::string_view s) {
  if (s == "f32") return TensorDtype::F32;
  if (s == "f64") return TensorDtype::F64;
  if (s == "bf16") return TensorDtype::BF16;
  throw InputError(fmt::format("dtype: unknown '{}' (expected f32, f64 or bf16)", s));
}

std::vector<int64_t> unravel_index(int64_t flat, std::span<const int64_t> shape) {
  if (flat < 0) return {};
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    const int64_t d = shape[k];
    if (d <= 0) return {};  // empty tensor: no element to name
    idx[k] = flat % d;
    flat /= d;
  }
  return idx;
}

uint64_t ulp_distance(double a, double b, TensorDtype dtype) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<uint64_t>::max();
  switch (dtype) {
    case TensorDtype::F64: return key_distance(ordered_key64(a), ordered_key64(b));
    case TensorDtype::F32:
      return key_distance(ordered_key32(static_cast<float>(a)), ordered_key32(static_cast<float>(b)));
    case TensorDtype::BF16:
      return key_distance(ordered_key16(to_bf16_bits(static_cast<float>(a))),
                          ordered_key16(to_bf16_bits(static_cast<float>(b))));
  }
  return 0;
}

TensorCompare compare_tensors(std::span<const double> t, std::span<const double> r, std::vector<int64_t> shape,
                              const Thresholds& th, TensorDtype dtype) {
  if (t.size() != r.size())
    throw InputError(fmt::format("compare: tensor has {} elements, reference has {}", t.size(), r.size()));
  check_shape("compare", shape, t.size());
  TensorCompare c;
  c.shape = std::move(shape);
  c.dtype = dtype;
  c.n = static_cast<int64_t>(t.size());
  c.atol = th.atol.value_or(0.0);
  c.rtol = th.rtol.value_or(0.0);
  check_tolerance("atol", c.atol);
  check_tolerance("rtol", c.rtol);

  auto count_nonfinite = [](NonFiniteCount& nf, double v, int64_t i) {
    if (std::isnan(v)) {
      if (nf.nan++ == 0) nf.first_nan = i;
    } else if (std::isinf(v)) {
      if (nf.inf++ == 0) nf.first_inf = i;
    }
  };

  // Pass 1: classification and the element-wise metrics.
  int64_t abs_at = -1, rel_at = -1, ulp_at = -1, mismatch_at = -1;
  double max_excess = 0;
  double max_t = 0, max_r = 0;  // over finite pairs
  for (size_t k = 0; k < t.size(); ++k) {
    const int64_t i = static_cast<int64_t>(k);
    const double a = t[k], b = r[k];
    count_nonfinite(c.t_nonfinite, a, i);
    count_nonfinite(c.r_nonfinite, b, i);
    if (std::isnan(a) || std::isnan(b)) {
      ++c.nan_pairs;
      if (c.mismatches++ == 0) mismatch_at = i;
      continue;
    }
    const bool same = (a == b);
    const bool inf_mismatch = !same && (std::isinf(a) || std::isinf(b));
    double err;
    if (same) {
      err = 0;
    } else if (inf_mismatch) {
      err = kInf;
      if (c.inf_mismatches++ == 0) c.first_inf_mismatch = i;
    } else {
      err = std::fabs(a - b);  // +Inf only if the true difference exceeds DBL_MAX
    }
    if (abs_at < 0 || err > c.max_abs_err) {
      c.max_abs_err = err;
      abs_at = i;
    }
    if (b == 0) {
      if (!same) ++c.zero_ref_nonzero;
    } else {
      double rel;
      if (same) rel = 0;
      else if (inf_mismatch) rel = kInf;
      else if (std::isinf(err)) rel = std::fabs(a * 0.5 - b * 0.5) / (std::fabs(b) * 0.5);  // overflowed difference
      else rel = err / std::fabs(b);
      if (rel_at < 0 || rel > c.max_rel_err) {
        c.max_rel_err = rel;
        rel_at = i;
      }
    }
    const uint64_t ulp = ulp_distance(a, b, dtype);
    if (ulp_at < 0 || ulp > c.max_ulp) {
      c.max_ulp = ulp;
      ulp_at = i;
    }
    double excess;
    bool fails;
    if (inf_mismatch) {
      excess = kInf;
      fails = true;
    } else {
      // rtol * |r| is 0 when either is (rtol = inf, r = 0 would make it NaN).
      const double slack = c.rtol == 0 || b == 0 ? 0.0 : c.rtol * std::fabs(b);
      excess = err - slack;
      if (std::isnan(excess)) excess = kInf;  // Inf - Inf: an overflowed difference against an overflowed slack
      fails = !(excess <= c.atol);
    }
    if (fails && c.mismatches++ == 0) mismatch_at = i;
    max_excess = std::max(max_excess, excess);
    if (std::isfinite(a) && std::isfinite(b)) {
      ++c.finite_pairs;
      max_t = std::max(max_t, std::fabs(a));
      max_r = std::max(max_r, std::fabs(b));
    }
  }
  c.min_passing_atol = max_excess;

  // Pass 2: the largest difference at a common scale (|a|, |b| <= 2 after it).
  const int e = exponent_of(std::max(max_t, max_r));
  const Pow2Scale common(e);
  double max_d = 0;
  for (size_t k = 0; k < t.size(); ++k) {
    if (!std::isfinite(t[k]) || !std::isfinite(r[k])) continue;
    max_d = std::max(max_d, std::fabs(common(t[k]) - common(r[k])));
  }

  // Pass 3: scaled sums of squares; every scaled maximum lies in [1, 2).
  const int et = exponent_of(max_t), er = exponent_of(max_r), ed = exponent_of(max_d);
  const Pow2Scale st(et), sr(er), sd(ed);
  double sum_t = 0, sum_r = 0, sum_tr = 0, sum_d = 0;
  for (size_t k = 0; k < t.size(); ++k) {
    if (!std::isfinite(t[k]) || !std::isfinite(r[k])) continue;
    const double ts = st(t[k]), rs = sr(r[k]), ds = sd(common(t[k]) - common(r[k]));
    sum_t += ts * ts;
    sum_r += rs * rs;
    sum_tr += ts * rs;
    sum_d += ds * ds;
  }
  if (sum_r == 0) {
    c.rel_l2 = c.nmse = (sum_d == 0 ? 0.0 : kInf);
  } else {
    // ||d|| = 2^(e+ed) sqrt(sum_d), ||r|| = 2^er sqrt(sum_r).
    const double q = sum_d / sum_r;
    c.rel_l2 = std::ldexp(std::sqrt(q), e + ed - er);
    c.nmse = std::ldexp(q, 2 * (e + ed - er));
  }
  if (sum_t == 0 && sum_r == 0) c.cosine = 1;
  else if (sum_t == 0 || sum_r == 0) c.cosine = 0;
  // Equal tensors (as numbers) have cosine exactly 1: the quotient below
  // rounds to 1 - 2^-53 for some, which would fail `min_cosine = 1`.
  else if (max_d == 0) c.cosine = 1;
  else c.cosine = std::clamp(sum_tr / (std::sqrt(sum_t) * std::sqrt(sum_r)), -1.0, 1.0);

  c.max_abs = locate(abs_at, c.shape, t, r);
  c.max_rel = locate(rel_at, c.shape, t, r);
  c.max_ulp_at = locate(ulp_at, c.shape, t, r);
  c.first_mismatch = locate(mismatch_at, c.shape, t, r);
  return c;
}

LogitsCompare compare_logits(std::span<const double> t, std::span<const double> r, std::vector<int64_t> shape,
                             int64_t greedy_top_n) {
  if (shape.size() != 2) throw InputError(fmt::format("compare logits: shape must be [P, V] (rank {})", shape.size()));
  if (t.size() != r.size())
    throw InputError(fmt::format("compare logits: tensor has {} elements, reference has {}", t.size(), r.size()));
  check_shape("compare logits", shape, t.size());
  LogitsCompare c;
  c.rows = shape[0];
  c.vocab = shape[1];
  c.topk = std::min<int64_t>(5, c.vocab);
  c.kl.assign(static_cast<size_t>(c.rows), 0.0);
  // With V = 0 there are no tokens: an empty sequence on both sides, identical.
  c.greedy = greedy_divergence(greedy_tokens(t, c.rows, c.vocab), c.vocab ? t : t.first(0),
                               greedy_tokens(r, c.rows, c.vocab), c.vocab ? r : r.first(0), c.vocab, greedy_top_n);
  if (c.rows == 0) return c;
  const size_t V = static_cast<size_t>(c.vocab);
  double kl_sum = 0, overlap_sum = 0;
  for (int64_t p = 0; p < c.rows; ++p) {
    const auto tp = t.subspan(static_cast<size_t>(p) * V, V);
    const auto rp = r.subspan(static_cast<size_t>(p) * V, V);
    const double kl = c.vocab == 0 ? 0.0 : row_kl(tp, rp);
    c.kl[static_cast<size_t>(p)] = kl;
    kl_sum += kl;
    if (c.max_kl_row < 0 || kl > c.max_kl) {
      c.max_kl = kl;
      c.max_kl_row = p;
    }
    double overlap = 1;
    if (c.topk > 0) {
      const auto top_t = top_indices(tp, c.topk), top_r = top_indices(rp, c.topk);
      if (top_t[0] == top_r[0]) ++c.top1_agree;
      else if (c.first_top1_disagreement < 0) c.first_top1_disagreement = p;
      int64_t common = 0;
      for (int64_t a : top_t) common += std::count(top_r.begin(), top_r.end(), a);
      overlap = static_cast<double>(common) / static_cast<double>(c.topk);
    } else {
      ++c.top1_agree;  // V = 0: nothing to disagree on
    }
    overlap_sum += overlap;
    if (c.min_topk_overlap_row < 0 || overlap < c.min_topk_overlap) {
      c.min_topk_overlap = overlap;
      c.min_topk_overlap_row = p;
    }
  }
  c.kl_distribution = kl_distribution(c.kl);
  const double P = static_cast<double>(c.rows);
  c.mean_kl = kl_sum / P;  // +Inf if any row is
  c.top1_fraction = static_cast<double>(c.top1_agree) / P;
  c.topk_overlap = overlap_sum / P;
  return c;
}

SelectionCompare compare_selections(std::span<const int64_t> t, std::span<const int64_t> r,
                                    std::vector<int64_t> shape, const Thresholds& th,
                                    const SelectionScores* scores, size_t max_listed) {
  if (shape.size() != 2)
    throw InputError(fmt::format("compare selections: shape must be [P, k] (rank {})", shape.size()));
  if (t.size() != r.size())
    throw InputError(fmt::format("compare selections: selection has {} entries, reference has {}", t.size(), r.size()));
  check_shape("compare selections", shape, t.size());
  if (scores && !scores->score) throw InputError("compare selections: SelectionScores without a score function");
  SelectionCompare c;
  c.rows = shape[0];
  c.k = shape[1];
  c.scored = scores != nullptr;
  c.near_tie = th.near_tie.value_or(0.0);
  check_tolerance("near_tie", c.near_tie);
  c.jaccard.assign(static_cast<size_t>(c.rows), 1.0);
  if (c.rows == 0) return c;
  const size_t K = static_cast<size_t>(c.k);

  // Sorted, deduplicated set of a row; counts invalid entries.
  auto row_set = [&](std::span<const int64_t> row, int64_t& invalid) {
    std::vector<int64_t> s;
    s.reserve(row.size());
    for (int64_t v : row) {
      if (v == -1) continue;
      if (v < -1) {
        ++invalid;
        continue;
      }
      s.push_back(v);
    }
    std::sort(s.begin(), s.end());
    const auto end = std::unique(s.begin(), s.end());
    invalid += static_cast<int64_t>(s.end() - end);
    s.erase(end, s.end());
    return s;
  };

  double sum = 0;
  for (int64_t p = 0; p < c.rows; ++p) {
    const auto a = row_set(t.subspan(static_cast<size_t>(p) * K, K), c.invalid_t);
    const auto b = row_set(r.subspan(static_cast<size_t>(p) * K, K), c.invalid_r);
    std::vector<int64_t> only_t, only_r;
    std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only_t));
    std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(only_r));
    const size_t inter = a.size() - only_t.size();
    const size_t uni = a.size() + only_r.size();
    const double j = uni == 0 ? 1.0 : static_cast<double>(inter) / static_cast<double>(uni);
    c.jaccard[static_cast<size_t>(p)] = j;
    sum += j;
    if (c.min_jaccard_row < 0 || j < c.min_jaccard) {
      c.min_jaccard = j;
      c.min_jaccard_row = p;
    }
    const int64_t diff = static_cast<int64_t>(only_t.size() + only_r.size());
    if (diff == 0) continue;
    c.differing += diff;
    ++c.differing_rows;

    double kth = kNaN;
    if (scores) {
      if (scores->kth_score) {
        kth = scores->kth_score(p);
      } else if (!b.empty()) {
        kth = kInf;
        for (int64_t e : b) kth = std::min(kth, scores->score(p, e));
      }
    }
    auto classify = [&](int64_t entry, bool in_t) {
      DifferingEntry d;
      d.row = p;
      d.entry = entry;
      d.in_t = in_t;
      d.score = kNaN;
      d.gap = kInf;
      if (scores) {
        d.score = scores->score(p, entry);
        const double g = std::fabs(d.score - kth);
        if (!std::isnan(g) && (!scores->tie_possible || scores->tie_possible(p, entry, in_t))) d.gap = g;
        d.near_tie = d.gap <= c.near_tie;
        if (d.near_tie) ++c.near_ties;
        else ++c.real_disagreements;
        if (c.worst_gap_row < 0 || d.gap > c.worst_gap) {
          c.worst_gap = d.gap;
          c.worst_gap_row = p;
          c.worst_gap_entry = entry;
        }
      }
      if (c.listed.size() < max_listed) c.listed.push_back(d);
    };
    // Row order, then entry order; r-only entries (missed) first.
    for (int64_t e : only_r) classify(e, false);
    for (int64_t e : only_t) classify(e, true);
  }
  c.mean_jaccard = sum / static_cast<double>(c.rows);
  return c;
}

}  // namespace ced
