// docs/spec.md §4, §6, §7: the CED equivalences and bounds, on the reference model.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "oracle/analytic.hpp"
#include "checks/ced_checks.hpp"
#include "property-tests/generators.hpp"
#include "checks/harness.hpp"

using namespace ced;
using namespace ced::prop;

RC_GTEST_PROP(CedProperties, ReplayFullEqualsFullForwardBitwise, ()) {
  const Model m(*gen_config());
  RC_ASSERT(check_replay_full_equals_full(m, *gen_length(m.p)).empty());
}

RC_GTEST_PROP(CedProperties, OutputsAreExactInsideTheConeAndDependOnTruncationOutside, ()) {
  const Model m(*gen_config());
  const int64_t N = *gen_length(m.p);
  const int64_t K = *rc::gen::inRange<int64_t>(1, N + 1);
  RC_ASSERT(check_cone(m, N, K).empty());
}

RC_GTEST_PROP(CedProperties, MinimalExactReplayIsMinOfNAndR, ()) {
  const Model m(*gen_config());
  RC_ASSERT(check_min_exact_replay(m, *gen_length(m.p)).empty());
}

RC_GTEST_PROP(CedProperties, DecodeIsExactIffReplayCoversTheDecodeBound, ()) {
  const Model m(*gen_config());
  RC_ASSERT(check_decode_bound(m, *gen_length(m.p), *rc::gen::inRange<int64_t>(1, 4)).empty());
}

RC_GTEST_PROP(CedProperties, BoundedEqualsExactWhenNAtMostW, ()) {
  const Model m(*gen_config());
  RC_ASSERT(check_bounded_equals_exact_short(m, *rc::gen::inRange<int64_t>(1, m.p.W + 1)).empty());
}

RC_GTEST_PROP(CedProperties, SourceOnlyWriteEqualsFullModeEntries, ()) {
  const Model m(*gen_config());
  RC_ASSERT(check_source_only_write(m, *gen_length(m.p)).empty());
}

RC_GTEST_PROP(CedProperties, ReuseLayersTakeTheirSourceSelection, ()) {
  const Model m(*gen_config());
  RC_ASSERT(check_reuse_selection(m, *gen_length(m.p)).empty());
}

RC_GTEST_PROP(CedProperties, TiedDecoderSourcesEqualReindexLayersAndUntiedDiffer, ()) {
  const Config c = *gen_config();
  RC_ASSERT(check_shared_kv(c, *gen_length(make_plan(c))).empty());
}

RC_GTEST_PROP(CedProperties, ResumeWithPrefixAtMostWEqualsCedFromScratch, ()) {
  const Model m(*gen_config());
  const int64_t N = *gen_length(m.p);
  const int64_t P = *rc::gen::inRange<int64_t>(0, std::min(N, m.p.W) + 1);
  RC_ASSERT(check_resume_short_prefix(m, N, P).empty());
}

RC_GTEST_PROP(CedProperties, FlopCounterEqualsTheOracleModel, ()) {
  const Model m(*gen_config());
  RC_ASSERT(check_flops(m, *gen_length(m.p)).empty());
}

TEST(CedProperties, ResumeThroughASavedCacheEqualsResumeInMemory) {
  const Model m(builtin_config("small"));
  EXPECT_EQ(check_resume_saved_cache(m, 41, 23), "");
}

TEST(CedProperties, MeasuredFlopRatioApproachesTheIdealRatio) {
  // docs/spec.md §7: measured ced(bounded)/full FLOPs vs 1/2 + B/(2N) on v41-shape;
  // the gap is the lm_head and the decoder kv source's compressor (counted at
  // every position), so it shrinks as N grows.
  const Model m(builtin_config("v41-shape"), false);
  double prev_gap = 1.0;
  for (int64_t N : {256, 1024}) {
    auto full = m.request(Mode::Full, N);
    auto ced = m.request(Mode::Ced, N, "bounded");
    full.logits = ced.logits = LogitsScope::Last;
    const double ratio = double(m.run(ced).flops.total()) / double(m.run(full).flops.total());
    const double ideal = ideal_ratio(m.p, N);
    const double gap = std::abs(ratio - ideal);
    std::printf("N = %ld: measured %.5f ideal %.5f\n", long(N), ratio, ideal);
    EXPECT_LT(gap, 0.05);
    EXPECT_LT(gap, prev_gap);
    prev_gap = gap;
  }
}

