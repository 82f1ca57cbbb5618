// The rows of `ced spans` and their verdict (docs/spec.md §4, §6): the oracle's span of each row, capped by
// the prompt N and the prefix P the search ran with, and a verdict that fails when any one row's found span
// differs, whichever row it is (the first, with the later rows agreeing, included).
#include <gtest/gtest.h>

#include "checks/ced_checks.hpp"
#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"

using namespace ced;
using namespace ced::prop;

namespace {

Spans found_as(const std::vector<SpanRow>& rows) {
  Spans s;
  s.exact_last = rows[0].oracle;
  s.exact_decode = rows[1].oracle;
  s.enc_exact_hidden = rows[2].oracle;
  s.enc_exact_next = rows[3].oracle;
  return s;
}

}  // namespace

TEST(SpanRows, OracleColumnIsTheSpansOfThePlanWhenNAndPArePastThem) {
  const Plan p = make_plan(builtin_config("v41-shape"));  // D = 20, E = 20, W = 128
  const std::vector<SpanRow> rows = span_rows(p, 10000, 5000, {});
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].oracle, 2541);  // 1 + D(W-1)
  EXPECT_EQ(rows[1].oracle, 2540);  // D(W-1)
  EXPECT_EQ(rows[2].oracle, 2541);  // 1 + E(W-1)
  EXPECT_EQ(rows[3].oracle, 2540);  // E(W-1)
  for (const auto& r : rows) EXPECT_EQ(r.found, -1) << r.what;
}

TEST(SpanRows, OracleColumnIsCappedByTheDecoderPromptAndTheEncoderPrefix) {
  const Plan p = make_plan(builtin_config("v41-shape"));
  const std::vector<SpanRow> rows = span_rows(p, 100, 7, {});
  EXPECT_EQ(rows[0].oracle, 100);
  EXPECT_EQ(rows[1].oracle, 100);
  EXPECT_EQ(rows[2].oracle, 7);
  EXPECT_EQ(rows[3].oracle, 7);
  // a one-token prompt and an empty prefix still need one position of replay for the next step
  const std::vector<SpanRow> least = span_rows(p, 1, 0, {});
  EXPECT_EQ(least[1].oracle, 1);
  EXPECT_EQ(least[2].oracle, 0);
  EXPECT_EQ(least[3].oracle, 1);
}

TEST(SpanRows, FoundColumnIsTheSearchsSpansRowByRow) {
  Spans s;
  s.exact_last = 11;
  s.exact_decode = 12;
  s.enc_exact_hidden = 13;
  s.enc_exact_next = 14;
  const std::vector<SpanRow> rows = span_rows(make_plan(builtin_config("tiny")), 40, 20, s);
  EXPECT_EQ(rows[0].found, 11);
  EXPECT_EQ(rows[1].found, 12);
  EXPECT_EQ(rows[2].found, 13);
  EXPECT_EQ(rows[3].found, 14);
}

TEST(SpanRows, VerdictFailsWhenAnyOneRowDiffersAndPassesWhenNone) {
  const Plan p = make_plan(builtin_config("tiny"));
  const std::vector<SpanRow> oracle = span_rows(p, 40, 20, {});
  EXPECT_TRUE(spans_agree(span_rows(p, 40, 20, found_as(oracle))));
  for (size_t i = 0; i < 4; ++i) {
    for (const int64_t off : {-1, 1}) {
      std::vector<SpanRow> rows = span_rows(p, 40, 20, found_as(oracle));
      rows[i].found += off;
      EXPECT_FALSE(spans_agree(rows)) << "row " << i << " off by " << off;
    }
  }
}
