// The judge, proven on planted differences (plant.hpp): for random plants x
// policies with each threshold kind alone and combined, identical inputs
// pass; a plant the policy rules out fails, and the failure names the run,
// tensor, layer and position of the plant; a plant the policy tolerates
// passes; a structural difference (a run, layer, tensor, position present on
// one side only, a request attribute, config key, seed or token that
// differs) never passes; duplicated or unsorted positions are malformed input
// (exit 2). Library level (oracle/run_compare, oracle/policy) under
// RapidCheck, and the same kinds through `ced diff` and `ced gate`.
//
// Threshold choice: each threshold is set from the plant's metric computed
// here independently (long double, no oracle/ helper): half of it rules the
// plant out, the metric itself (times 1 + 1e-9, covering the double rounding
// of the library's value against the long double one here) tolerates it.
//
// Case counts (default tier): the RapidCheck properties here run RapidCheck's
// default 100 cases each (RC_PARAMS unset for unit tests), about 2 s in all;
// the CLI tests enumerate every plant kind on both sides once (about 80
// `ced diff` runs) and plant 6 golden copies for `ced gate` on `tiny`.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include "model/error.hpp"
#include "compare/run_compare.hpp"
#include "golden/golden_set.hpp"
#include "unit-tests/plant.hpp"
#include "unit-tests/run_ced.hpp"

namespace fs = std::filesystem;
using namespace ced;
using plant::Kind;
using plant::Plant;

namespace {

using LD = long double;

// ---- independent metrics of one planted tensor (long double) -------------

struct Metrics {
  LD max_abs = 0, max_rel = 0, rel_l2 = 0, nmse = 0, one_minus_cos = 0, max_kl = 0;
  uint64_t max_ulp = 0;
  LD top1 = 1, min_top5 = 1;
};

uint64_t ulp64(double a, double b) {
  auto rank = [](double x) -> LD {
    uint64_t u;
    std::memcpy(&u, &x, 8);
    const LD mag = LD(u & ~(uint64_t(1) << 63));
    return (u >> 63) ? -mag : mag;
  };
  return uint64_t(std::fabs(rank(a) - rank(b)));
}

// argsort of a row: larger value first, equal values larger index first.
std::vector<int64_t> ranking(const MatD& m, Eigen::Index row) {
  std::vector<int64_t> idx(size_t(m.cols()));
  for (size_t j = 0; j < idx.size(); ++j) idx[j] = int64_t(j);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    const double x = m(row, a), y = m(row, b);
    return x != y ? x > y : a > b;
  });
  return idx;
}

Metrics metrics_of(const MatD& t, const MatD& r, bool logits) {
  Metrics m;
  LD st = 0, sr = 0, str = 0, sd = 0;
  for (Eigen::Index i = 0; i < t.size(); ++i) {
    const LD a = t.data()[i], b = r.data()[i];
    const LD d = std::fabs(a - b);
    m.max_abs = std::max(m.max_abs, d);
    if (b != 0) m.max_rel = std::max(m.max_rel, d / std::fabs(b));
    m.max_ulp = std::max(m.max_ulp, ulp64(t.data()[i], r.data()[i]));
    st += a * a;
    sr += b * b;
    str += a * b;
    sd += (a - b) * (a - b);
  }
  m.rel_l2 = std::sqrt(sd / sr);
  m.nmse = sd / sr;
  m.one_minus_cos = 1 - str / (std::sqrt(st) * std::sqrt(sr));
  if (!logits) return m;
  int64_t agree = 0;
  for (Eigen::Index p = 0; p < t.rows(); ++p) {
    LD mt = -INFINITY, mr = -INFINITY;
    for (Eigen::Index j = 0; j < t.cols(); ++j) mt = std::max<LD>(mt, t(p, j)), mr = std::max<LD>(mr, r(p, j));
    LD zt = 0, zr = 0;
    for (Eigen::Index j = 0; j < t.cols(); ++j) zt += std::exp(LD(t(p, j)) - mt), zr += std::exp(LD(r(p, j)) - mr);
    LD kl = 0;
    for (Eigen::Index j = 0; j < t.cols(); ++j) {
      const LD lr = LD(r(p, j)) - mr - std::log(zr), lt = LD(t(p, j)) - mt - std::log(zt);
      kl += std::exp(lr) * (lr - lt);
    }
    m.max_kl = std::max(m.max_kl, kl);
    const auto rt = ranking(t, p), rr = ranking(r, p);
    agree += rt[0] == rr[0];
    int64_t common = 0;
    for (int a = 0; a < 5; ++a)
      for (int b = 0; b < 5; ++b) common += rt[size_t(a)] == rr[size_t(b)];
    m.min_top5 = std::min(m.min_top5, LD(common) / 5);
  }
  m.top1 = LD(agree) / LD(t.rows());
  return m;
}

// ---- policies -------------------------------------------------------------

const std::vector<std::string> kThresholdKinds = {"atol",       "rtol",   "max_ulp", "max_rel_l2", "max_nmse",
                                                  "min_cosine", "max_kl", "min_top1", "min_top5"};
bool logits_only(const std::string& k) { return k == "max_kl" || k == "min_top1" || k == "min_top5"; }

// The value of threshold `kind` that rules the plant out (out = true) or
// just tolerates it, from the independent metrics; nullopt when the plant is
// too small for the metric to rule it out.
std::optional<double> threshold_for(const std::string& kind, const Metrics& m, bool out) {
  const LD up = 1 + 1e-9L;  // the library's double value against the long double here
  auto upper = [&](LD v) -> std::optional<double> {
    if (out) return v > 1e-300L ? std::optional<double>(double(v / 2)) : std::nullopt;
    return double(v * up);
  };
  if (kind == "atol") return upper(m.max_abs);
  if (kind == "rtol") return upper(m.max_rel);
  if (kind == "max_rel_l2") return upper(m.rel_l2);
  if (kind == "max_nmse") return upper(m.nmse);
  if (kind == "max_ulp") {
    // a policy number is a double: one ulp below the distance only up to 2^53
    if (out && m.max_ulp > (uint64_t(1) << 53)) return double(m.max_ulp / 2);
    if (out) return m.max_ulp >= 1 ? std::optional<double>(double(m.max_ulp - 1)) : std::nullopt;
    return double(m.max_ulp);
  }
  if (kind == "min_cosine") {
    // cosine is measured in double: a deficit below 1e-12 is not resolvable
    if (out) return m.one_minus_cos > 1e-12L ? std::optional<double>(double(1 - m.one_minus_cos / 2)) : std::nullopt;
    return double(1 - m.one_minus_cos * up - 1e-15L);
  }
  if (kind == "max_kl") {
    // KL is a sum of cancelling terms in double: resolvable above ~1e-13
    if (out) return m.max_kl > 1e-12L ? std::optional<double>(double(m.max_kl / 2)) : std::nullopt;
    return double(m.max_kl * (1 + 1e-6L) + 1e-14L);
  }
  if (kind == "min_top1") {
    if (out) return m.top1 < 1 ? std::optional<double>(double(m.top1 + (1 - m.top1) / 2)) : std::nullopt;
    return double(m.top1);
  }
  if (kind == "min_top5") {
    if (out) return m.min_top5 < 1 ? std::optional<double>(double(m.min_top5 + 0.1L)) : std::nullopt;
    return double(m.min_top5);
  }
  throw std::logic_error(kind);
}

Policy policy_with(const std::vector<std::pair<std::string, double>>& th) {
  std::string t = "[[rule]]\npattern = \"**\"\nreason = \"plant test\"\n";
  for (const auto& [k, v] : th) t += fmt::format("{} = {:.17g}\n", k, v);
  return parse_policy_toml(t, "<plant>");
}
// No thresholds: only the checks no policy can excuse (NaN, Inf, invalid selections).
Policy loosest_policy() { return policy_with({}); }

std::string tensor_name(const RunFile& f, const Plant& p) {
  const std::string& run = f.runs[size_t(p.run)].name;
  return p.layer < 0 ? fmt::format("runs/{}/logits", run) : fmt::format("runs/{}/layers/{}/out", run, p.layer);
}

const MatD& tensor_of(const RunFile& f, const Plant& p) {
  const RunResult& r = f.runs[size_t(p.run)].result;
  if (p.layer < 0) return r.logits;
  for (const auto& c : r.layers)
    if (c.layer == p.layer) return c.out;
  throw std::logic_error("no layer");
}

std::vector<RunDiff> diff_files(const RunFile& t, const RunFile& r, const Policy& policy) {
  std::vector<RunDiff> out;
  for (size_t i = 0; i < t.runs.size(); ++i)
    out.push_back(diff_runs(t.runs[i].name, t.runs[i].result, r.runs[i].result, policy));
  return out;
}

// (test side, reference side) of a plant.
std::pair<RunFile, RunFile> sides(const RunFile& base, const Plant& p) {
  RunFile planted = plant::apply(base, p);
  return p.on_reference ? std::pair{base, planted} : std::pair{planted, base};
}

rc::Gen<Plant> gen_value_plant(const RunFile& base, bool logits) {
  return rc::gen::exec([&base, logits] {
    Plant p;
    p.kind = Kind::Scaled;
    p.on_reference = *rc::gen::arbitrary<bool>();
    p.run = *rc::gen::inRange<int64_t>(0, int64_t(base.runs.size()));
    const RunResult& r = base.runs[size_t(p.run)].result;
    p.layer = logits ? -1 : *rc::gen::inRange<int64_t>(0, int64_t(r.layers.size()));
    const MatD& m = tensor_of(base, p);
    p.row = *rc::gen::inRange<int64_t>(0, m.rows());
    p.col = *rc::gen::inRange<int64_t>(1, m.cols());  // column 0 holds the zeros
    // relative changes from one ulp-ish to orders of magnitude, both signs
    p.rel = *rc::gen::elementOf(std::vector<double>{1e-15, -3e-12, 1e-9, -1e-6, 1e-3, 0.25, -0.5, 3, -7, 1e3});
    // On logits, half the plants promote the element above its row's maximum
    // (to 2 max|row| + 1), so top-1 and top-5 change often enough to be ruled out.
    if (logits && *rc::gen::arbitrary<bool>()) {
      const double v = m(p.row, p.col), top = 2 * m.row(p.row).cwiseAbs().maxCoeff() + 1;
      p.rel = top / v - 1;
    }
    return p;
  });
}

void expect_names_plant(const RunDiff& d, const RunFile& base, const Plant& p, bool element) {
  const std::string name = tensor_name(base, p);
  const TensorDiff* td = nullptr;
  for (const auto& t : d.tensors)
    if (!t.verdict.pass) {
      td = &t;
      break;
    }
  RC_ASSERT(td != nullptr);
  RC_ASSERT(td->name == name);
  const int64_t pos = plant::position_of(base, p);
  const std::string where = td->worst();
  const std::string want = element ? fmt::format("position {}, column {}", pos, p.col) : fmt::format("position {}", pos);
  RC_ASSERT(where == want);
  RC_ASSERT(format_run_diff(d, false).find(fmt::format("worst: {}, {}", name, want)) != std::string::npos);
  if (p.layer >= 0) RC_ASSERT(d.first_divergent_layer == p.layer);
}

const RunFile& base_set() {
  static const RunFile b = plant::make_base(7);
  return b;
}

}  // namespace

// ---- library level ----------------------------------------------------------

TEST(JudgePlant, IdenticalRunSetsPassUnderEveryThresholdKindAtZero) {
  const RunFile& b = base_set();
  for (const std::string& k : kThresholdKinds) {
    const double strict = k.rfind("min_", 0) == 0 ? 1.0 : 0.0;
    for (const RunDiff& d : diff_files(b, b, policy_with({{k, strict}, {"min_jaccard", 1}})))
      EXPECT_TRUE(d.pass()) << k << "\n" << format_run_diff(d, true);
  }
}

RC_GTEST_PROP(JudgePlant, EachThresholdKindAloneFailsAPlantItRulesOutAtThePlant, ()) {
  const RunFile& base = base_set();
  const std::string kind = *rc::gen::elementOf(kThresholdKinds);
  const Plant p = *gen_value_plant(base, logits_only(kind) || *rc::gen::arbitrary<bool>());
  const auto [t, r] = sides(base, p);
  const Metrics m = metrics_of(tensor_of(t, p), tensor_of(r, p), p.layer < 0);
  const auto th = threshold_for(kind, m, true);
  RC_PRE(th.has_value());  // the plant is below this metric's resolution
  RC_LOG() << p.describe() << "; " << kind << " = " << *th << "\n";
  const auto diffs = diff_files(t, r, policy_with({{kind, *th}}));
  for (size_t i = 0; i < diffs.size(); ++i) RC_ASSERT(diffs[i].pass() == (int64_t(i) != p.run));
  const bool element = !logits_only(kind);
  expect_names_plant(diffs[size_t(p.run)], base, p, element);
}

RC_GTEST_PROP(JudgePlant, EachThresholdKindAloneToleratesAPlantWithinIt, ()) {
  const RunFile& base = base_set();
  const std::string kind = *rc::gen::elementOf(kThresholdKinds);
  const Plant p = *gen_value_plant(base, logits_only(kind) || *rc::gen::arbitrary<bool>());
  const auto [t, r] = sides(base, p);
  const Metrics m = metrics_of(tensor_of(t, p), tensor_of(r, p), p.layer < 0);
  const double th = *threshold_for(kind, m, false);
  for (const RunDiff& d : diff_files(t, r, policy_with({{kind, th}}))) RC_ASSERT(d.pass());
}

RC_GTEST_PROP(JudgePlant, CombinedThresholdsFailWhenAnyOneRulesThePlantOut, ()) {
  const RunFile& base = base_set();
  const Plant p = *gen_value_plant(base, true);
  const auto [t, r] = sides(base, p);
  const Metrics m = metrics_of(tensor_of(t, p), tensor_of(r, p), true);
  std::vector<std::pair<std::string, double>> th;
  for (const auto& k : kThresholdKinds) th.emplace_back(k, *threshold_for(k, m, false));
  for (const RunDiff& d : diff_files(t, r, policy_with(th))) RC_ASSERT(d.pass());
  const size_t strict = *rc::gen::inRange<size_t>(0, th.size());
  const auto out = threshold_for(th[strict].first, m, true);
  RC_PRE(out.has_value());
  th[strict].second = *out;
  // atol and rtol are one element-wise bound, |t-r| - rtol|r| <= atol: the
  // other one at its tolerating value would excuse the strict one, so it is 0
  for (auto& [k, v] : th)
    if ((k == "atol" || k == "rtol") && k != th[strict].first &&
        (th[strict].first == "atol" || th[strict].first == "rtol"))
      v = 0;
  RC_LOG() << p.describe() << "; strict " << th[strict].first << " = " << *out << "\n";
  const auto diffs = diff_files(t, r, policy_with(th));
  RC_ASSERT(!diffs[size_t(p.run)].pass());
  expect_names_plant(diffs[size_t(p.run)], base, p, !logits_only(th[strict].first));
}

RC_GTEST_PROP(JudgePlant, NonFiniteOnEitherSideFailsEveryPolicyAtThePlant, ()) {
  const RunFile& base = base_set();
  Plant p = *gen_value_plant(base, *rc::gen::arbitrary<bool>());
  p.kind = *rc::gen::elementOf(std::vector<Kind>{Kind::NaN, Kind::PosInf, Kind::NegInf});
  const auto [t, r] = sides(base, p);
  const bool loosest = *rc::gen::arbitrary<bool>();
  const Policy policy = loosest ? loosest_policy() : policy_with({{"atol", 1e300}, {"rtol", 1e300}});
  const auto diffs = diff_files(t, r, policy);
  for (size_t i = 0; i < diffs.size(); ++i) RC_ASSERT(diffs[i].pass() == (int64_t(i) != p.run));
  expect_names_plant(diffs[size_t(p.run)], base, p, true);
}

RC_GTEST_PROP(JudgePlant, NegativeZeroEqualsZeroUnderEveryThresholdKind, ()) {
  // docs/spec.md §8 compares numbers: -0 == +0 under every threshold (0 ulp apart).
  const RunFile& base = base_set();
  Plant p = *gen_value_plant(base, *rc::gen::arbitrary<bool>());
  p.kind = Kind::NegZero;
  p.col = 0;
  const auto [t, r] = sides(base, p);
  std::vector<std::pair<std::string, double>> th;
  for (const auto& k : kThresholdKinds) th.emplace_back(k, k.rfind("min_", 0) == 0 ? 1.0 : 0.0);
  for (const RunDiff& d : diff_files(t, r, policy_with(th))) RC_ASSERT(d.pass());
}

RC_GTEST_PROP(JudgePlant, SelectionDifferencesFailJaccardPoliciesAndTheOverallVerdictAtThePosition, ()) {
  const RunFile& base = base_set();
  Plant p;
  p.kind = *rc::gen::elementOf(std::vector<Kind>{Kind::SelectionChanged, Kind::SelectionRowCleared});
  p.on_reference = *rc::gen::arbitrary<bool>();
  p.run = *rc::gen::inRange<int64_t>(0, int64_t(base.runs.size()));
  const RunResult& br = base.runs[size_t(p.run)].result;
  std::vector<int64_t> with_topk;
  for (const auto& c : br.layers)
    if (c.has_topk) with_topk.push_back(c.layer);
  p.layer = *rc::gen::elementOf(with_topk);
  p.row = *rc::gen::inRange<int64_t>(0, int64_t(br.positions.size()));
  p.col = *rc::gen::inRange<int64_t>(0, 3);
  const auto [t, r] = sides(base, p);
  // exact selections, and Jaccard 0.7: both rule out one element changed or
  // added in a row of at most 3 (Jaccard <= 2/3) and a cleared row (0)
  const double jac = *rc::gen::elementOf(std::vector<double>{1.0, 0.7});
  const auto diffs = diff_files(t, r, policy_with({{"min_jaccard", jac}}));
  for (size_t i = 0; i < diffs.size(); ++i) RC_ASSERT(diffs[i].pass() == (int64_t(i) != p.run));
  const RunDiff& d = diffs[size_t(p.run)];
  RC_ASSERT(d.first_divergent_layer == p.layer);
  const TensorDiff* td = nullptr;
  for (const auto& x : d.tensors)
    if (!x.verdict.pass) td = &x;
  RC_ASSERT(td && td->name == fmt::format("runs/{}/layers/{}/topk", base.runs[size_t(p.run)].name, p.layer));
  RC_ASSERT(td->worst() == fmt::format("position {}", plant::position_of(base, p)));
  // a policy without a selection threshold tolerates it
  for (const RunDiff& x : diff_files(t, r, loosest_policy())) RC_ASSERT(x.pass());
}

RC_GTEST_PROP(JudgePlant, StructuralDifferencesNeverPassSilently, ()) {
  const RunFile& base = base_set();
  Plant p;
  p.kind = *rc::gen::elementOf(std::vector<Kind>{Kind::LayerRemoved, Kind::LayerAdded, Kind::TopkRemoved,
                                                 Kind::PositionRemoved, Kind::PositionAdded, Kind::AttributeChanged});
  p.on_reference = *rc::gen::arbitrary<bool>();
  p.run = *rc::gen::inRange<int64_t>(0, int64_t(base.runs.size()));
  const RunResult& br = base.runs[size_t(p.run)].result;
  std::vector<int64_t> with_topk;
  for (const auto& c : br.layers)
    if (c.has_topk) with_topk.push_back(c.layer);
  switch (p.kind) {
    case Kind::LayerAdded: p.layer = base.config.n_layers - 1; break;
    case Kind::TopkRemoved: p.layer = *rc::gen::elementOf(with_topk); break;
    case Kind::PositionRemoved:
    case Kind::PositionAdded:
      p.layer = *rc::gen::inRange<int64_t>(-1, int64_t(br.layers.size()));
      p.row = *rc::gen::inRange<int64_t>(0, int64_t(br.positions.size()));
      break;
    case Kind::AttributeChanged: {
      std::vector<std::string> judged;
      for (const auto& a : plant::attributes())
        if (plant::attribute_judged(a) && !(br.mode == Mode::Full && (a == "mode" || a == "replay")) &&
            !(br.mode != Mode::Resume && a == "prefix_len"))
          judged.push_back(a);
      p.attr = *rc::gen::elementOf(judged);
      break;
    }
    default: p.layer = *rc::gen::inRange<int64_t>(0, int64_t(br.layers.size()));
  }
  const auto [t, r] = sides(base, p);
  const auto diffs = diff_files(t, r, loosest_policy());
  for (size_t i = 0; i < diffs.size(); ++i) RC_ASSERT(diffs[i].pass() == (int64_t(i) != p.run));
  const RunDiff& d = diffs[size_t(p.run)];
  RC_ASSERT(!d.problems.empty());
  if (p.layer >= 0 && p.kind != Kind::AttributeChanged) {
    RC_ASSERT(d.problems[0].find(fmt::format("layers/{}", p.layer)) != std::string::npos);
    RC_ASSERT(d.first_divergent_layer == p.layer);
  }
  if (p.kind == Kind::AttributeChanged) RC_ASSERT(d.problems[0].find(p.attr) != std::string::npos);
}

TEST(JudgePlant, BackendAndDtypeAttributesAreReportedNotJudged) {
  const RunFile& base = base_set();
  for (const char* a : {"backend", "dtype"}) {
    Plant p;
    p.kind = Kind::AttributeChanged;
    p.attr = a;
    const auto [t, r] = sides(base, p);
    for (const RunDiff& d : diff_files(t, r, exact_policy())) EXPECT_TRUE(d.pass()) << a;
  }
}

TEST(JudgePlant, DuplicatedOrUnsortedPositionsAreMalformedInMemory) {
  const RunFile& base = base_set();
  for (Kind k : {Kind::PositionsDuplicated, Kind::PositionsPermuted})
    for (int64_t layer : {-1, 2})
      for (bool ref : {false, true}) {
        Plant p;
        p.kind = k;
        p.layer = layer;
        p.row = 3;
        p.on_reference = ref;
        const auto [t, r] = sides(base, p);
        EXPECT_THROW(diff_runs("x", t.runs[0].result, r.runs[0].result, loosest_policy()), InputError)
            << p.describe();
      }
}

TEST(JudgePlant, RowCountsThatDisagreeWithPositionsAreMalformedInMemory) {
  const RunFile& base = base_set();
  for (int which = 0; which < 3; ++which) {
    RunFile t = base;
    RunResult& r = t.runs[0].result;
    if (which == 0) r.logits.conservativeResize(r.logits.rows() - 1, r.logits.cols());
    if (which == 1) r.layers[2].out.conservativeResize(r.layers[2].out.rows() - 1, r.layers[2].out.cols());
    if (which == 2) r.layers[2].topk.conservativeResize(r.layers[2].topk.rows() - 1, r.layers[2].topk.cols());
    EXPECT_THROW(diff_runs("x", r, base.runs[0].result, loosest_policy()), InputError) << which;
    EXPECT_THROW(diff_runs("x", base.runs[0].result, r, loosest_policy()), InputError) << which;
  }
}

TEST(JudgePlant, WorstElementIsTheFirstInIndexOrderAmongTies) {
  // Rule: every "worst" / "first" location is the lowest flat index attaining
  // it, so equal errors at (row 2, col 5) and (row 4, col 1) name row 2.
  const RunFile& base = base_set();
  RunFile t = base, r = base;
  MatD& L = t.runs[0].result.logits;
  MatD& R = r.runs[0].result.logits;
  R(4, 1) = 1.0, L(4, 1) = 1.5;  // equal errors, exactly 0.5 in double
  R(2, 5) = 2.0, L(2, 5) = 2.5;
  for (const char* k : {"atol", "max_rel_l2"}) {
    const RunDiff d = diff_runs(t.runs[0].name, t.runs[0].result, r.runs[0].result, policy_with({{k, 1e-3}}));
    ASSERT_FALSE(d.pass());
    EXPECT_EQ(d.tensors[0].worst(), fmt::format("position {}, column 5", base.runs[0].result.positions[2])) << k;
  }
}

TEST(JudgePlant, SmallestPassingAtolPassesAndTheNextSmallerFails) {
  const RunFile& base = base_set();
  for (double rtol : {0.0, 1e-3}) {
    RunFile t = base;
    t.runs[1].result.layers[3].out(2, 7) *= 1 + 1e-2;
    t.runs[1].result.layers[3].out(5, 3) *= 1 - 3e-3;
    const auto& a = t.runs[1].result.layers[3].out;
    const auto& b = base.runs[1].result.layers[3].out;
    const std::vector<double> va(a.data(), a.data() + a.size()), vb(b.data(), b.data() + b.size());
    Thresholds th;
    th.rtol = rtol;
    const double mpa = compare_tensors(va, vb, {a.rows(), a.cols()}, th, TensorDtype::F64).min_passing_atol;
    // independent: max over elements of |t-r| - rtol|r|, in long double
    LD want = 0;
    for (size_t i = 0; i < va.size(); ++i)
      want = std::max(want, std::fabs(LD(va[i]) - LD(vb[i])) - LD(rtol) * std::fabs(LD(vb[i])));
    EXPECT_NEAR(double(want), mpa, 1e-15 * double(want));
    const RunDiff pass = diff_runs("r", t.runs[1].result, base.runs[1].result,
                                   policy_with({{"atol", mpa}, {"rtol", rtol}}));
    EXPECT_TRUE(pass.pass());
    const RunDiff fail = diff_runs("r", t.runs[1].result, base.runs[1].result,
                                   policy_with({{"atol", std::nextafter(mpa, 0.0)}, {"rtol", rtol}}));
    EXPECT_FALSE(fail.pass());
  }
}

// ---- near-ties between stored selections (docs/spec.md §8.3) ----------------

namespace {

// A selection plant at a random scored row of the base that fits `kind`:
// SelectionNearTie needs a full row (one that left an entry out);
// SelectionChanged at col 0 needs two entries or more, so the entry it
// removes scores a whole step (>= 1, plant.hpp) above the row's k-th.
Plant gen_selection_plant(const RunFile& base, Kind kind) {
  std::vector<Plant> fit;
  for (int64_t run = 0; run < int64_t(base.runs.size()); ++run)
    for (const auto& c : base.runs[size_t(run)].result.layers)
      for (Eigen::Index row = 0; c.has_scores && row < c.topk.rows(); ++row) {
        const bool ok = kind == Kind::SelectionNearTie ? !std::isnan(c.left_out_score[size_t(row)]) : c.topk(row, 1) >= 0;
        if (!ok) continue;
        Plant p;
        p.kind = kind;
        p.run = run;
        p.layer = c.layer;
        p.row = row;
        p.col = 0;
        fit.push_back(p);
      }
  RC_PRE(!fit.empty());
  Plant p = *rc::gen::elementOf(fit);
  p.on_reference = *rc::gen::arbitrary<bool>();
  return p;
}

const TensorDiff& selection_of(const RunDiff& d, const RunFile& base, const Plant& p) {
  const std::string name = fmt::format("runs/{}/layers/{}/topk", base.runs[size_t(p.run)].name, p.layer);
  for (const auto& t : d.tensors)
    if (t.name == name) return t;
  throw std::logic_error("no selection tensor " + name);
}

bool violates(const Verdict& v, const std::string& threshold) {
  for (const auto& x : v.violations)
    if (x.threshold == threshold) return true;
  return false;
}

// The largest margin make_base draws (plant.hpp): a near_tie tolerance that
// calls every boundary swap of the base a near-tie and no real swap one (the
// real swaps' gaps are at least a step, >= 1).
constexpr double kBaseMaxMargin = 0.5;

}  // namespace

RC_GTEST_PROP(JudgePlant, ASwapAtTheBoundaryIsANearTieJudgedByJaccardAndRealBelowItsGap, ()) {
  const RunFile& base = base_set();
  const Plant p = gen_selection_plant(base, Kind::SelectionNearTie);
  const double gap = plant::boundary_margin(base, p);  // kth - left_out of the unplanted row
  const auto [t, r] = sides(base, p);
  // a tolerance at the gap: both differing entries are near-ties, and a
  // policy with no selection rule but near_tie passes
  const auto near = diff_files(t, r, policy_with({{"near_tie", gap}}));
  for (const RunDiff& d : near) RC_ASSERT(d.pass());
  const auto& c = *selection_of(near[size_t(p.run)], base, p).comparison.selection;
  RC_ASSERT(c.scored && c.differing == 2 && c.near_ties == 2 && c.real_disagreements == 0);
  RC_ASSERT(format_run_diff(near[size_t(p.run)], false)
                .find(fmt::format("runs/{}/layers/{}/topk: 2 differing entries: 2 near-ties, 0 real disagreements",
                                  base.runs[size_t(p.run)].name, p.layer)) != std::string::npos);
  // judged by its own rule: exact selections still fail it, as a near-tie
  const RunDiff jac = diff_files(t, r, policy_with({{"near_tie", gap}, {"min_jaccard", 1}}))[size_t(p.run)];
  RC_ASSERT(!jac.pass());
  const TensorDiff& js = selection_of(jac, base, p);
  RC_ASSERT(violates(js.verdict, "min_jaccard") && !violates(js.verdict, "near_tie"));
  RC_ASSERT(js.comparison.selection->near_ties == 2);
  // one step below the gap: the swapped-in entry is a real disagreement
  const RunDiff real = diff_files(t, r, policy_with({{"near_tie", std::nextafter(gap, 0.0)}}))[size_t(p.run)];
  RC_ASSERT(!real.pass());
  const TensorDiff& rs = selection_of(real, base, p);
  RC_ASSERT(violates(rs.verdict, "near_tie"));
  RC_ASSERT(rs.comparison.selection->real_disagreements == 1 && rs.comparison.selection->near_ties == 1);
  RC_ASSERT(rs.worst() == fmt::format("position {}", plant::position_of(base, p)));
  RC_ASSERT(real.first_divergent_layer == p.layer);
}

RC_GTEST_PROP(JudgePlant, ARealSwapFailsANearTiePolicyNamingRunLayerAndPosition, ()) {
  const RunFile& base = base_set();
  Plant p = gen_selection_plant(base, Kind::SelectionChanged);
  const auto [t, r] = sides(base, p);
  const auto diffs = diff_files(t, r, policy_with({{"near_tie", kBaseMaxMargin}}));
  for (size_t i = 0; i < diffs.size(); ++i) RC_ASSERT(diffs[i].pass() == (int64_t(i) != p.run));
  const RunDiff& d = diffs[size_t(p.run)];
  const TensorDiff& s = selection_of(d, base, p);
  RC_ASSERT(violates(s.verdict, "near_tie"));
  RC_ASSERT(s.comparison.selection->real_disagreements >= 1);
  RC_ASSERT(s.comparison.selection->worst_gap >= 1.0);  // the removed entry's step above the k-th
  const std::string where = fmt::format("position {}", plant::position_of(base, p));
  RC_ASSERT(s.worst() == where);
  RC_ASSERT(format_run_diff(d, false).find(fmt::format("worst: runs/{}/layers/{}/topk, {}",
                                                       base.runs[size_t(p.run)].name, p.layer, where)) !=
            std::string::npos);
  RC_ASSERT(d.first_divergent_layer == p.layer);
}

// docs/spec.md §8.3: an entry the other side left out while leaving nothing
// out was never its candidate (a visibility or pool difference, not a tie):
// real whatever its gap. Here the test drops the k-th entry of a full row and
// says it left nothing out; the dropped entry's gap is 0.
TEST(JudgePlant, AnEntryTheOtherSideNeverHadIsARealDisagreementWhateverItsGap) {
  const RunFile& base = base_set();
  RunFile t = base;
  LayerCapture* cap = nullptr;
  Eigen::Index row = -1;
  for (auto& c : t.runs[0].result.layers)
    for (Eigen::Index i = 0; c.has_scores && !cap && i < c.topk.rows(); ++i)
      if (!std::isnan(c.left_out_score[size_t(i)])) cap = &c, row = i;
  ASSERT_NE(cap, nullptr);
  const Eigen::Index k = cap->topk.cols();
  cap->topk(row, k - 1) = -1;
  cap->topk_scores(row, k - 1) = std::numeric_limits<double>::quiet_NaN();
  cap->kth_score[size_t(row)] = cap->topk_scores(row, k - 2);
  cap->left_out_score[size_t(row)] = std::numeric_limits<double>::quiet_NaN();
  const RunDiff d = diff_runs(base.runs[0].name, t.runs[0].result, base.runs[0].result,
                              policy_with({{"near_tie", kBaseMaxMargin}}));
  EXPECT_FALSE(d.pass()) << format_run_diff(d, false);
  for (const auto& x : d.tensors)
    if (x.layer == cap->layer && x.comparison.selection) {
      EXPECT_EQ(x.comparison.selection->real_disagreements, 1);
      EXPECT_EQ(x.worst(), fmt::format("position {}", cap->positions[size_t(row)]));
    }
}

TEST(JudgePlant, WithoutScoresOnEitherSideSelectionsAreJudgedAsBeforeAndTheReportSaysSo) {
  const RunFile& base = base_set();
  Plant p;
  p.kind = Kind::SelectionNearTie;
  for (const auto& c : base.runs[0].result.layers)
    for (Eigen::Index row = 0; c.has_scores && p.layer < 0 && row < c.topk.rows(); ++row)
      if (!std::isnan(c.left_out_score[size_t(row)])) p.layer = c.layer, p.row = row;
  ASSERT_GE(p.layer, 0);
  for (int unscored = 0; unscored < 3; ++unscored) {  // the test, the reference, both
    auto [t, r] = sides(base, p);
    for (RunFile* f : {&t, &r}) {
      if ((f == &t && unscored == 1) || (f == &r && unscored == 0)) continue;
      for (auto& c : f->runs[0].result.layers) c.has_scores = false;
    }
    const char* who = unscored == 0 ? "the run under test has" : unscored == 1 ? "the reference has" : "the run under test and the reference has";
    // near_tie is unchecked, min_jaccard judges as it always did
    for (double jac : {0.5, 1.0}) {
      const RunDiff d = diff_runs(base.runs[0].name, t.runs[0].result, r.runs[0].result,
                                  policy_with({{"near_tie", kBaseMaxMargin}, {"min_jaccard", jac}}));
      EXPECT_EQ(d.pass(), jac < 1) << unscored;  // a swap in a full row of 3: Jaccard 2/4
      const TensorDiff& s = selection_of(d, base, p);
      EXPECT_FALSE(s.comparison.selection->scored);
      EXPECT_FALSE(violates(s.verdict, "near_tie"));
      EXPECT_NE(format_run_diff(d, false).find(fmt::format("near-tie test not possible: {} no index scores", who)),
                std::string::npos)
          << format_run_diff(d, false);
      EXPECT_NE(run_diffs_json({d}).find("\"near_tie_untested\""), std::string::npos);
    }
  }
}

// ---- through the command line ---------------------------------------------

namespace {

using test::Result;

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("ced-judge-plant-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}


Result run_ced(const std::string& args) { return test::run_ced_in(scratch(), args); }

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

// Every plant kind with a location, on both sides.
std::vector<Plant> every_plant(const RunFile& b) {
  std::vector<Plant> out;
  for (bool ref : {false, true}) {
    auto add = [&](Kind k, int64_t run, int64_t layer, int64_t row, int64_t col, double rel = 0, std::string attr = "") {
      Plant p;
      p.kind = k;
      p.on_reference = ref;
      p.run = run;
      p.layer = layer;
      p.row = row;
      p.col = col;
      p.rel = rel;
      p.attr = std::move(attr);
      out.push_back(p);
    };
    add(Kind::Scaled, 1, -1, 3, 7, 1e-9);
    add(Kind::Scaled, 2, 5, 2, 9, -1e-6);
    add(Kind::NaN, 0, 2, 4, 3);
    add(Kind::PosInf, 1, -1, 0, 11);
    add(Kind::NegInf, 2, 6, 5, 1);
    add(Kind::RunRemoved, 1, -1, 0, 0);
    add(Kind::RunAdded, 0, -1, 0, 0);
    add(Kind::LayerRemoved, 2, 4, 0, 0);
    add(Kind::LayerAdded, 0, b.config.n_layers - 1, 0, 0);
    add(Kind::TopkRemoved, 1, 1, 0, 0);
    add(Kind::PositionRemoved, 0, -1, 6, 0);
    add(Kind::PositionRemoved, 1, 3, 2, 0);
    add(Kind::PositionAdded, 2, 5, 0, 0);
    add(Kind::SelectionChanged, 0, 2, 3, 1);
    add(Kind::SelectionRowCleared, 2, 6, 1, 0);
    add(Kind::PositionsDuplicated, 0, -1, 4, 0);
    add(Kind::PositionsPermuted, 1, 3, 2, 0);
    for (const auto& a : plant::attributes())
      if (plant::attribute_judged(a)) add(Kind::AttributeChanged, 2, -1, 0, 0, 0, a);  // run 2 is resume
    for (const auto& k : plant::config_keys(b.config)) add(Kind::ConfigKeyChanged, 0, -1, 0, 0, 0, k);
    add(Kind::WeightSeedChanged, 0, -1, 0, 0);
    add(Kind::TokenChanged, 0, -1, 5, 0);
    add(Kind::TokenChanged, 0, -1, 10, 0);  // the last token run 0 (full, 9 + 2 decode steps) consumes
  }
  return out;
}

}  // namespace

namespace {

// `ced diff` of the clean base against it with one plant: exit 1 naming the plant's place (a malformed file:
// exit 2, one line naming the file), the other runs passing.
void expect_ced_diff_names_plant(const RunFile& base, const fs::path& clean, const fs::path& policy, const Plant& p) {
  {
    SCOPED_TRACE(p.describe());
    const fs::path planted = scratch() / "planted.h5";
    plant::write_planted(base, p, planted);
    const fs::path a = p.on_reference ? clean : planted, b = p.on_reference ? planted : clean;
    const bool exact = p.kind == Kind::Scaled;  // a 1e-9 change passes a policy without atol/rtol
    const Result r = run_ced("diff " + a.string() + " " + b.string() + (exact ? "" : " --policy " + policy.string()));
    if (plant::is_malformed_kind(p.kind)) {
      // docs/spec.md §9: positions ascending; the loader refuses the file with one line
      EXPECT_EQ(r.code, 2) << r.out << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      EXPECT_NE(r.err.find("ascending"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(planted.filename().string()), std::string::npos) << r.err;
      return;
    }
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_NE(r.out.find("FAIL"), std::string::npos);
    const std::string run = base.runs[size_t(p.run)].name;
    if (plant::is_value_kind(p.kind)) {
      const std::string name = p.layer < 0 ? fmt::format("runs/{}/logits", run)
                                           : fmt::format("runs/{}/layers/{}/out", run, p.layer);
      EXPECT_NE(r.out.find(fmt::format("worst: {}, position {}, column {}", name, plant::position_of(base, p), p.col)),
                std::string::npos)
          << r.out;
      // the other runs pass
      for (size_t i = 0; i < base.runs.size(); ++i)
        if (int64_t(i) != p.run) {
          EXPECT_NE(r.out.find("run " + base.runs[i].name + ": PASS"), std::string::npos) << r.out;
        }
    } else if (p.kind == Kind::SelectionChanged || p.kind == Kind::SelectionRowCleared) {
      EXPECT_NE(r.out.find(fmt::format("worst: runs/{}/layers/{}/topk, position {}", run, p.layer,
                                       plant::position_of(base, p))),
                std::string::npos)
          << r.out;
    } else if (p.kind == Kind::ConfigKeyChanged || p.kind == Kind::AttributeChanged) {
      EXPECT_NE(r.out.find(p.attr), std::string::npos) << r.out;
    } else if (p.kind == Kind::TokenChanged) {
      EXPECT_NE(r.out.find(fmt::format("problem: run '{}': token {} is ", run, p.row)), std::string::npos) << r.out;
    } else if (p.kind == Kind::RunRemoved || p.kind == Kind::RunAdded) {
      EXPECT_NE(r.out.find(" only"), std::string::npos) << r.out;
    } else if (p.layer >= 0) {
      EXPECT_NE(r.out.find(fmt::format("runs/{}/layers/{}", run, p.layer)), std::string::npos) << r.out;
    }
  }
}

struct CliPlantBase {
  RunFile base = plant::make_base(11);
  fs::path clean = scratch() / "clean.h5", policy = scratch() / "jaccard.toml";
  CliPlantBase() {
    write_run_file(clean, base);
    // the loosest policy that still judges selections: NaN, Inf and structure are never excused
    write_text(policy, "[[rule]]\npattern = \"**\"\nreason = \"plant test\"\nmin_jaccard = 1\n");
  }
};

}  // namespace

// Default tier: one plant of each kind, the sides alternating (each `ced diff` is a process
// reading both files in forked children, about 0.3 s; every kind on both sides is the long test below).
TEST(JudgePlantCli, EachPlantKindFailsCedDiffNamingItsPlace) {
  const CliPlantBase b;
  const Result same = run_ced("diff " + b.clean.string() + " " + b.clean.string() + " --policy " + b.policy.string());
  ASSERT_EQ(same.code, 0) << same.out << same.err;
  // each kind once: the i-th kind (in the list's order) planted on the reference side when i is odd
  const auto plants = every_plant(b.base);
  std::vector<Kind> kinds;
  for (const Plant& p : plants)
    if (std::find(kinds.begin(), kinds.end(), p.kind) == kinds.end()) kinds.push_back(p.kind);
  size_t tried = 0;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const auto it = std::find_if(plants.begin(), plants.end(), [&](const Plant& p) {
      return p.kind == kinds[i] && p.on_reference == (i % 2 == 1);
    });
    ASSERT_NE(it, plants.end());
    ++tried;
    expect_ced_diff_names_plant(b.base, b.clean, b.policy, *it);
  }
  EXPECT_GE(tried, 15u);
}

// Long tier (unit-tests/CMakeLists.txt): every plant of every_plant, both sides, every judged attribute and
// config key.
TEST(JudgePlantCliLong, EveryPlantKindFailsCedDiffOnEitherSideNamingItsPlace) {
  const CliPlantBase b;
  const auto plants = every_plant(b.base);
  EXPECT_GE(plants.size(), 60u);
  for (const Plant& p : plants) expect_ced_diff_names_plant(b.base, b.clean, b.policy, p);
}

TEST(JudgePlantCli, GateFailsAPlantedGoldenCopyNamingRunTensorLayerAndPosition) {
  const fs::path dir = scratch() / "golden";
  const RunFile golden = read_run_file(golden::default_golden_dir() / "tiny.h5");
  struct Case {
    std::string run, dataset;  // value plants: dataset to change
    int64_t layer = -1, row = 0, col = 0;
    double value = 0;
    bool rel = true;
    std::string expect;  // in the output
  };
  auto pos = [&](const std::string& run, int64_t layer, int64_t row) {
    const RunResult& r = golden.find_run(run)->result;
    if (layer < 0) return r.positions.at(size_t(row));
    for (const auto& c : r.layers)
      if (c.layer == layer) return c.positions.at(size_t(row));
    return int64_t(-1);
  };
  std::vector<Case> cases;
  // a 1e-9 relative change in a layer's out of one run among five
  cases.push_back({"ced-exact", "/runs/ced-exact/layers/5/out", 5, 3, 7, 1e-9, true,
                   fmt::format("runs/ced-exact/layers/5/out worst at position {}, column 7", pos("ced-exact", 5, 3))});
  // NaN on the reference side (the golden file is the reference)
  cases.push_back({"resume", "/runs/resume/logits", -1, 1, 4, std::nan(""), false,
                   fmt::format("runs/resume/logits worst at position {}, column 4", pos("resume", -1, 1))});
  // -Inf on the reference side
  cases.push_back({"full", "/runs/full/layers/0/out", 0, 2, 1, -INFINITY, false,
                   fmt::format("runs/full/layers/0/out worst at position {}, column 1", pos("full", 0, 2))});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dataset);
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* name : {"tiny.h5", "policy.toml"})
      fs::copy_file(golden::default_golden_dir() / name, dir / name);
    const MatD* m = nullptr;
    const RunResult& r = golden.find_run(c.run)->result;
    if (c.layer < 0) m = &r.logits;
    for (const auto& cap : r.layers)
      if (cap.layer == c.layer) m = &cap.out;
    const double v = c.rel ? (*m)(c.row, c.col) * (1 + c.value) : c.value;
    plant::rewrite_real_element(dir / "tiny.h5", c.dataset, c.row, c.col, v);
    const Result g = run_ced("gate --golden " + dir.string());
    EXPECT_EQ(g.code, 1) << g.out << g.err;
    EXPECT_NE(g.out.find("5 runs, 4 passed, 1 failed"), std::string::npos) << g.out;
    EXPECT_NE(g.out.find("tiny.h5:" + c.run + ": " + c.expect), std::string::npos) << g.out;
  }
  // a selection element changed in the golden: the selection verdict fails the run
  {
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy_file(golden::default_golden_dir() / "policy.toml", dir / "policy.toml");
    RunFile f = golden;
    auto& cap = f.runs[1].result.layers[2];
    ASSERT_TRUE(cap.has_topk);
    const int64_t row = cap.topk.rows() - 1;
    cap.topk(row, 0) = 100000;  // an entry id no row holds: one element changed, no duplicate
    write_run_file(dir / "tiny.h5", f);
    const Result g = run_ced("gate --golden " + dir.string());
    EXPECT_EQ(g.code, 1) << g.out << g.err;
    EXPECT_NE(g.out.find("5 runs, 4 passed, 1 failed"), std::string::npos) << g.out;
    EXPECT_NE(g.out.find(fmt::format("tiny.h5:{}: runs/{}/layers/2/topk worst at position {}", f.runs[1].name,
                                     f.runs[1].name, cap.positions[size_t(row)])),
              std::string::npos)
        << g.out;
  }
  // a layer's positions unsorted in the golden: malformed, exit 2, one line
  {
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* name : {"tiny.h5", "policy.toml"})
      fs::copy_file(golden::default_golden_dir() / name, dir / name);
    std::vector<int64_t> p = golden.runs[0].result.layers[1].positions;
    std::swap(p[1], p[2]);
    plant::rewrite_int_dataset(dir / "tiny.h5", fmt::format("/runs/{}/layers/1/positions", golden.runs[0].name), p);
    const Result g = run_ced("gate --golden " + dir.string());
    EXPECT_EQ(g.code, 2) << g.out << g.err;
    EXPECT_EQ(std::count(g.err.begin(), g.err.end(), '\n'), 1) << g.err;
    EXPECT_NE(g.err.find("ascending"), std::string::npos) << g.err;
  }
  fs::remove_all(dir);
}

// The acceptance of docs/spec.md §8.3 between files: `ced diff` on a planted
// near-tie (classified, passing a near_tie policy, failing exact selections
// as a near-tie, failing below its gap) and on a planted real swap (fails,
// naming run, layer and position); a version-1 reference says the test was
// not possible and judges as before.
TEST(JudgePlantCli, CedDiffClassifiesAPlantedNearTieAndFailsARealSwap) {
  const RunFile base = plant::make_base(11);
  const fs::path clean = scratch() / "nt-clean.h5", near = scratch() / "nt-near.h5", real = scratch() / "nt-real.h5";
  write_run_file(clean, base);
  Plant nt, rs;
  nt.kind = Kind::SelectionNearTie;
  rs.kind = Kind::SelectionChanged;
  for (const auto& c : base.runs[1].result.layers)
    for (Eigen::Index row = 0; c.has_scores && row < c.topk.rows(); ++row) {
      if (nt.layer < 0 && !std::isnan(c.left_out_score[size_t(row)])) nt.run = 1, nt.layer = c.layer, nt.row = row;
      if (rs.layer < 0 && c.topk(row, 1) >= 0) rs.run = 1, rs.layer = c.layer, rs.row = row;
    }
  ASSERT_GE(nt.layer, 0);
  ASSERT_GE(rs.layer, 0);
  plant::write_planted(base, nt, near);
  plant::write_planted(base, rs, real);
  const double gap = plant::boundary_margin(base, nt);
  auto policy = [&](const std::string& name, double tol, bool exact) {
    const fs::path f = scratch() / name;
    write_text(f, fmt::format("[[rule]]\npattern = \"**\"\nreason = \"plant test\"\nnear_tie = {:.17g}\n{}", tol,
                              exact ? "min_jaccard = 1\n" : ""));
    return f.string();
  };
  const std::string run = base.runs[1].name;
  const std::string tol = policy("nt-tol.toml", kBaseMaxMargin, false);
  {
    const Result r = run_ced("diff " + near.string() + " " + clean.string() + " --policy " + tol);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(fmt::format("runs/{}/layers/{}/topk: 2 differing entries: 2 near-ties, 0 real disagreements",
                                     run, nt.layer)),
              std::string::npos)
        << r.out;
  }
  {
    const Result r = run_ced("diff " + near.string() + " " + clean.string() + " --policy " +
                             policy("nt-exact.toml", kBaseMaxMargin, true));
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_NE(r.out.find("2 near-ties, 0 real disagreements"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("min_jaccard"), std::string::npos) << r.out;
  }
  {
    const Result r = run_ced("diff " + near.string() + " " + clean.string() + " --policy " +
                             policy("nt-below.toml", gap / 2, false));
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_NE(r.out.find(fmt::format("worst: runs/{}/layers/{}/topk, position {}", run, nt.layer,
                                     plant::position_of(base, nt))),
              std::string::npos)
        << r.out;
  }
  for (bool ref : {false, true}) {
    const fs::path a = ref ? clean : real, b = ref ? real : clean;
    const Result r = run_ced("diff " + a.string() + " " + b.string() + " --policy " + tol);
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_NE(r.out.find(fmt::format("worst: runs/{}/layers/{}/topk, position {}", run, rs.layer,
                                     plant::position_of(base, rs))),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("near_tie"), std::string::npos) << r.out;
  }
  // a version-1 reference: no scores, so near_tie cannot judge; said, exit 0
  const fs::path v1 = scratch() / "nt-v1.h5";
  fs::copy_file(clean, v1, fs::copy_options::overwrite_existing);
  {
    hid_t file = H5Fopen(v1.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = H5Aopen(file, "format_version", H5P_DEFAULT);
    const int64_t one = 1;
    ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &one), 0);
    H5Aclose(a);
    H5Fclose(file);
  }
  const Result r = run_ced("diff " + real.string() + " " + v1.string() + " --policy " + tol);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("near-tie test not possible: the reference has no index scores (a version-1 file)"),
            std::string::npos)
      << r.out;
}

// The same through `ced gate`: the golden file (the reference) of a copy
// planted with a swap at a near-tied boundary passes a policy whose near_tie
// covers the row's gap and fails one below it; a swap of the top entry fails.
TEST(JudgePlantCli, CedGateClassifiesANearTieInAGoldenCopyAndFailsARealSwap) {
  const fs::path dir = scratch() / "golden-nt";
  const RunFile golden = read_run_file(golden::default_golden_dir() / "tiny.h5");
  const size_t run = 1;  // ced-bounded
  // a full row whose boundary margin is not zero, and a row whose top entry
  // scores well above its k-th
  int64_t nl = -1, nr = -1, rl = -1, rr = -1;
  double gap = 0;
  for (const auto& c : golden.runs[run].result.layers) {
    ASSERT_EQ(c.has_topk, c.has_scores) << c.layer;
    for (Eigen::Index row = 0; c.has_scores && row < c.topk.rows(); ++row) {
      const double m = c.kth_score[size_t(row)] - c.left_out_score[size_t(row)];
      if (nl < 0 && m > 0) nl = c.layer, nr = row, gap = m;
    }
  }
  ASSERT_GE(nl, 0);
  for (const auto& c : golden.runs[run].result.layers)
    for (Eigen::Index row = 0; c.has_scores && rl < 0 && row < c.topk.rows(); ++row)
      if (c.topk(row, 1) >= 0 && c.topk_scores(row, 0) - c.kth_score[size_t(row)] > 2 * gap) rl = c.layer, rr = row;
  ASSERT_GE(rl, 0);
  auto gate = [&](int64_t layer, int64_t row, int64_t col, double tol) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    RunFile f = golden;
    for (auto& c : f.runs[run].result.layers)
      if (c.layer == layer) c.topk(row, col) = 100000;  // an entry id no row holds; its score kept
    write_run_file(dir / "tiny.h5", f);
    write_text(dir / "nt.toml", fmt::format("[[rule]]\npattern = \"runs/*/layers/*/topk\"\nreason = \"plant test\"\n"
                                            "near_tie = {:.17g}\n[[rule]]\npattern = \"**\"\nreason = \"reference-f64 "
                                            "reproduces its golden files bitwise\"\natol = 0\nrtol = 0\n",
                                            tol));
    return run_ced("gate --golden " + dir.string() + " --policy " + (dir / "nt.toml").string());
  };
  int64_t k = 0;
  for (const auto& c : golden.runs[run].result.layers)
    if (c.has_topk) k = c.topk.cols();
  {
    const Result g = gate(nl, nr, k - 1, gap);
    EXPECT_EQ(g.code, 0) << g.out << g.err;
  }
  const auto pos = [&](int64_t layer, int64_t row) {
    for (const auto& c : golden.runs[run].result.layers)
      if (c.layer == layer) return c.positions[size_t(row)];
    return int64_t(-1);
  };
  const std::string name = golden.runs[run].name;
  for (const auto& [layer, row, col, tol] :
       {std::tuple{nl, nr, k - 1, gap / 2}, std::tuple{rl, rr, int64_t(0), gap}}) {
    const Result g = gate(layer, row, col, tol);
    EXPECT_EQ(g.code, 1) << g.out << g.err;
    EXPECT_NE(g.out.find(fmt::format("tiny.h5:{}: runs/{}/layers/{}/topk worst at position {}", name, name, layer,
                                     pos(layer, row))),
              std::string::npos)
        << g.out;
  }
  fs::remove_all(dir);
}
