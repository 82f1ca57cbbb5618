// The one-line summary of a tensor comparison (docs/spec.md §8): it names the elements whose reference is
// zero but whose value is not (they have no relative error), and it prints no location for a
// metric that has none. Written for the mutation pass (docs/mutation.md).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "compare/compare.hpp"

using namespace ced;

namespace {
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// The text of `field=` up to the next " | " in a summary.
std::string field(const std::string& s, const std::string& name) {
  const size_t a = s.find(" | " + name + "=");
  if (a == std::string::npos) return "";
  const size_t b = s.find(" | ", a + 3);
  return s.substr(a + 3, b == std::string::npos ? std::string::npos : b - a - 3);
}
}  // namespace

TEST(CompareSummary, NamesNonzeroValuesWhoseReferenceIsZero) {
  const auto c = compare_tensors(std::vector<double>{1, 2, 3}, std::vector<double>{0, 2, 3}, {3}, {}, TensorDtype::F64);
  ASSERT_EQ(c.zero_ref_nonzero, 1);
  EXPECT_NE(summary(c).find(" (+1 with r=0, t!=0)"), std::string::npos) << summary(c);
  const auto none = compare_tensors(std::vector<double>{1, 2}, std::vector<double>{1, 3}, {2}, {}, TensorDtype::F64);
  ASSERT_EQ(none.zero_ref_nonzero, 0);
  EXPECT_EQ(summary(none).find("with r=0"), std::string::npos) << summary(none);
}

TEST(CompareSummary, MetricWithoutALocationPrintsNone) {
  // NaN against NaN: no finite pair, so no element carries the largest error.
  const auto c = compare_tensors(std::vector<double>{kNaN}, std::vector<double>{kNaN}, {1}, {}, TensorDtype::F64);
  ASSERT_LT(c.max_abs.flat, 0);
  const std::string s = summary(c);
  EXPECT_EQ(field(s, "max_abs").find(" at "), std::string::npos) << s;
  // And with one: the index and both values.
  const auto d = compare_tensors(std::vector<double>{1, 5}, std::vector<double>{1, 2}, {2}, {}, TensorDtype::F64);
  ASSERT_EQ(d.max_abs.flat, 1);
  EXPECT_EQ(field(summary(d), "max_abs"), "max_abs=3 at [1] (t=5 r=2)") << summary(d);
}

TEST(CompareSummary, LargestUlpDistanceIsPlacedAtItsElement) {
  const auto c = compare_tensors(std::vector<double>{1, 2, 3}, std::vector<double>{1, 2, 4}, {3}, {}, TensorDtype::F64);
  ASSERT_EQ(c.max_ulp_at.flat, 2);
  EXPECT_EQ(field(summary(c), "max_ulp"), fmt::format("max_ulp={} at [2]", c.max_ulp)) << summary(c);
}

// t: row 0 as r, row 1 one entry apart and one invalid id (-5): so the counts differ from one another
// (invalid t = 1, r = 0; 2 differing entries in 1 row) and each must stand under its own name.
TEST(CompareSummary, SelectionTextNamesTheWorstRowAndItsJsonKeepsEachCountUnderItsName) {
  const std::vector<int64_t> t{1, 2, 3, 4, 5, -5}, r{1, 2, 3, 4, 5, 7};
  const auto c = compare_selections(t, r, {2, 3}, {}, nullptr);
  ASSERT_EQ(c.min_jaccard_row, 1);
  ASSERT_EQ(c.invalid_t, 1);
  ASSERT_EQ(c.invalid_r, 0);
  ASSERT_EQ(c.differing, 1);  // 7 is in r only; t's -5 is invalid, not an entry
  ASSERT_EQ(c.differing_rows, 1);
  // the summary prints doubles with 6 significant digits (compare/compare_format.cpp num)
  EXPECT_NE(summary(c).find(fmt::format("jaccard mean={} min={} at row 1 |", fmt::format("{:.6g}", c.mean_jaccard),
                                        fmt::format("{:.6g}", c.min_jaccard))),
            std::string::npos)
      << summary(c);
  EXPECT_NE(to_json(c).find("\"invalid_t\":1,\"invalid_r\":0,\"differing\":1,\"differing_rows\":1,"), std::string::npos)
      << to_json(c);
}
