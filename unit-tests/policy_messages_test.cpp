// What a policy says when it refuses a file or a tensor (docs/spec.md §8.4):
// the messages a user reads to fix a policy or understand a verdict.
#include <gtest/gtest.h>

#include <string>

#include "compare/policy.hpp"
#include "model/error.hpp"

using namespace ced;

namespace {

std::string refusal(const std::string& toml) {
  try {
    parse_policy_toml(toml, "my-policy.toml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

// The file and line come first, the key in quotes: "policy: my-policy.toml:2: 'pattern' must be a string".
TEST(PolicyMessages, NonStringPatternNamesTheFileThenTheKey) {
  EXPECT_EQ(refusal("[[rule]]\npattern = 3\nreason = \"r\"\natol = 1.0\n"),
            "policy: my-policy.toml:2: 'pattern' must be a string");
}

TEST(PolicyMessages, EmptyReasonNamesTheFileThenTheKey) {
  EXPECT_EQ(refusal("[[rule]]\npattern = \"runs/*/logits\"\nreason = \"\"\natol = 1.0\n"),
            "policy: my-policy.toml:3: 'reason' must not be empty");
}

TEST(PolicyMessages, ViolationLineStatesTheBoundAndClosesItsDetail) {
  const Violation upper{"max_rel_l2", 0.0031, 0.001, "at position 4"};
  EXPECT_EQ(upper.line(), "max_rel_l2: measured 0.0031 > limit 0.001 (at position 4)");
  const Violation lower{"min_cosine", 0.5, 0.99, ""};
  EXPECT_EQ(lower.line(), "min_cosine: measured 0.5 < limit 0.99");
}

// A rule is named by its number in the file, then its pattern in quotes: "[[rule]] 2 ('runs/*/logits')"
// (a rule without a pattern by its number alone).
TEST(PolicyMessages, ARuleIsNamedByItsNumberThenItsPattern) {
  EXPECT_EQ(refusal("[[rule]]\npattern = \"a\"\nreason = \"r\"\natol = 1.0\n"
                    "[[rule]]\npattern = \"runs/*/logits\"\natol = 1.0\n"),
            "policy: my-policy.toml:5: [[rule]] 2 ('runs/*/logits') has no 'reason': every tolerance needs one");
  EXPECT_EQ(refusal("[[rule]]\nreason = \"r\"\natol = 1.0\n"), "policy: my-policy.toml:1: [[rule]] 1 has no 'pattern'");
}
