// What a run diff reports (docs/spec.md §8): the comparison type follows the runs' dtypes, a divergence in
// layer 0 is reported as layer 0, the text row carries max_abs and rel_l2 in that order, the backend
// list names every backend, and the JSON carries each selection's metrics. Written for the
// mutation pass (docs/mutation.md).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "models/lab/config.hpp"
#include "model/error.hpp"
#include "models/lab/weights.hpp"
#include "compare/run_compare.hpp"
#include "backends/registry.hpp"

using namespace ced;

namespace {

RunResult run_of(const std::string& backend, bool capture) {
  const Config c = load_config("tiny");
  auto be = make_backend(backend, c, 0);
  RunRequest r;
  r.n_prompt = 10;
  r.tokens = make_tokens(0, c.vocab_size, 10);
  r.capture_layers = capture;
  return be->run(r);
}

const RunResult& f32_run() {
  static const RunResult r = run_of("reference", true);
  return r;
}

const RunResult& f64_run() {
  static const RunResult r = run_of("reference-f64", false);
  return r;
}

}  // namespace

TEST(RunDiffReport, ComparisonTypeIsTheRunsTypeWhenBothAgreeElseF32) {
  const RunDiff same64 = diff_runs("full", f64_run(), f64_run(), exact_policy());
  ASSERT_TRUE(same64.tensors.front().comparison.tensor);
  EXPECT_EQ(same64.tensors.front().comparison.tensor->dtype, TensorDtype::F64);
  const RunDiff same32 = diff_runs("full", f32_run(), f32_run(), exact_policy());
  EXPECT_EQ(same32.tensors.front().comparison.tensor->dtype, TensorDtype::F32);
  const RunDiff mixed = diff_runs("full", f64_run(), f32_run(), exact_policy());
  EXPECT_EQ(mixed.tensors.front().comparison.tensor->dtype, TensorDtype::F32);
}

TEST(RunDiffReport, DivergenceInLayerZeroIsReportedAsLayerZero) {
  RunResult t = f32_run();
  ASSERT_FALSE(t.layers.empty());
  ASSERT_EQ(t.layers[0].layer, 0);
  t.layers[0].out(0, 0) += 1.0;  // far past any tolerance of the exact policy
  const RunDiff d = diff_runs("full", t, f32_run(), exact_policy());
  EXPECT_EQ(d.first_divergent_layer, 0);
  EXPECT_FALSE(d.pass());
  const std::string text = format_run_diff(d, false);
  EXPECT_NE(text.find("  first divergent layer (over tolerance): 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  first layer not bitwise equal: 0\n"), std::string::npos) << text;
}

TEST(RunDiffReport, TextRowCarriesMaxAbsThenRelL2) {
  RunResult t = f32_run();
  t.logits(0, 3) *= 1.5;
  const RunDiff d = diff_runs("full", t, f32_run(), exact_policy());
  const TensorDiff& logits = d.tensors.front();
  ASSERT_TRUE(logits.comparison.tensor);
  const auto& c = *logits.comparison.tensor;
  ASSERT_NE(c.max_abs_err, c.rel_l2);
  const std::string text = format_run_diff(d, false);
  EXPECT_NE(text.find(fmt::format("  FAIL {:>11.3e} {:>11.3e} {:>11} ", c.max_abs_err, c.rel_l2, c.max_ulp)),
            std::string::npos)
      << text;
}

TEST(RunDiffReport, JsonCarriesTheSelectionMetrics) {
  const RunDiff d = diff_runs("full", f32_run(), f32_run(), exact_policy());
  const std::string json = run_diffs_json({d});
  size_t selections = 0;
  for (const auto& t : d.tensors)
    if (t.comparison.selection) {
      ++selections;
      const std::string head = fmt::format("{{\"name\": {}, ", json_string(t.name));
      const size_t at = json.find(head);
      ASSERT_NE(at, std::string::npos) << t.name;
      const size_t sel = json.find("\"selection\": {", at);
      const size_t next = json.find("{\"name\": ", at + 1);
      EXPECT_TRUE(sel != std::string::npos && sel < next) << t.name << "\n" << json.substr(at, 400);
    }
  EXPECT_GT(selections, 0u) << "tiny's captures hold index selections";
}

TEST(RunDiffReport, UnknownBackendListsEveryBackend) {
  try {
    make_backend("frobnicate", load_config("tiny"), 0);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "--backend: 'frobnicate' is not one of reference, reference-f64, cuda, cuda-bf16, v41-reference");
  }
}

// Without -v a passing layer tensor is not listed, layer 0 included; with -v every one is.
TEST(RunDiffReport, PassingLayerTensorsAreListedOnlyWhenVerbose) {
  const RunDiff d = diff_runs("full", f32_run(), f32_run(), exact_policy());
  ASSERT_TRUE(d.pass());
  const std::string quiet = format_run_diff(d, false), verbose = format_run_diff(d, true);
  EXPECT_EQ(quiet.find("layers/0/"), std::string::npos) << quiet;
  EXPECT_EQ(quiet.find("layers/1/"), std::string::npos) << quiet;
  EXPECT_NE(verbose.find("layers/0/out"), std::string::npos) << verbose;
}
