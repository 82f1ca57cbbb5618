// docs/spec.md §4.4, §7: the checks on the replay-budget curve (`ced replay-budget`),
// each also fed a planted difference that it must report.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdio>

#include "checks/replay_budget.hpp"
#include "property-tests/generators.hpp"
#include "property-tests/plant.hpp"
#include "reference/lab/replays.hpp"

using namespace ced;
using namespace ced::prop;

namespace {

// B in {1, W, R-1, R, D(W-1), N} and two random spans: the points where the
// curve must reach zero, and around them.
std::vector<int64_t> curve_replays(const Plan& p, int64_t N) {
  std::vector<int64_t> b = {1, p.W, p.exact_replay() - 1, p.exact_replay(), p.exact_decode_replay(), N,
                            *rc::gen::inRange<int64_t>(1, N + 1), *rc::gen::inRange<int64_t>(1, N + 1)};
  std::erase_if(b, [](int64_t x) { return x < 1; });
  return b;
}

BudgetOptions options(int64_t N, std::vector<int64_t> replays, int64_t seeds, int64_t decode) {
  BudgetOptions o;
  o.lengths = {N};
  o.replays = std::move(replays);
  for (int64_t s = 0; s < seeds; ++s) o.token_seeds.push_back(uint64_t(s));
  o.weight_seeds = {kWeightSeed};
  o.decode = decode;
  return o;
}

// The reference f32 backend (the one `ced replay-budget` runs by default),
// optionally wrapped by a plant.
BudgetOptions with_plant(BudgetOptions o, const std::shared_ptr<PlantState>& st) {
  o.make_backend = [st](const Config& c, uint64_t seed) -> std::unique_ptr<Backend> {
    auto be = make_reference_backend(c, seed, /*f64=*/false);
    if (!st) return be;
    return planting(st)(std::move(be), "m");
  };
  return o;
}

RunMatch replay_is(int64_t B) {
  return [B](const std::string&, const RunRequest& r) { return r.mode == Mode::Ced && r.replay.str() == std::to_string(B); };
}

}  // namespace

// Every random config and length: drift is bitwise zero from R on (decode:
// from D(W-1), layer E+k: from 1 + (k+1)(W-1)), and the counted FLOPs equal the
// model's, for every B measured.
RC_GTEST_PROP(ReplayBudget, CurveIsExactFromTheConeBoundsAndFlopsMatchTheModel, ()) {
  const Config c = *gen_config();
  const Plan p = make_plan(c);
  const int64_t N = *gen_length(p);
  const BudgetData d = replay_budget(c, with_plant(options(N, curve_replays(p, N), 2, 2), nullptr));
  RC_ASSERT(!d.samples.empty());
  const std::string f = check_budget_curve(p, d.samples);
  RC_ASSERT(f.empty());
}

// The reference's shared encoder (reference/lab/replays.hpp) hands back what separate runs do.
RC_GTEST_PROP(ReplayBudget, RunReplaysEqualsSeparateRunsBitwise, ()) {
  const Config c = *gen_config();
  const Plan p = make_plan(c);
  const int64_t N = *gen_length(p);
  auto be = make_reference_backend(c, kWeightSeed, *rc::gen::arbitrary<bool>());
  RunRequest r;
  r.mode = Mode::Ced;
  r.n_prompt = N;
  r.decode_steps = *rc::gen::inRange<int64_t>(0, 3);
  r.tokens = make_tokens(kTokenSeed, c.vocab_size, N + r.decode_steps);
  r.capture_layers = true;
  r.logits = *rc::gen::arbitrary<bool>() ? LogitsScope::Last : LogitsScope::All;
  std::vector<ReplayPolicy> policies;
  for (int64_t B : curve_replays(p, N)) policies.push_back(ReplayPolicy::parse(std::to_string(B)));
  RC_ASSERT(check_run_replays(*be, r, policies).empty());
}

// On `small` (R = 43) the curve has not reached zero one step before R: at
// B = R - 1 some token seed's last logits differ from exact recovery.
TEST(ReplayBudget, SmallDriftsAtRMinusOneForSomeSeed) {
  const Config c = builtin_config("small");
  const Plan p = make_plan(c);
  const int64_t R = p.exact_replay(), N = default_budget_length(p);
  const BudgetData d = replay_budget(c, with_plant(options(N, {R - 1, R}, 8, 1), nullptr));
  int64_t nonzero = 0;
  for (const auto& s : d.samples)
    if (s.drift.kind == "prefill" && s.drift.replay == R - 1 && !s.drift.exact) ++nonzero;
  std::printf("small: N = %lld, B = R - 1 = %lld: %lld of 8 token seeds drift\n", (long long)N, (long long)(R - 1),
              (long long)nonzero);
  EXPECT_GT(nonzero, 0);
  EXPECT_EQ(check_budget_curve(p, d.samples), "");
}

// The plant: the B = R - 1 runs return exact recovery's logits (copied from
// the B = N run), so no seed drifts there; the count above must see it.
TEST(ReplayBudgetPlants, CopyingExactLogitsIntoRMinusOneLeavesNoDrift) {
  const Config c = builtin_config("small");
  const Plan p = make_plan(c);
  const int64_t R = p.exact_replay(), N = default_budget_length(p);
  auto st = std::make_shared<PlantState>();
  st->plant.name = "B = R - 1 logits copied from B = N";
  st->plant.kind = PlantKind::CopyLogits;
  st->plant.match = replay_is(R - 1);
  st->plant.source = replay_is(N);
  const BudgetData d = replay_budget(c, with_plant(options(N, {R - 1, R}, 8, 1), st));
  EXPECT_EQ(st->applied, 8);
  for (const auto& s : d.samples)
    if (s.drift.kind == "prefill") EXPECT_TRUE(s.drift.exact) << "B = " << s.drift.replay;
}

// Each planted difference in a run at or beyond its bound, or in its FLOP
// count, is reported by check_budget_curve.
TEST(ReplayBudgetPlants, CurveCheckReportsEachPlant) {
  const Config c = builtin_config("tiny");  // L = 8, E = 4, W = 4: R = 13, decode bound 12
  const Plan p = make_plan(c);
  const int64_t N = 20, R = p.exact_replay(), Rd = p.exact_decode_replay();
  struct Case {
    const char* name;
    int64_t B;
    PlantKind kind;
    int64_t layer, row;
    const char* expect;
  };
  const Case cases[] = {
      {"last logits at B = R, one ulp", R, PlantKind::Logit, 0, 0, "the last logits differ"},
      {"decode step 0 at B = D(W-1), one ulp", Rd, PlantKind::Logit, 0, 1, "decode step 0's logits differ"},
      // the capture ends with the 2 decode positions: N - 1 is its third row from the end
      {"last decoder layer at N - 1, B = R, one ulp", R, PlantKind::LayerOut, -1, -3, "decoder layer 7's output"},
      {"FLOP count of layer 5 at B = 4", 4, PlantKind::Flops, 5, 0, "counted FLOPs differ"},
  };
  for (const Case& k : cases) {
    auto st = std::make_shared<PlantState>();
    st->plant.name = k.name;
    st->plant.kind = k.kind;
    st->plant.layer = k.layer;
    st->plant.row = k.row;
    st->plant.match = replay_is(k.B);
    const BudgetData d = replay_budget(c, with_plant(options(N, {4, Rd, R}, 2, 2), st));
    EXPECT_EQ(st->applied, 2) << k.name;
    const std::string f = check_budget_curve(p, d.samples);
    EXPECT_NE(f.find(k.expect), std::string::npos) << k.name << ": " << f;
  }
  // Without a plant the same study passes.
  EXPECT_EQ(check_budget_curve(p, replay_budget(c, with_plant(options(N, {4, Rd, R}, 2, 2), nullptr)).samples), "");
}

namespace {
// A backend that slips one ulp into one policy's last logits in plain run()
// calls made after `armed` is set: what a shared-encoder result that drifted
// from the separate runs would look like to the check (which compares the two).
class SlippingRuns final : public Backend {
 public:
  explicit SlippingRuns(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::string dtype() const override { return inner_->dtype(); }
  RunResult run(const RunRequest& r) override {
    RunResult res = inner_->run(r);
    if (r.replay.str() == "5" && (calls_++ % 2) == 1) res.logits(0, 0) = std::nextafter(res.logits(0, 0), 1e300);
    return res;
  }

 private:
  std::unique_ptr<Backend> inner_;
  int calls_ = 0;
};

// A ced request for N tokens of `c` and `decode` steps, no replay policy yet.
RunRequest ced_request(const Config& c, int64_t N, int64_t decode) {
  RunRequest r;
  r.mode = Mode::Ced;
  r.n_prompt = N;
  r.decode_steps = decode;
  r.tokens = make_tokens(kTokenSeed, c.vocab_size, N + decode);
  return r;
}
}  // namespace

TEST(ReplayBudgetPlants, RunReplaysCheckReportsASlip) {
  const Config c = builtin_config("tiny");
  // Not the reference class itself, so run_replays calls run() per policy:
  // the first call of replay 5 is the "shared" result, the second the check's
  // own run, and only the second slips.
  SlippingRuns be(make_reference_backend(c, kWeightSeed, false));
  RunRequest r = ced_request(c, 20, 1);
  r.capture_layers = true;
  const std::vector<ReplayPolicy> policies = {ReplayPolicy::parse("20"), ReplayPolicy::parse("5")};
  const std::string f = check_run_replays(be, r, policies);
  EXPECT_NE(f.find("replay 5: the logits differ"), std::string::npos) << f;
  auto plain = make_reference_backend(c, kWeightSeed, false);
  EXPECT_EQ(check_run_replays(*plain, r, policies), "");
}

// A replay session (reference/lab/replays.hpp) hands back what separate runs do,
// probe after probe: replay lengths, decode steps, the dependency probe and the
// logits' scope in any order, the first probe again at the end (what one
// probe leaves behind must not reach the next).
RC_GTEST_PROP(ReplaySession, ProbesEqualSeparateRunsBitwise, ()) {
  const Config c = *gen_config();
  const Plan p = make_plan(c);
  const int64_t N = *gen_length(p);
  const bool f64 = *rc::gen::arbitrary<bool>();
  auto be = make_reference_backend(c, kWeightSeed, f64);
  RunRequest base;
  base.mode = Mode::Ced;
  base.n_prompt = N;
  base.replay = ReplayPolicy::parse("bounded");
  base.tokens = make_tokens(kTokenSeed, c.vocab_size, N);
  base.capture_layers = *rc::gen::arbitrary<bool>();
  std::vector<RunRequest> probes;
  const int64_t n = *rc::gen::inRange<int64_t>(2, 6);
  for (int64_t i = 0; i < n; ++i) {
    RunRequest r = base;
    r.replay = ReplayPolicy::parse(*rc::gen::element(std::string("bounded"), std::string("exact"), std::string("full"),
                                                     std::to_string(*rc::gen::inRange<int64_t>(1, N + 1))));
    r.decode_steps = *rc::gen::inRange<int64_t>(0, 3);
    r.tokens = make_tokens(kTokenSeed, c.vocab_size, N + r.decode_steps);
    r.poison_truncated = *rc::gen::arbitrary<bool>();
    r.logits = *rc::gen::arbitrary<bool>() ? LogitsScope::Last : LogitsScope::All;
    probes.push_back(r);
  }
  probes.push_back(probes.front());
  RC_LOG() << "N " << N << (f64 ? " f64" : " f32") << "\n";
  const std::string f = check_replay_session(*be, base, probes);
  RC_LOG() << f;
  RC_ASSERT(f.empty());
}

// A request that would need another encoder is the caller's bug, on the
// reference's session and on the run-each fallback alike.
TEST(ReplaySession, ARequestWithAnotherPrefillIsALogicError) {
  const Config c = builtin_config("tiny");
  const RunRequest base = ced_request(c, 20, 0);
  auto plain = make_reference_backend(c, kWeightSeed, false);
  SlippingRuns wrapped(make_reference_backend(c, kWeightSeed, false));
  for (Backend* be : {static_cast<Backend*>(plain.get()), static_cast<Backend*>(&wrapped)}) {
    const auto s = open_replays(*be, base);
    RunRequest ok = base;  // what a session's runs may vary
    ok.replay = ReplayPolicy::parse("5");
    ok.decode_steps = 2;
    ok.tokens = make_tokens(kTokenSeed, c.vocab_size, 22);
    ok.poison_truncated = true;
    ok.logits = LogitsScope::Last;
    EXPECT_NO_THROW(s->run(ok));
    std::vector<RunRequest> bad(5, ok);
    bad[0].n_prompt = 19;
    bad[1].tokens[3] ^= 1;
    bad[2].capture_layers = true;
    bad[3].fault = Fault::SinkDropped;
    bad[4].want_cache = true;
    for (const RunRequest& r : bad) EXPECT_THROW(s->run(r), std::logic_error) << be->name();
  }
}

TEST(ReplaySessionPlants, SessionCheckReportsASlip) {
  const Config c = builtin_config("tiny");
  // As RunReplaysCheckReportsASlip: the session's run of replay 5 is the
  // first call, the check's own run the second, and only the second slips.
  SlippingRuns be(make_reference_backend(c, kWeightSeed, false));
  const RunRequest base = ced_request(c, 20, 0);
  std::vector<RunRequest> probes(2, base);
  probes[0].replay = ReplayPolicy::parse("20");
  probes[1].replay = ReplayPolicy::parse("5");
  probes[1].decode_steps = 1;
  probes[1].tokens = make_tokens(kTokenSeed, c.vocab_size, 21);
  const std::string f = check_replay_session(be, base, probes);
  EXPECT_NE(f.find("probe 1 (replay 5, decode 1, no probe, logits all): the logits differ"), std::string::npos) << f;
  auto plain = make_reference_backend(c, kWeightSeed, false);
  EXPECT_EQ(check_replay_session(*plain, base, probes), "");
}
