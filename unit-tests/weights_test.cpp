// docs/spec.md §2. Expected values were computed independently with Python's
// arbitrary-precision integers (the spec's formulas typed in by hand).
#include <gtest/gtest.h>

#include <cmath>

#include "models/lab/weights.hpp"

using namespace ced;

TEST(Splitmix64, MatchesHandCheckedValues) {
  EXPECT_EQ(splitmix64(0), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(splitmix64(1), 0x910A2DEC89025CC1ULL);
}

TEST(Fnv1a64, MatchesHandCheckedValues) {
  EXPECT_EQ(fnv1a64(""), 0xCBF29CE484222325ULL);
  EXPECT_EQ(fnv1a64("a"), 0xAF63DC4C8601EC8CULL);
  EXPECT_EQ(fnv1a64("embed"), 0x0B0E48B4160DCA6EULL);
}

TEST(WeightElement, NamedTensorElementsMatchHandCheckedValues) {
  const double s3 = std::sqrt(3.0);
  EXPECT_EQ(weight_element(tensor_key(0, "embed"), 0, 0.0, s3), -1.4729630853413203);
  EXPECT_EQ(weight_element(tensor_key(0, "embed"), 5, 0.0, s3), -1.0201431373419338);
  EXPECT_EQ(weight_element(tensor_key(42, "layers.3.wq_a"), 17, 0.0, std::sqrt(3.0 / 32)), 0.2931408209216598);
  EXPECT_EQ(weight_element(tensor_key(7, "layers.0.attn_norm"), 2, 1.0, 0.1), 1.0920236999724982);
}

TEST(Tokens, MatchHandCheckedValues) {
  EXPECT_EQ(make_tokens(5, 97, 6), (std::vector<int32_t>{23, 80, 56, 6, 58, 49}));
}

TEST(WeightSpecs, ProjectionScaleIsSqrtThreeOverFanIn) {
  const Config c = builtin_config("tiny");
  for (const auto& t : weight_specs(c, make_plan(c)))
    if (t.shape.size() == 2 && t.name != "embed") {
      EXPECT_EQ(t.scale, std::sqrt(3.0 / double(t.shape[0]))) << t.name;
    }
}

TEST(WeightSpecs, EveryLayerKindHasExactlyItsTensors) {
  const Config c = builtin_config("tiny");
  const Plan p = make_plan(c);
  int comp = 0, gate = 0, idx = 0;
  for (const auto& t : weight_specs(c, p)) {
    if (t.kind == TensorKind::CompWkv) {
      ++comp;
      EXPECT_EQ(p[t.layer].role, Role::Full);
    }
    if (t.kind == TensorKind::CompWgate) {
      ++gate;
      EXPECT_GE(p[t.layer].ratio, 2);
    }
    if (t.kind == TensorKind::IdxWq) {
      ++idx;
      EXPECT_TRUE(p[t.layer].index_source);
    }
  }
  EXPECT_EQ(comp, int(c.kv_source_layers.size()));
  EXPECT_EQ(gate, 1);  // layer 1 (r = 2); layer 4 has r = 1
  EXPECT_EQ(idx, int(c.index_source_layers.size()));
}

TEST(WeightSpecs, TiedDecoderSourcesAreGeneratedUnderLayerENames) {
  Config c = builtin_config("tiny");
  c.kv_source_layers = {1, 4, 6};
  c.tie_decoder_kv = true;
  validate(c);
  const Plan p = make_plan(c);
  const Weights<double> w = generate_weights<double>(c, p, 3);
  EXPECT_EQ(w.layers[6].comp_wkv, w.layers[4].comp_wkv);
  EXPECT_EQ(w.layers[6].idx_wk, w.layers[4].idx_wk);
  EXPECT_NE(w.layers[6].idx_wq, w.layers[4].idx_wq);  // the indexer queries are per layer
}

TEST(Weights, FloatWeightsAreTheDoubleValuesRounded) {
  const Config c = builtin_config("tiny");
  const Plan p = make_plan(c);
  const auto wd = generate_weights<double>(c, p, 9);
  const auto wf = generate_weights<float>(c, p, 9);
  EXPECT_EQ(wf.layers[2].wq_b(3, 5), static_cast<float>(wd.layers[2].wq_b(3, 5)));
  EXPECT_EQ(wf.embed(96, 31), static_cast<float>(wd.embed(96, 31)));
}
