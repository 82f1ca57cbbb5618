// docs/spec.md §8.7: the generation-level verdicts (compare/generation.hpp) and the policy
// keys that gate them, each shown failing on a planted difference: one perturbed row
// over a KL quantile bound, a greedy divergence whose token falls outside the other
// side's top-N, prompts whose greedy sequences part.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "compare/compare.hpp"
#include "compare/generation.hpp"
#include "compare/policy.hpp"
#include "model/error.hpp"

using namespace ced;

namespace {

constexpr int64_t kVocab = 10;

// `rows` rows of kVocab logits: row p holds (j * 0.37 + p) mod 3, ties included.
std::vector<double> base_logits(int64_t rows) {
  std::vector<double> x;
  for (int64_t p = 0; p < rows; ++p)
    for (int64_t j = 0; j < kVocab; ++j) x.push_back(std::fmod(double(j) * 0.37 + double(p), 3.0));
  return x;
}

// The reference's logits with row `row` perturbed: its column 0 raised by `delta`.
std::vector<double> perturbed(std::vector<double> x, int64_t row, double delta) {
  x[size_t(row * kVocab)] += delta;
  return x;
}

// One step of kVocab logits whose ranking is the given order (first = top-1):
// descending values 10, 9, 8, ...
std::vector<double> ranked_row(const std::vector<int64_t>& order) {
  std::vector<double> row(kVocab, 0.0);
  for (size_t i = 0; i < order.size(); ++i) row[size_t(order[i])] = 10.0 - double(i);
  return row;
}

Policy logits_policy(const std::string& keys) {
  return parse_policy_toml("[[rule]]\npattern = \"**\"\nreason = \"test\"\n" + keys + "\n", "test.toml");
}

Verdict judge_logits(const std::vector<double>& t, const std::vector<double>& r, const Policy& p) {
  const Thresholds th = p.thresholds_for("runs/x/logits");
  Comparison c;
  const std::vector<int64_t> shape = {int64_t(r.size()) / kVocab, kVocab};
  c.tensor = compare_tensors(t, r, shape, th, TensorDtype::F64);
  c.logits = compare_logits(t, r, shape, th.greedy_top_n.value_or(kGreedyTopN));
  return judge(p, "runs/x/logits", c);
}

std::string violations_text(const Verdict& v) {
  std::string s;
  for (const auto& line : v.lines()) s += line + "\n";
  return s;
}

}  // namespace

TEST(KlDistribution, QuantilesAreTheNearestRankOfTheSortedRows) {
  // 1000 rows with KL 0.000, 0.001, ..., 0.999 in reverse order: the q-quantile is rank ceil(q·1000).
  std::vector<double> kl;
  for (int i = 999; i >= 0; --i) kl.push_back(i / 1000.0);
  const KlDistribution d = kl_distribution(kl);
  EXPECT_EQ(d.count, 1000);
  EXPECT_DOUBLE_EQ(d.p50, 0.499);   // rank 500
  EXPECT_DOUBLE_EQ(d.p99, 0.989);   // rank 990
  EXPECT_DOUBLE_EQ(d.p999, 0.998);  // rank 999
  EXPECT_DOUBLE_EQ(d.max, 0.999);
  EXPECT_EQ(d.p99_row, 10);  // rows are named where they stand, not where they sort
  EXPECT_EQ(d.max_row, 0);
  EXPECT_NEAR(d.mean, 0.4995, 1e-12);
}

TEST(KlDistribution, OfFewerThanAHundredRowsP99IsTheLargest) {
  const KlDistribution d = kl_distribution(std::vector<double>{0.0, 3.0, 1.0, 3.0});
  EXPECT_EQ(d.p99, 3.0);
  EXPECT_EQ(d.p99_row, 1);  // the first of the tied rows
  EXPECT_EQ(d.p50, 1.0);    // rank 2 of 0, 1, 3, 3
}

TEST(KlDistribution, NoRowsIsZeroWithNoRowNamed) {
  const KlDistribution d = kl_distribution(std::vector<double>{});
  EXPECT_EQ(d.count, 0);
  EXPECT_EQ(d.max, 0.0);
  EXPECT_EQ(d.p99_row, -1);
}

TEST(KlDistribution, FromLogitsIsTheLogitsMetricsPerRowKl) {
  const auto r = base_logits(6), t = perturbed(r, 4, 2.5);
  const KlDistribution d = kl_distribution(r, t, 6, kVocab);
  const LogitsCompare lc = compare_logits(t, r, {6, kVocab});
  EXPECT_EQ(d.max, lc.max_kl);
  EXPECT_EQ(d.max_row, 4);
  EXPECT_EQ(d.mean, lc.kl_distribution.mean);
  EXPECT_GT(d.max, 0.0);
  EXPECT_EQ(d.p50, 0.0);
}

TEST(KlDistribution, LogitsOfTheWrongSizeAreRefused) {
  const auto r = base_logits(3);
  EXPECT_THROW(kl_distribution(r, base_logits(2), 3, kVocab), InputError);
  EXPECT_THROW(kl_distribution(std::vector<double>{0.0, std::nan("")}), InputError);
}

TEST(KlDistribution, OnePerturbedRowOverAP99BoundFailsWithThatRowNamed) {
  const auto r = base_logits(50);
  const Policy p = logits_policy("max_kl_p99 = 1e-9");
  EXPECT_TRUE(judge_logits(r, r, p).pass);
  const Verdict v = judge_logits(perturbed(r, 17, 0.5), r, p);
  ASSERT_FALSE(v.pass) << violations_text(v);
  ASSERT_EQ(v.violations.size(), 1u) << violations_text(v);
  EXPECT_EQ(v.violations[0].threshold, "max_kl_p99");
  EXPECT_NE(v.violations[0].detail.find("row 17"), std::string::npos) << v.violations[0].detail;
}

TEST(KlDistribution, AP99BoundPassesOneOutlierInAThousandRowsThatMaxKlFails) {
  const auto r = base_logits(1000), t = perturbed(r, 640, 0.5);
  EXPECT_TRUE(judge_logits(t, r, logits_policy("max_kl_p99 = 1e-9")).pass);
  const Verdict p999 = judge_logits(t, r, logits_policy("max_kl_p999 = 1e-9"));
  EXPECT_TRUE(p999.pass) << violations_text(p999);  // rank 999 of 1000: still a zero
  const Verdict two = judge_logits(perturbed(t, 641, 0.5), r, logits_policy("max_kl_p999 = 1e-9"));
  EXPECT_FALSE(two.pass);  // two outliers reach rank 999
  EXPECT_FALSE(judge_logits(t, r, logits_policy("max_kl = 1e-9")).pass);
  const Verdict mean = judge_logits(t, r, logits_policy("max_kl_mean = 1e-9"));
  ASSERT_FALSE(mean.pass);
  EXPECT_NE(mean.violations[0].detail.find("row 640"), std::string::npos) << mean.violations[0].detail;
}

TEST(GreedyDivergence, IdenticalSequencesPassWithStepMinusOne) {
  const auto logits = base_logits(4);
  const auto tokens = greedy_tokens(logits, 4, kVocab);
  const GreedyDivergence g = greedy_divergence(tokens, logits, tokens, logits, kVocab);
  EXPECT_TRUE(g.pass);
  EXPECT_EQ(g.step, -1);
  EXPECT_EQ(g.steps, 4);
  EXPECT_EQ(g.worst_rank(), 1);
}

TEST(GreedyDivergence, EachTokenInTheOthersTopNPassesWithStepTokensRanksAndMarginsReported) {
  // Step 0 agrees (token 3); at step 1 a chose 2 (b's second), b chose 5 (a's fourth).
  std::vector<double> a = ranked_row({3, 1}), b = ranked_row({3, 1});
  const auto a1 = ranked_row({2, 7, 4, 5}), b1 = ranked_row({5, 2});
  a.insert(a.end(), a1.begin(), a1.end());
  b.insert(b.end(), b1.begin(), b1.end());
  const std::vector<int64_t> ta = {3, 2}, tb = {3, 5};
  const GreedyDivergence g = greedy_divergence(ta, a, tb, b, kVocab, 5);
  EXPECT_TRUE(g.pass);
  EXPECT_EQ(g.step, 1);
  EXPECT_EQ(g.token_a, 2);
  EXPECT_EQ(g.token_b, 5);
  EXPECT_EQ(g.rank_a_in_b, 2);
  EXPECT_EQ(g.rank_b_in_a, 4);
  EXPECT_EQ(g.gap_a, 3.0);  // a: 10 for its own token, 7 for b's
  EXPECT_EQ(g.gap_b, 1.0);  // b: 10 vs 9
  EXPECT_EQ(g.top2_margin_a, 1.0);
  EXPECT_EQ(g.top2_margin_b, 1.0);
  EXPECT_EQ(g.worst_rank(), 4);
  // The same divergence under N = 3: b's token is a's fourth, outside.
  EXPECT_FALSE(greedy_divergence(ta, a, tb, b, kVocab, 3).pass);
  EXPECT_TRUE(greedy_divergence(ta, a, tb, b, kVocab, 4).pass);
}

TEST(GreedyDivergence, ATokenOutsideTheOthersTopNFails) {
  // a chose 9, which b ranks seventh; b's token 0 is a's second.
  const auto a = ranked_row({9, 0}), b = ranked_row({0, 1, 2, 3, 4, 5, 9});
  const std::vector<int64_t> ta = {9}, tb = {0};
  const GreedyDivergence g = greedy_divergence(ta, a, tb, b, kVocab, 5);
  EXPECT_FALSE(g.pass);
  EXPECT_EQ(g.step, 0);
  EXPECT_EQ(g.rank_a_in_b, 7);
  EXPECT_EQ(g.rank_b_in_a, 2);
  EXPECT_EQ(g.gap_b, 6.0);
  EXPECT_EQ(g.worst_rank(), 7);
  const std::string text = summary(g);
  EXPECT_NE(text.find("first divergence at step 0"), std::string::npos) << text;
  EXPECT_NE(text.find("a's token 9 is rank 7 in b"), std::string::npos) << text;
  EXPECT_NE(text.find("FAIL"), std::string::npos) << text;
}

TEST(GreedyDivergence, MalformedInputIsRefused) {
  const auto a = ranked_row({1}), two = base_logits(2);
  const std::vector<int64_t> one = {1};
  EXPECT_THROW(greedy_divergence(one, a, one, a, kVocab, 0), InputError);
  EXPECT_THROW(greedy_divergence(one, a, std::vector<int64_t>{1, 1}, two, kVocab), InputError);
  EXPECT_THROW(greedy_divergence(std::vector<int64_t>{kVocab}, a, one, a, kVocab), InputError);
  EXPECT_THROW(greedy_divergence(one, two, one, a, kVocab), InputError);
}

TEST(GreedyDivergence, TeacherForcedRowsGateUnderGreedyTopNAndOnlyThen) {
  // Row 2 of t gets a new argmax, column 0, which the reference ranks low.
  const auto r = base_logits(5);
  const auto t = perturbed(r, 2, 10.0);
  const LogitsCompare lc = compare_logits(t, r, {5, kVocab});
  ASSERT_EQ(lc.greedy.step, 2);
  ASSERT_EQ(lc.greedy.token_a, 0);
  const int64_t rank = lc.greedy.rank_a_in_b;
  ASSERT_GT(rank, 1);
  EXPECT_TRUE(judge_logits(t, r, logits_policy("")).pass);  // not gated
  const Verdict fails = judge_logits(t, r, logits_policy("greedy_top_n = " + std::to_string(rank - 1)));
  ASSERT_FALSE(fails.pass);
  EXPECT_EQ(fails.violations[0].threshold, "greedy_top_n");
  EXPECT_EQ(fails.violations[0].measured, double(rank));
  EXPECT_NE(fails.violations[0].detail.find("first divergence at step 2"), std::string::npos)
      << fails.violations[0].detail;
  EXPECT_TRUE(judge_logits(t, r, logits_policy("greedy_top_n = " + std::to_string(rank))).pass);
}

TEST(GreedyAgreement, RateAndMeanSharedPrefixOverPrompts) {
  const GreedyAgreement g = greedy_agreement({{{1, 2, 3, 4}, {1, 2, 3, 4}},
                                              {{5, 6, 7, 8}, {5, 6, 0, 8}},
                                              {{1, 2}, {1, 2, 3}},  // a prefix is not agreement
                                              {{9}, {9}}});
  EXPECT_EQ(g.prompts, 4);
  EXPECT_EQ(g.agreeing, 2);
  EXPECT_DOUBLE_EQ(g.rate, 0.5);
  EXPECT_DOUBLE_EQ(g.mean_prefix, (4 + 2 + 2 + 1) / 4.0);
  EXPECT_EQ(g.first_disagreeing, 1);
  const GreedyAgreement none = greedy_agreement({});
  EXPECT_EQ(none.rate, 1.0);
}

TEST(GenerationPolicyKeys, AreParsedFromARule) {
  const Thresholds th =
      logits_policy("max_kl_mean = 1e-6\nmax_kl_p99 = 1e-5\nmax_kl_p999 = 1e-4\ngreedy_top_n = 3").thresholds_for("x");
  EXPECT_EQ(th.max_kl_mean, 1e-6);
  EXPECT_EQ(th.max_kl_p99, 1e-5);
  EXPECT_EQ(th.max_kl_p999, 1e-4);
  EXPECT_EQ(th.greedy_top_n, 3);
  const Thresholds none = logits_policy("").thresholds_for("x");
  EXPECT_FALSE(none.max_kl_p99 || none.greedy_top_n);  // absent: not gated
}

TEST(GenerationPolicyKeys, MalformedValuesAreRefusedInOneLineNamingKeyAndLine) {
  for (const std::string bad : {"greedy_top_n = 0", "greedy_top_n = 2.5", "greedy_top_n = \"5\"", "greedy_top_n = -1",
                                "max_kl_p99 = -1e-3", "max_kl_p999 = \"small\"", "max_kl_mean = nan"}) {
    try {
      logits_policy(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      const std::string msg = e.what(), key = bad.substr(0, bad.find(' '));
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find("test.toml:4"), std::string::npos) << msg;
      EXPECT_NE(msg.find("'" + key + "'"), std::string::npos) << msg;
    }
  }
}

TEST(GenerationPolicyKeys, WithoutLogitsMetricsAreListedUnchecked) {
  const Policy p = logits_policy("max_kl_p99 = 1e-5\ngreedy_top_n = 5");
  Comparison c;
  const std::vector<double> x = {1.0, 2.0};
  c.tensor = compare_tensors(x, x, {2}, Thresholds{}, TensorDtype::F64);
  const Verdict v = judge(p, "runs/x/layers/0/out", c);
  EXPECT_TRUE(v.pass);
  ASSERT_EQ(v.unchecked.size(), 2u);
  EXPECT_EQ(v.unchecked[1], "greedy_top_n (no logits metrics)");
}
