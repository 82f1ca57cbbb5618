// The one-line summary of a tensor comparison (docs/spec.md §8): it names the elements whose reference is
// zero but whose value is not (they have no relative error), and it prints no location for a
// metric that has none. Written for the mutation pass (docs/mutation.md).
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
