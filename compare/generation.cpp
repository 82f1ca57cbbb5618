// docs/spec.md §8.7: generation-level verdicts (generation.hpp).
#include "compare/generation.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "compare/logits_rows.hpp"
#include "model/error.hpp"

namespace ced {
namespace {

void check_rows(const char* what, std::span<const double> logits, int64_t rows, int64_t vocab) {
  if (rows < 0 || vocab < 0) throw InputError(fmt::format("{}: negative shape [{}, {}]", what, rows, vocab));
  if (logits.size() != static_cast<size_t>(rows) * static_cast<size_t>(vocab))
    throw InputError(fmt::format("{}: {} logits for [{}, {}]", what, logits.size(), rows, vocab));
}

std::span<const double> row_of(std::span<const double> logits, int64_t row, int64_t vocab) {
  return logits.subspan(static_cast<size_t>(row * vocab), static_cast<size_t>(vocab));
}

// The first row whose KL is v (v is one of them).
int64_t first_row_of(std::span<const double> kl, double v) {
  return static_cast<int64_t>(std::find(kl.begin(), kl.end(), v) - kl.begin());
}

// Nearest rank of the q-quantile, q = thousandths / 1000: ceil(q·n), at least 1.
size_t nearest_rank(size_t n, size_t thousandths) { return std::max<size_t>(1, (n * thousandths + 999) / 1000); }

}  // namespace

KlDistribution kl_distribution(std::span<const double> kl) {
  KlDistribution d;
  d.count = static_cast<int64_t>(kl.size());
  if (kl.empty()) return d;
  for (size_t i = 0; i < kl.size(); ++i)
    if (std::isnan(kl[i])) throw InputError(fmt::format("kl distribution: row {} is NaN", i));
  std::vector<double> sorted(kl.begin(), kl.end());
  std::sort(sorted.begin(), sorted.end());
  // +Inf stays +Inf; a sum of finite KLs cannot overflow at any realistic count.
  d.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(sorted.size());
  auto quantile = [&](size_t thousandths, double& value, int64_t& row) {
    value = sorted[nearest_rank(sorted.size(), thousandths) - 1];
    row = first_row_of(kl, value);
  };
  quantile(500, d.p50, d.p50_row);
  quantile(990, d.p99, d.p99_row);
  quantile(999, d.p999, d.p999_row);
  quantile(1000, d.max, d.max_row);
  return d;
}

KlDistribution kl_distribution(std::span<const double> ref_logits, std::span<const double> test_logits, int64_t rows,
                               int64_t vocab) {
  check_rows("kl distribution (reference)", ref_logits, rows, vocab);
  check_rows("kl distribution (under test)", test_logits, rows, vocab);
  std::vector<double> kl(static_cast<size_t>(rows), 0.0);
  if (vocab > 0)
    for (int64_t p = 0; p < rows; ++p)
      kl[static_cast<size_t>(p)] = row_kl(row_of(test_logits, p, vocab), row_of(ref_logits, p, vocab));
  return kl_distribution(kl);
}

GreedyDivergence greedy_divergence(std::span<const int64_t> tokens_a, std::span<const double> logits_a,
                                   std::span<const int64_t> tokens_b, std::span<const double> logits_b, int64_t vocab,
                                   int64_t top_n) {
  if (top_n < 1) throw InputError(fmt::format("greedy divergence: top_n must be >= 1 (got {})", top_n));
  if (tokens_a.size() != tokens_b.size())
    throw InputError(fmt::format("greedy divergence: {} steps vs {}", tokens_a.size(), tokens_b.size()));
  const auto steps = static_cast<int64_t>(tokens_a.size());
  check_rows("greedy divergence (a)", logits_a, steps, vocab);
  check_rows("greedy divergence (b)", logits_b, steps, vocab);
  for (const auto tokens : {tokens_a, tokens_b})
    for (size_t s = 0; s < tokens.size(); ++s)
      if (tokens[s] < 0 || tokens[s] >= vocab)
        throw InputError(fmt::format("greedy divergence: token {} at step {} is outside [0, {})", tokens[s], s, vocab));
  GreedyDivergence g;
  g.steps = steps;
  g.top_n = top_n;
  const auto diverge = std::mismatch(tokens_a.begin(), tokens_a.end(), tokens_b.begin());
  if (diverge.first == tokens_a.end()) return g;
  g.step = diverge.first - tokens_a.begin();
  g.token_a = *diverge.first;
  g.token_b = *diverge.second;
  const auto a = row_of(logits_a, g.step, vocab), b = row_of(logits_b, g.step, vocab);
  g.rank_a_in_b = rank_in_row(b, g.token_a);
  g.rank_b_in_a = rank_in_row(a, g.token_b);
  g.gap_a = a[static_cast<size_t>(g.token_a)] - a[static_cast<size_t>(g.token_b)];
  g.gap_b = b[static_cast<size_t>(g.token_b)] - b[static_cast<size_t>(g.token_a)];
  // Two different tokens in [0, vocab): vocab >= 2, so each row has a top-2.
  auto top2_margin = [](std::span<const double> row) {
    const auto top = top_indices(row, 2);
    return row[static_cast<size_t>(top[0])] - row[static_cast<size_t>(top[1])];
  };
  g.top2_margin_a = top2_margin(a);
  g.top2_margin_b = top2_margin(b);
  g.pass = g.passes(top_n);
  return g;
}

std::vector<int64_t> greedy_tokens(std::span<const double> logits, int64_t rows, int64_t vocab) {
  check_rows("greedy tokens", logits, rows, vocab);
  std::vector<int64_t> tokens;
  if (vocab == 0) return tokens;
  for (int64_t p = 0; p < rows; ++p) tokens.push_back(top_indices(row_of(logits, p, vocab), 1)[0]);
  return tokens;
}

GreedyAgreement greedy_agreement(const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>& sequences) {
  GreedyAgreement g;
  g.prompts = static_cast<int64_t>(sequences.size());
  if (sequences.empty()) return g;
  double prefix_sum = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& [a, b] = sequences[i];
    const size_t n = std::min(a.size(), b.size());
    const auto shared = std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin()).first - a.begin();
    prefix_sum += static_cast<double>(shared);
    if (a == b) ++g.agreeing;
    else if (g.first_disagreeing < 0) g.first_disagreeing = static_cast<int64_t>(i);
  }
  g.rate = static_cast<double>(g.agreeing) / static_cast<double>(g.prompts);
  g.mean_prefix = prefix_sum / static_cast<double>(g.prompts);
  return g;
}

}  // namespace ced
