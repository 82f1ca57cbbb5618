// docs/v41.md §13.8: resuming a prompt after a prefix-cache hit on the released architecture. The engines'
// encoder-replay rules as data; on v41-tiny (W = 16, kv sources 1 (ratio 2) and 3 (ratio 1), E = 3): a hit
// of at most W tokens rebuilds every row and so is the cold run, bitwise, in every mode, caches and the
// next decode step included; a longer hit is not; the planted off-by-one replay start is caught at H = W.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward.hpp"
#include "unit-tests/v41_test_model.hpp"

using namespace ced;
using namespace ced::v41;
using namespace ced::v41::testing;

namespace {

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// The last position's logits of a result.
std::vector<double> last_logits(const V41ForwardResult& r, int64_t V) { return {r.logits.end() - V, r.logits.end()}; }

// One prompt on one model: its cold run in a mode (ced under a convention, or full) with the state, and the
// prefix cache of its first H tokens, as an engine's earlier request left it.
struct Cold {
  V41ForwardResult run;
  V41DecodeState state;
};

Cold cold_run(const V41Model& m, const std::vector<int64_t>& tokens, const V41EngramHashing& h, int64_t R,
              const V41ReplayConvention* conv) {
  Cold c;
  c.run = conv ? m.forward_ced(tokens, h, R, *conv, &c.state) : m.forward(tokens, h, &c.state);
  return c;
}

}  // namespace

TEST(V41Resume, RulesRebuildTheWindowBeforeTheHitAndThePendingGroupVllmIgnoresShortHitsSglangEvenOnes) {
  const V41Plan p = make_v41_plan(v41_builtin_config("v41-ced"));  // W = 128, ratio-2 kv sources 2, 8, 14
  const auto& vllm = v41_encoder_replay_rule("vllm");
  const auto& trt = v41_encoder_replay_rule("trtllm");
  const auto& sgl = v41_encoder_replay_rule("sglang");
  auto at = [&](const V41EncoderReplayRule& r, int64_t H, int64_t K) {
    const V41Resume s = v41_resume(p, r, H, K);
    return std::pair{s.hit, s.start};
  };
  EXPECT_EQ(at(vllm, 127, 128), std::pair(int64_t{0}, int64_t{0}));  // not adopted: a cold run
  EXPECT_EQ(at(vllm, 128, 128), std::pair(int64_t{128}, int64_t{0}));
  EXPECT_EQ(at(vllm, 322, 128), std::pair(int64_t{322}, int64_t{194}));
  EXPECT_EQ(at(trt, 127, 128), std::pair(int64_t{127}, int64_t{0}));  // adopted, every row rebuilt
  EXPECT_EQ(at(trt, 451, 128), std::pair(int64_t{451}, int64_t{323}));
  EXPECT_EQ(at(sgl, 451, 128), std::pair(int64_t{450}, int64_t{322}));  // cut to an even boundary
  // Nothing rebuilt: at an odd boundary the pending group's first token is still recomputed.
  EXPECT_EQ(at(trt, 451, 0), std::pair(int64_t{451}, int64_t{450}));
  EXPECT_EQ(at(trt, 450, 0), std::pair(int64_t{450}, int64_t{450}));
  EXPECT_THROW(v41_encoder_replay_rule("mooncake"), InputError);
  EXPECT_THROW(v41_resume(p, trt, -1, 128), InputError);
}

TEST(V41Resume, AHitOfAtMostTheWindowIsTheColdRunBitwiseCachesAndNextDecodeStepIncluded) {
  for (V41Regime regime : {V41Regime::f64, V41Regime::release}) {
    const V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, regime);
    const int64_t N = 70, W = m.plan().W, V = m.config().vocab_size;
    const auto tokens = prompt(N + 1, V, 11);
    const std::vector<int64_t> prompt_tokens(tokens.begin(), tokens.end() - 1);
    const V41EngramHashing h = v41_checkpoint_hashing(m.config());
    const V41ReplayConvention* modes[] = {&v41_replay_convention("sglang"), &v41_replay_convention("vllm"), nullptr};
    for (const V41ReplayConvention* conv : modes)
      for (int64_t R : {W, N}) {
        if (!conv && R == W) continue;  // a full prefill has no replay
        Cold cold = cold_run(m, prompt_tokens, h, R, conv);
        const V41ForwardResult cold_step = m.decode_step(tokens.back(), h, cold.state);
        Cold again = cold_run(m, prompt_tokens, h, R, conv);  // the cache the hit reads
        for (const auto& rule : v41_encoder_replay_rules())
          for (int64_t H : {W - 1, W}) {  // odd and even boundaries
            const std::string what = fmt::format("{} {} R {} rule {} H {}", v41_regime_name(regime),
                                                 conv ? conv->name : "full", R, rule.name, H);
            V41DecodeState st;
            const V41ForwardResult r =
                m.forward_resume(prompt_tokens, h, m.prefix_hit(again.state, H), rule, W, R, conv, &st);
            EXPECT_EQ(r.first_row, cold.run.first_row) << what;
            EXPECT_EQ(r.logits, cold.run.logits) << what;
            for (size_t l = 0; l < st.layers.size(); ++l) {
              EXPECT_EQ(st.layers[l].window, again.state.layers[l].window) << what << " layer " << l;
              EXPECT_EQ(st.layers[l].compress_kv, again.state.layers[l].compress_kv) << what << " layer " << l;
              EXPECT_EQ(st.layers[l].index_k, again.state.layers[l].index_k) << what << " layer " << l;
              EXPECT_EQ(st.layers[l].kv_state, again.state.layers[l].kv_state) << what << " layer " << l;
            }
            EXPECT_EQ(m.decode_step(tokens.back(), h, st).logits, cold_step.logits) << what;
          }
      }
  }
}

TEST(V41Resume, ALongerHitRebuildsOnlyTheWindowAndDiffersFromTheColdRunWhileItsRowsReadTheCacheReadOnly) {
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::f64);
  const int64_t N = 90, W = m.plan().W, V = m.config().vocab_size;
  const auto tokens = prompt(N, V, 13);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  const auto& conv = v41_replay_convention("sglang");
  Cold cold = cold_run(m, tokens, h, W, &conv);
  for (int64_t H : {W + 1, 2 * W - 1, 2 * W, 3 * W + 3}) {
    const V41PrefixHit hit = m.prefix_hit(cold.state, H);
    for (const auto& rule : v41_encoder_replay_rules()) {
      V41DecodeState st;
      const V41ForwardResult r = m.forward_resume(tokens, h, hit, rule, W, W, &conv, &st);
      ASSERT_TRUE(all_finite(r.logits)) << rule.name << " H " << H;
      // SGLang cuts a hit of W + 1 to W: every row rebuilt, the cold run; the others rebuild from H - W.
      if (v41_resume(m.plan(), rule, H, W).start == 0) {
        EXPECT_EQ(r.logits, cold.run.logits) << rule.name << " H " << H;
        EXPECT_EQ(std::string(rule.name) + " " + std::to_string(H), "sglang " + std::to_string(W + 1));
      } else {
        EXPECT_NE(last_logits(r, V), last_logits(cold.run, V)) << rule.name << " H " << H;
      }
      // The cached groups are the resumed state's first ones, untouched.
      for (const LayerPlan& lp : m.plan().layers) {
        if (!lp.owns_compressor) continue;
        const auto& got = st.layers[static_cast<size_t>(lp.layer)].compress_kv;
        const auto& want = hit.layers[static_cast<size_t>(lp.layer)].compress_kv;
        const int64_t used = v41_resume(m.plan(), rule, H, W).hit / lp.ratio * m.config().head_dim;
        ASSERT_GE(got.size(), static_cast<size_t>(used));
        EXPECT_TRUE(std::equal(want.begin(), want.begin() + used, got.begin())) << rule.name << " layer " << lp.layer;
      }
    }
  }
}

TEST(V41Resume, TheEncoderReplaySpanMakesTheResumeBitwiseAndOneRowFewerLeavesTheConeShort) {
  // Rebuilding K rows before the hit: the groups from the hit on read every kv source's rows there, whose
  // inputs at layer k need k (W - 1) rows before them, and a pending ratio-2 group one more.
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::f64);
  const int64_t N = 120, V = m.config().vocab_size;
  const auto tokens = prompt(N, V, 17);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  const auto& trt = v41_encoder_replay_rule("trtllm");
  // The probe needs the decoder exact too: the replay keeps every rebuilt row (R = N), whose windows the
  // last position reaches only 6 (W - 1) = 90 rows back, after the start.
  for (const V41ReplayConvention* conv : {&v41_replay_convention("sglang"), &v41_replay_convention("vllm")})
    for (int64_t R : {m.plan().W, N}) {
      Cold cold = cold_run(m, tokens, h, R, conv);
      for (int64_t H : {int64_t{60}, int64_t{61}}) {
        const int64_t span = v41_encoder_replay_span(m.plan(), H);
        EXPECT_EQ(span, 45) << H;  // kv source 3 (ratio 1): 3 · 15 rows; kv source 1 (ratio 2): 15 + H % 2
        const V41PrefixHit hit = m.prefix_hit(cold.state, H);
        EXPECT_EQ(last_logits(m.forward_resume(tokens, h, hit, trt, span, R, conv), V), last_logits(cold.run, V))
            << conv->name << " R " << R << " H " << H;
        // One row fewer may still give the same bits (the FP4 and FP8 quantization points absorb a small
        // change); the probe shows the cone itself.
        if (R < N) continue;
        m.set_floor_probe(true);
        EXPECT_TRUE(all_finite(last_logits(m.forward_resume(tokens, h, hit, trt, span, R, conv), V)));
        EXPECT_FALSE(all_finite(last_logits(m.forward_resume(tokens, h, hit, trt, span - 1, R, conv), V)))
            << conv->name << " H " << H;
        m.set_floor_probe(false);
      }
    }
}

TEST(V41Resume, ThePlantedOffByOneReplayStartIsCaughtAtAHitOfTheWindow) {
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::f64);
  const int64_t N = 70, W = m.plan().W;
  const auto tokens = prompt(N, m.config().vocab_size, 11);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  const auto& conv = v41_replay_convention("sglang");
  Cold cold = cold_run(m, tokens, h, W, &conv);
  const V41PrefixHit hit = m.prefix_hit(cold.state, W);
  m.set_fault(V41Fault::resume_start_off_by_one);
  EXPECT_NE(m.forward_resume(tokens, h, hit, v41_encoder_replay_rule("trtllm"), W, W, &conv).logits, cold.run.logits);
  // Below the window it starts at 0 all the same: the property needs H = W to see it.
  EXPECT_EQ(m.forward_resume(tokens, h, m.prefix_hit(cold.state, W - 1), v41_encoder_replay_rule("trtllm"), W, W, &conv)
                .logits,
            cold.run.logits);
}

TEST(V41Resume, AHitOfTheWholePromptRebuildsItsPendingGroupForTheNextDecodeStep) {
  // The cache has every group of the prompt but not the one being filled at an odd length: the resume must
  // recompute it from its token, or the decode step after it reads an empty group.
  const V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
  const int64_t W = m.plan().W, N = W - 1;  // odd, and within the window: every row rebuilt
  const auto tokens = prompt(N + 1, m.config().vocab_size, 5);
  const std::vector<int64_t> p(tokens.begin(), tokens.end() - 1);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  const auto& conv = v41_replay_convention("sglang");
  V41DecodeState cold, again, st;
  const V41ForwardResult want = m.forward_ced(p, h, W, conv, &cold);
  m.forward_ced(p, h, W, conv, &again);
  const V41ForwardResult got = m.forward_resume(p, h, m.prefix_hit(again, N), v41_encoder_replay_rule("trtllm"), W, W,
                                                &conv, &st);
  EXPECT_EQ(got.logits, want.logits);
  for (size_t l = 0; l < st.layers.size(); ++l) EXPECT_EQ(st.layers[l].kv_state, cold.layers[l].kv_state) << l;
  EXPECT_EQ(m.decode_step(tokens.back(), h, st).logits, m.decode_step(tokens.back(), h, cold).logits);
}

TEST(V41Resume, RefusesAHitLongerThanThePromptAndTheAllLayersTail) {
  const V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::f64);
  const auto tokens = prompt(40, m.config().vocab_size, 3);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  V41DecodeState st;
  m.forward(tokens, h, &st);
  const auto& rule = v41_encoder_replay_rule("vllm");
  const V41PrefixHit hit = m.prefix_hit(st, 40);
  const std::vector<int64_t> shorter(tokens.begin(), tokens.begin() + 30);
  EXPECT_THROW(m.forward_resume(shorter, h, hit, rule, 16, 16, nullptr), InputError);
  EXPECT_THROW(m.forward_resume(tokens, h, hit, rule, 16, 16, &v41_replay_convention("ascend")), InputError);
  EXPECT_THROW(m.prefix_hit(st, 41), InputError);
  // A replay longer than the rebuilt rows keeps them all: the same as asking for exactly them.
  const auto& conv = v41_replay_convention("sglang");
  EXPECT_EQ(m.forward_resume(tokens, h, m.prefix_hit(st, 30), rule, 16, 40, &conv).logits,
            m.forward_resume(tokens, h, m.prefix_hit(st, 30), rule, 16, 40 - 14, &conv).logits);
}
