// docs/spec.md §8.2: one logits row's ranking and KL (logits_rows.hpp).
#include "compare/logits_rows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ced {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

bool ranks_before(double a, int64_t ia, double b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia > ib;
}
std::vector<int64_t> top_indices(std::span<const double> row, int64_t k) {
  std::vector<int64_t> idx(row.size());
  std::iota(idx.begin(), idx.end(), int64_t{0});
  auto cmp = [&](int64_t a, int64_t b) {
    return ranks_before(row[static_cast<size_t>(a)], a, row[static_cast<size_t>(b)], b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), cmp);
  idx.resize(static_cast<size_t>(k));
  return idx;
}

int64_t rank_in_row(std::span<const double> row, int64_t index) {
  int64_t before = 0;
  for (size_t j = 0; j < row.size(); ++j)
    before += ranks_before(row[j], static_cast<int64_t>(j), row[static_cast<size_t>(index)], index);
  return before + 1;
}

double log_sum_exp(std::span<const double> x) {
  double m = -kInf;
  for (double v : x) m = std::max(m, v);
  if (m == -kInf) return -kInf;
  double s = 0;
  for (double v : x) s += std::exp(v - m);  // each term <= 1, the max term is 1
  return m + std::log(s);
}

double row_kl(std::span<const double> t, std::span<const double> r) {
  for (size_t j = 0; j < t.size(); ++j)
    if (std::isnan(t[j]) || std::isnan(r[j]) || t[j] == kInf || r[j] == kInf) return kInf;
  const double lse_t = log_sum_exp(t), lse_r = log_sum_exp(r);
  if (lse_t == -kInf || lse_r == -kInf) return kInf;
  double kl = 0;
  for (size_t j = 0; j < t.size(); ++j) {
    if (r[j] == -kInf) continue;  // p_r = 0
    const double log_pr = r[j] - lse_r;
    const double p_r = std::exp(log_pr);
    if (p_r == 0) continue;  // underflowed: contributes 0
    if (t[j] == -kInf) return kInf;
    kl += p_r * (log_pr - (t[j] - lse_t));
  }
  return std::max(kl, 0.0);
}

}  // namespace ced
