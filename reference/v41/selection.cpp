// docs/v41.md §8.7: the index selection's top-k under the tie switch.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "reference/v41/forward_ops.hpp"

namespace ced::v41::fwd {

std::vector<int64_t> select_topk(std::span<const double> values, int64_t k, bool as_fp32, V41TopkTies ties) {
  if (ties == V41TopkTies::torch) return torch_topk(values, k, false, as_fp32);
  std::vector<int64_t> order(values.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  auto key = [&](int64_t i) {
    const double v = values[static_cast<size_t>(i)];
    return as_fp32 ? static_cast<double>(static_cast<float>(v)) : v;
  };
  // NaN above everything, as torch_topk; equal values lower index first (stable).
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const double x = key(a), y = key(b);
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && !std::isnan(y);
    return x > y;
  });
  order.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(order.size()))));
  return order;
}

}  // namespace ced::v41::fwd
