// docs/sound-bounds.md §9: the router judged by derived bounds. Sound: routers written other ways (the
// gate GEMM in other orders, softplus with and without torch's threshold, the renormalisation summed
// backwards or taken as a reciprocal), fed the official's ffn_x, choose admissible experts with weights
// inside their intervals on every golden file; and the judge of a selection refuses a non-tied swap.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "compare/op_bounds.hpp"
#include "checks/v41/agreement.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/config.hpp"
#include "reference/v41/forward.hpp"
#include "models/v41/router_bounds.hpp"
#include "models/v41/run_file.hpp"
#include "unit-tests/legit_orders.hpp"
#include "unit-tests/v41_golden_each.hpp"

using namespace ced;
using namespace ced::v41;
using namespace ced::bounds;
using namespace ced::testing;
namespace fs = std::filesystem;

namespace {

const fs::path kGolden = CED_V41_GOLDEN_DIR;

// A router written another way: experts [N, K] ascending and their weights alongside.
struct Routed {
  std::vector<int64_t> experts;
  std::vector<double> weights;
};

Routed route_with(const Sum& order, bool threshold, bool reciprocal, const V41Config& c, const std::vector<double>& x,
                  int64_t N, const std::vector<double>& gw, std::span<const double> bias) {
  const int64_t E = c.n_routed_experts, K = c.n_activated_experts, D = c.dim;
  const auto logits = linear_with(order, x, N, D, gw, E);
  Routed r;
  for (int64_t t = 0; t < N; ++t) {
    std::vector<float> s(static_cast<size_t>(E)), biased(s.size());
    for (int64_t e = 0; e < E; ++e) {
      const float v = static_cast<float>(logits[static_cast<size_t>(t * E + e)]) / static_cast<float>(c.gate_temp);
      const float sp = threshold && v > 20 ? v : std::log1p(std::exp(v));
      s[static_cast<size_t>(e)] = std::sqrt(sp);
      biased[static_cast<size_t>(e)] = s[static_cast<size_t>(e)] + static_cast<float>(bias[static_cast<size_t>(e)]);
    }
    std::vector<int64_t> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
      return biased[static_cast<size_t>(a)] > biased[static_cast<size_t>(b)];
    });
    idx.resize(static_cast<size_t>(K));
    float sum = 0;
    for (size_t j = idx.size(); j-- > 0;) sum += s[static_cast<size_t>(idx[j])];  // backwards
    const float d = sum + 1e-20f, inv = 1.0f / d;
    std::vector<std::pair<int64_t, double>> row;
    for (int64_t e : idx) {
      const float w = c.norm_topk_prob && K > 1 ? (reciprocal ? s[static_cast<size_t>(e)] * inv : s[static_cast<size_t>(e)] / d)
                                                : s[static_cast<size_t>(e)];
      row.emplace_back(e, w * static_cast<float>(c.route_scale));
    }
    std::sort(row.begin(), row.end());
    for (const auto& [e, w] : row) r.experts.push_back(e), r.weights.push_back(w);
  }
  return r;
}

}  // namespace

TEST(V41RouterBounds, RoutersWrittenOtherWaysChooseAdmissiblyWithWeightsInsideOnEveryGoldenFile) {
  int64_t rows = 0, weights = 0;
  const int64_t files = ced::v41::testing::for_each_v41_golden(kGolden, [&](const fs::path& path, const V41RunFile& f, const V41Model& m) {
    const V41Config& c = m.config();
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const auto& x = f.result.layers[static_cast<size_t>(l)].ffn_x;
      const int64_t N = f.result.N, E = c.n_routed_experts, K = c.n_activated_experts;
      const std::vector<double> gw(m.gate_weight(l).begin(), m.gate_weight(l).end());
      const auto b = v41_router_bounds(c, x, N, gw, m.gate_bias(l), {});
      ASSERT_TRUE(b.has_value());
      for (const auto& [name, order, threshold, reciprocal] :
           {std::tuple{"forward, threshold", Sum(forward), true, false}, std::tuple{"reversed, no threshold", Sum(reversed), false, true},
            std::tuple{"pairwise, reciprocal", Sum(pairwise), true, true}, std::tuple{"8 lanes", Sum(lanes8), false, false}}) {
        const Routed r = route_with(order, threshold, reciprocal, c, x, N, gw, m.gate_bias(l));
        for (int64_t t = 0; t < N; ++t) {
          const std::span<const int64_t> sel(r.experts.data() + t * K, static_cast<size_t>(K));
          const auto j = judge_topk(std::span<const Interval>(b->biased).subspan(static_cast<size_t>(t * E), static_cast<size_t>(E)), sel);
          EXPECT_TRUE(j.admissible) << path.filename() << " layer " << l << " row " << t << " " << name;
          const auto iv = v41_route_weight_bounds(c, *b, t, sel, {});
          for (int64_t k = 0; k < K; ++k)
            EXPECT_TRUE(iv[static_cast<size_t>(k)].contains(r.weights[static_cast<size_t>(t * K + k)]))
                << path.filename() << " layer " << l << " row " << t << " " << name << " weight " << k;
          ++rows;
          weights += K;
        }
      }
    }
  });
  EXPECT_GE(files, 15);
  EXPECT_GT(rows, 5000);
  RecordProperty("rows", std::to_string(rows));
}

TEST(V41RouterBounds, TheGateRefusesAnExpertSwappedForANonTiedOneAndAWeightOffByAPercent) {
  V41RunFile f = read_v41_run_file(kGolden / "tiny-fp8-n17.h5");
  const V41Checkpoint ck = v41_golden_checkpoint(f);
  const V41Model m(ck.config, ck.weights, f.regime);
  const V41Config& c = m.config();
  const int64_t K = c.n_activated_experts, E = c.n_routed_experts, l = 2, t = 5;
  auto& layer = f.result.layers[static_cast<size_t>(l)];
  const auto b = v41_router_bounds(c, layer.ffn_x, f.result.N, m.gate_weight(l), m.gate_bias(l), {});
  ASSERT_TRUE(b.has_value());
  // The lowest-scoring expert left out replaces the first chosen one: far from any tie.
  const auto scores = std::span<const Interval>(b->biased).subspan(static_cast<size_t>(t * E), static_cast<size_t>(E));
  std::vector<int64_t> chosen(layer.experts.begin() + t * K, layer.experts.begin() + (t + 1) * K);
  int64_t worst = -1;
  for (int64_t e = 0; e < E; ++e)
    if (std::find(chosen.begin(), chosen.end(), e) == chosen.end() &&
        (worst < 0 || scores[static_cast<size_t>(e)].hi < scores[static_cast<size_t>(worst)].hi))
      worst = e;
  V41RunFile swapped = f;
  swapped.result.layers[static_cast<size_t>(l)].experts[static_cast<size_t>(t * K)] = static_cast<int32_t>(worst);
  const V41Agreement a = v41_agreement(m, swapped);
  const V41TensorAgreement* x = a.first_failure();
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->layer, l);
  EXPECT_EQ(x->kind, "experts (forced x)");
  EXPECT_NE(x->failure.find("no score inside its interval admits"), std::string::npos) << x->failure;
  EXPECT_NE(x->failure.find(fmt::format("row {}: official chose expert {}", t, worst)), std::string::npos) << x->failure;
  // A route weight 1 % high.
  V41RunFile heavy = f;
  heavy.result.layers[static_cast<size_t>(l)].expert_weights[static_cast<size_t>(t * K + 1)] *= 1.01;
  const V41Agreement ah = v41_agreement(m, heavy);
  const V41TensorAgreement* w = ah.first_failure();
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->kind, "expert_weights (forced x)");
  EXPECT_NE(w->failure.find("outside their admissible interval"), std::string::npos) << w->failure;
}

TEST(TopkJudge, AdmitsTiesAndNearTiesNamingThePairAndRefusesAProvenSwap) {
  const std::vector<Interval> row{{5, 6}, {1, 2}, {3, 4}, {3.5, 4.5}, {0, 0.5}};
  const std::vector<int64_t> top2{0, 3}, tied{0, 2}, wrong{0, 1}, twice{0, 0}, out_of_range{0, 9};
  EXPECT_TRUE(judge_topk(row, top2).admissible);
  EXPECT_TRUE(judge_topk(row, top2).contested);  // 2's [3, 4] reaches 3's [3.5, 4.5]
  EXPECT_EQ(judge_topk(row, top2).in, 3);
  EXPECT_EQ(judge_topk(row, top2).out, 2);
  EXPECT_TRUE(judge_topk(row, tied).admissible);  // 2 and 3 overlap: either may be second
  const TopkJudgement bad = judge_topk(row, wrong);
  EXPECT_FALSE(bad.admissible);  // 1 is at most 2, 3 at least 3.5
  EXPECT_EQ(bad.in, 1);
  EXPECT_EQ(bad.out, 3);
  EXPECT_FALSE(judge_topk(row, twice).admissible);
  EXPECT_FALSE(judge_topk(row, out_of_range).admissible);
  // Equal scores exactly (one point each): both choices admissible, and contested.
  const std::vector<Interval> exact{{1, 1}, {1, 1}, {0, 0}};
  EXPECT_TRUE(judge_topk(exact, std::vector<int64_t>{1}).admissible);
  EXPECT_TRUE(judge_topk(exact, std::vector<int64_t>{1}).contested);
  EXPECT_FALSE(judge_topk(exact, std::vector<int64_t>{2}).admissible);
  // Far apart: admissible and not contested.
  const std::vector<Interval> apart{{5, 6}, {1, 2}, {3, 3.2}};
  EXPECT_TRUE(judge_topk(apart, std::vector<int64_t>{0, 2}).admissible);
  EXPECT_FALSE(judge_topk(apart, std::vector<int64_t>{0, 2}).contested);
  const std::vector<Interval> nan{{std::nan(""), 1}, {0, 0.5}};
  EXPECT_FALSE(judge_topk(nan, std::vector<int64_t>{1}).admissible);
}

TEST(V41RouterBounds, OnlyTheSqrtSoftplusRouterWithAPositiveTemperatureIsBounded) {
  V41Config c = v41_builtin_config("v41-tiny");
  const std::vector<double> x(static_cast<size_t>(c.dim), 0.5), gw(static_cast<size_t>(c.n_routed_experts * c.dim), 0.25),
      bias(static_cast<size_t>(c.n_routed_experts), 0.0);
  EXPECT_TRUE(v41_router_bounds(c, x, 1, gw, bias, {}).has_value());
  c.score_func = "sigmoid";
  EXPECT_FALSE(v41_router_bounds(c, x, 1, gw, bias, {}).has_value());
  c.score_func = "sqrtsoftplus";
  c.gate_temp = 0;
  EXPECT_FALSE(v41_router_bounds(c, x, 1, gw, bias, {}).has_value());
}

// Point scores (an exact gate): each weight's interval spans the renormalisation's three fp32 roundings and
// the sum's bound on each side of the exact weight, and no more than ten times that.
TEST(V41RouterBounds, ARouteWeightsIntervalIsItsRoundingsWideOnEachSideOfTheExactWeight) {
  const V41Config c = v41_builtin_config("v41-tiny");
  const int64_t K = c.n_activated_experts;
  ASSERT_GT(K, 1);
  V41RouterBounds b;
  b.N = 1;
  b.E = c.n_routed_experts;
  b.K = K;
  for (int64_t e = 0; e < b.E; ++e) b.score.push_back({1.0 + 0.125 * static_cast<double>(e), 1.0 + 0.125 * static_cast<double>(e)});
  std::vector<int64_t> sel(static_cast<size_t>(K));
  for (int64_t j = 0; j < K; ++j) sel[static_cast<size_t>(j)] = j;
  double sum = 0;
  for (int64_t j = 0; j < K; ++j) sum += b.score[static_cast<size_t>(j)].lo;
  const double u = 0x1p-24, rel = sum_error_bound(K, 1.0, AccumulationModel::fp32(), true);
  const auto iv = v41_route_weight_bounds(c, b, 0, sel, {});
  for (int64_t j = 0; j < K; ++j) {
    const double exact = b.score[static_cast<size_t>(j)].lo / sum * c.route_scale;
    const Interval& w = iv[static_cast<size_t>(j)];
    EXPECT_GE(w.hi / exact, (1 + rel) * (1 + u) * (1 + u) * (1 + u) * (1 - 0x1p-40)) << j;
    EXPECT_LE(w.lo / exact, 1 / ((1 + rel) * (1 + u)) * (1 - u) * (1 - u) * (1 + 0x1p-40)) << j;
    EXPECT_LT(w.hi - w.lo, 10 * (rel + 3 * u) * 2 * exact) << j;
    EXPECT_GT(w.lo / exact, 1 - 10 * (rel + 3 * u)) << j;
  }
}
