// The oracle's spans found on the real DSv4.1 layer schedule (v41-shape):
// R = 1 + D(W-1) = 2541 and D(W-1) = 2540 for the decoder, 1 + E(W-1) = 2541
// and E(W-1) = 2540 for the encoder resume. Long tier: about 40 s on 2 cores (docs/results/spans-v41-shape-timing.md).
#include <gtest/gtest.h>

#include "checks/ced_checks.hpp"

using namespace ced;
using namespace ced::prop;

TEST(V41Spans, DecoderAndEncoderSpansAreTheOraclesOnTheRealSchedule) {
  const Model m(builtin_config("v41-shape"), false);
  const Spans s = empirical_spans(m, 2700, 2600);
  EXPECT_EQ(s.exact_last, 2541);
  EXPECT_EQ(s.exact_decode, 2540);
  EXPECT_EQ(s.enc_exact_hidden, 2541);
  EXPECT_EQ(s.enc_exact_next, 2540);
  std::printf("numerically exact (bitwise, plain f32 arithmetic) from B = %lld\n", (long long)s.numeric_last);
}
