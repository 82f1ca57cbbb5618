#pragma once
// docs/spec.md §8.7: generation-level verdicts over logits rows ([rows, V], row-major,
// double). A row is a position of one prompt, or a step of one generation.
//
//   kl_distribution     KL(softmax ref || softmax test) per row and its distribution
//   greedy_divergence   vLLM's rule for two greedy sequences: at the first step where
//                       the tokens differ, each side's token must be in the other's top-N
//   greedy_agreement    over several prompts: how many greedy sequences agree exactly
//
// Pure functions; the ranking and the per-row KL are the logits metrics' own
// (logits_rows.hpp), so a verdict here and a metric of compare.hpp never
// disagree on which token leads or how far two rows are apart.
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace ced {

// The distribution of per-row KLs. Quantiles are nearest-rank: of n values sorted
// ascending, the q-quantile is the value of 1-based rank ceil(q·n) (at least 1),
// computed in integers (q in thousandths), so p99 of 100 rows is the 99th and p99
// of fewer than 100 rows is the largest. Each *_row is the first row (lowest index)
// whose KL equals that value. No rows: every value 0, every row -1.
struct KlDistribution {
  int64_t count = 0;
  double mean = 0;  // +Inf when any row is +Inf
  double p50 = 0, p99 = 0, p999 = 0, max = 0;
  int64_t p50_row = -1, p99_row = -1, p999_row = -1, max_row = -1;
};

// From per-row KLs (compare_logits' LogitsCompare::kl). InputError on a NaN:
// a per-row KL is never NaN (undefined rows are +Inf).
KlDistribution kl_distribution(std::span<const double> per_row_kl);
// From the logits themselves: KL(softmax ref || softmax test) per row, log-sum-exp
// stable (docs/spec.md §8.2). InputError unless both spans hold rows · vocab values.
KlDistribution kl_distribution(std::span<const double> ref_logits, std::span<const double> test_logits, int64_t rows,
                               int64_t vocab);

// vLLM's rule (the idea of its tests' check_logprobs_close, reimplemented) for two
// greedy sequences a and b of equal length, with each side's logits at each step.
// The first step where the tokens differ decides: the verdict passes iff a's token
// is within b's top-N there and b's token within a's. Ranks follow docs/spec.md §8.2
// (higher first, ties larger index first, NaN last), 1-based. Identical sequences
// pass with step -1 and every other field at its default.
constexpr int64_t kGreedyTopN = 5;
struct GreedyDivergence {
  int64_t steps = 0;    // sequence length compared
  int64_t top_n = kGreedyTopN;
  int64_t step = -1;    // first step where the tokens differ; -1: none
  int64_t token_a = -1, token_b = -1;  // each side's token at that step
  int64_t rank_a_in_b = 0;  // rank of a's token among b's logits at the step
  int64_t rank_b_in_a = 0;  // rank of b's token among a's logits
  // Each side's logit of its own token minus its logit of the other's token:
  // how far that side was from choosing the other's token (NaN when both are -Inf).
  double gap_a = 0, gap_b = 0;
  // Each side's top-1 minus top-2 logit at the step: how close that side was to a tie.
  double top2_margin_a = 0, top2_margin_b = 0;
  bool pass = true;  // passes(top_n)

  bool passes(int64_t n) const { return step < 0 || (rank_a_in_b <= n && rank_b_in_a <= n); }
  // The larger of the two ranks: the smallest top-N that would pass (1 when identical).
  int64_t worst_rank() const { return step < 0 ? 1 : std::max(rank_a_in_b, rank_b_in_a); }
};

// tokens_x: [steps] the side's chosen token per step; logits_x: [steps, vocab].
// InputError on lengths that differ or do not match, a token outside [0, vocab),
// or top_n < 1.
GreedyDivergence greedy_divergence(std::span<const int64_t> tokens_a, std::span<const double> logits_a,
                                   std::span<const int64_t> tokens_b, std::span<const double> logits_b,
                                   int64_t vocab, int64_t top_n = kGreedyTopN);

// Each row's greedy token: the index that ranks first (docs/spec.md §8.2), so a
// teacher-forced run's rows read as a greedy sequence. [rows]; empty when vocab is 0.
std::vector<int64_t> greedy_tokens(std::span<const double> logits, int64_t rows, int64_t vocab);

// Over prompts, each a pair of greedy sequences (either length): the fraction
// that agree exactly (same tokens, same length) and the mean length of the
// prefix the two sides share. No prompts: rate 1, mean prefix 0.
struct GreedyAgreement {
  int64_t prompts = 0;
  int64_t agreeing = 0;
  double rate = 1;         // agreeing / prompts
  double mean_prefix = 0;  // mean over prompts of the shared prefix length
  int64_t first_disagreeing = -1;  // first prompt (index) that does not agree
};
GreedyAgreement greedy_agreement(const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>& sequences);

}  // namespace ced
