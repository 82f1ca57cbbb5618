#include "tools/v41_study.hpp"

#include <algorithm>
#include <cmath>

#include "models/lab/weights.hpp"  // make_tokens
#include "oracle/v41_flops.hpp"

namespace ced::tools {

V41Seeded v41_seeded_model(const v41::V41Config& c, uint64_t weight_seed, v41::V41Regime regime, v41::V41Fault fault) {
  v41::check_v41_fits_in_memory(c);
  const v41::V41Checkpoint ck = v41::make_v41_random_checkpoint(c, weight_seed);
  V41Seeded s{v41::V41Model(c, ck.weights, regime), v41::v41_checkpoint_hashing(c)};
  s.model.set_fault(fault);
  s.model.set_captures(false);
  return s;
}

std::vector<int64_t> v41_seeded_tokens(uint64_t token_seed, const v41::V41Config& c, int64_t n) {
  std::vector<int64_t> tokens;
  for (int32_t v : make_tokens(token_seed, c.vocab_size, n)) tokens.push_back(v);
  return tokens;
}

double rel_l2(std::span<const double> t, std::span<const double> r) {
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    num += (t[i] - r[i]) * (t[i] - r[i]);
    den += r[i] * r[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::span<const double> last_logits(const v41::V41ForwardResult& r, int64_t vocab) {
  return std::span<const double>(r.logits).last(static_cast<size_t>(vocab));
}

double ced_flop_ratio(const v41::V41Config& c, const v41::V41Plan& p, const v41::V41ReplayConvention& conv,
                      int64_t N, int64_t K) {
  v41::V41FlopQuery full, ced;
  full.n_prompt = ced.n_prompt = N;
  ced.tail_start = std::max<int64_t>(0, N - K);
  ced.floor_first_layer = conv.floor_first_layer;
  ced.all_layers = conv.all_layers;
  return double(v41::v41_flop_model(c, p, ced).total()) / double(v41::v41_flop_model(c, p, full).total());
}

}  // namespace ced::tools
