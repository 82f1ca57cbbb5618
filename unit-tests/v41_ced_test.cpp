// docs/v41.md §13: CED prefill on the released architecture. The engines' replay conventions as data,
// their exact spans from the plan, and on v41-tiny (E = 3, three decoder layers, W = 16): replaying every
// row is the prefill, bitwise; the exact span makes the last position bitwise exact and one row fewer
// does not; vLLM's convention keeps layer E exact where SGLang's floors it.
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

// The logits row of position p in a result whose rows start at first_row.
std::vector<double> logits_at(const V41ForwardResult& r, int64_t p, int64_t V) {
  const int64_t row = p - r.first_row;
  return {r.logits.begin() + row * V, r.logits.begin() + (row + 1) * V};
}

}  // namespace

TEST(V41Ced, ConventionsSpanOneRowPerFlooredLayerAndWindowOnTheReleaseSchedule) {
  const V41Plan ced = make_v41_plan(v41_builtin_config("v41-ced"));
  ASSERT_EQ(ced.E, 20);
  ASSERT_EQ(ced.W, 128);
  // SGLang and TensorRT-LLM floor layers 20-39: 1 + 20 · 127; vLLM keeps layer 20 whole: 1 + 19 · 127.
  EXPECT_EQ(v41_exact_span(ced, v41_replay_convention("sglang")), 2541);
  EXPECT_EQ(v41_exact_span(ced, v41_replay_convention("trtllm")), 2541);
  EXPECT_EQ(v41_exact_span(ced, v41_replay_convention("vllm")), 2414);
  EXPECT_EQ(v41_exact_span(ced, v41_replay_convention("atom")), 2414);
  // The all-layers tail floors all 40: 1 + 40 · 127.
  EXPECT_EQ(v41_exact_span(ced, v41_replay_convention("ascend")), 5081);
  // The next decode step reads W - 1 keys of its own window per floored layer: F (W - 1).
  EXPECT_EQ(v41_exact_decode_span(ced, v41_replay_convention("sglang")), 2540);
  EXPECT_EQ(v41_exact_decode_span(ced, v41_replay_convention("vllm")), 2413);
  // ATOM's tail holds the speculative tokens too; the others' stays W.
  EXPECT_EQ(v41_bounded_tail(ced, v41_replay_convention("atom"), 3), 131);
  EXPECT_EQ(v41_bounded_tail(ced, v41_replay_convention("vllm"), 3), 128);
  const V41Plan tiny = make_v41_plan(v41_builtin_config("v41-tiny"));
  EXPECT_EQ(v41_exact_span(tiny, v41_replay_convention("sglang")), 1 + 3 * 15);
  EXPECT_EQ(v41_exact_span(tiny, v41_replay_convention("vllm")), 1 + 2 * 15);
  EXPECT_EQ(v41_exact_span(tiny, v41_replay_convention("ascend")), 1 + 6 * 15);
  EXPECT_THROW(v41_replay_convention("chiro"), InputError);
}

TEST(V41Ced, ReplayingEveryRowIsThePrefillBitwise) {
  for (V41Regime r : {V41Regime::bf16, V41Regime::release}) {
    const V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, r);
    const auto tokens = prompt(37, m.config().vocab_size, 7);
    const V41EngramHashing h = v41_checkpoint_hashing(m.config());
    const V41ForwardResult full = m.forward(tokens, h);
    for (const auto& conv : v41_replay_conventions())
      for (int64_t R : {int64_t{37}, int64_t{100}}) {
        if (R > 37 && conv.floor_first_layer) continue;  // more rows than the prompt: once is enough
        const V41ForwardResult c = m.forward_ced(tokens, h, R, conv);
        EXPECT_EQ(c.first_row, 0);
        EXPECT_EQ(c.logits, full.logits) << conv.name << " R " << R << " " << v41_regime_name(r);
        for (size_t l = 0; l < full.layers.size(); ++l) EXPECT_EQ(c.layers[l].out, full.layers[l].out) << l;
      }
  }
}

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

TEST(V41Ced, TheExactSpanMakesTheLastPositionBitwiseExactAndOneRowFewerLeavesItsConeShort) {
  for (V41Regime r : {V41Regime::f64, V41Regime::release}) {
    V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, r);
    const int64_t N = 100, V = m.config().vocab_size;
    const auto tokens = prompt(N, V, 7);
    const V41EngramHashing h = v41_checkpoint_hashing(m.config());
    const std::vector<double> exact = logits_at(m.forward(tokens, h), N - 1, V);
    for (const char* name : {"sglang", "vllm", "ascend"}) {  // trtllm's data is sglang's, atom's vllm's
      const V41ReplayConvention& conv = v41_replay_convention(name);
      const int64_t span = v41_exact_span(m.plan(), conv);
      m.set_floor_probe(false);
      const V41ForwardResult at = m.forward_ced(tokens, h, span, conv);
      EXPECT_EQ(at.first_row, N - span);
      EXPECT_EQ(logits_at(at, N - 1, V), exact) << conv.name << " " << v41_regime_name(r) << " R = span " << span;
      // One row fewer is not always a different number (the window keys' FP8 rounding absorbs the cone's
      // far end), so the claim is the dependency: with the floored keys read as NaN, the span's last
      // logits stay finite and one row fewer's do not.
      m.set_floor_probe(true);
      EXPECT_TRUE(all_finite(logits_at(m.forward_ced(tokens, h, span, conv), N - 1, V))) << conv.name << " probe at span";
      EXPECT_FALSE(all_finite(logits_at(m.forward_ced(tokens, h, span - 1, conv), N - 1, V)))
          << conv.name << " probe at span - 1";
    }
  }
}

TEST(V41Ced, ExactReplayIsBitwiseOnAPromptOfTiesUnderEitherTieRule) {
  // One token repeated: the index scores tie everywhere (equal keys of equal rows, and ReLU's exact zeros),
  // so every selection is decided by the tie rule. A tail row's score row has the prefill's length (every
  // group of the prompt), so either rule selects alike in both, and the exact span stays bitwise.
  for (V41TopkTies ties : {V41TopkTies::torch, V41TopkTies::lowest_index}) {
    V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
    V41Options o;
    o.topk_ties = ties;
    m.set_options(o);
    const int64_t N = 60, V = m.config().vocab_size;  // past sglang's span 46 and vllm's 31; ascend's 91 is all
    const std::vector<int64_t> tokens(static_cast<size_t>(N), 7);
    const V41EngramHashing h = v41_checkpoint_hashing(m.config());
    const V41ForwardResult full = m.forward(tokens, h);
    for (const char* name : {"sglang", "vllm", "ascend"}) {
      const V41ReplayConvention& conv = v41_replay_convention(name);
      EXPECT_EQ(logits_at(m.forward_ced(tokens, h, v41_exact_span(m.plan(), conv), conv), N - 1, V),
                logits_at(full, N - 1, V))
          << name << " " << v41_topk_ties_name(ties);
      EXPECT_EQ(m.forward_ced(tokens, h, N, conv).logits, full.logits) << name << " " << v41_topk_ties_name(ties);
    }
  }
}

TEST(V41Ced, TheFloorProbeChangesNothingWhereNothingIsFloored) {
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
  const auto tokens = prompt(60, m.config().vocab_size, 7);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  const std::vector<double> plain = m.forward_ced(tokens, h, 60, v41_replay_convention("sglang")).logits;
  m.set_floor_probe(true);
  EXPECT_EQ(m.forward_ced(tokens, h, 60, v41_replay_convention("sglang")).logits, plain);
  EXPECT_EQ(m.forward(tokens, h).logits, plain);
  // A bounded replay: the tail's first rows read floored keys, the last (its cone inside the tail) none.
  const V41ForwardResult b = m.forward_ced(tokens, h, 20, v41_replay_convention("sglang"));
  EXPECT_FALSE(all_finite(logits_at(b, 40, m.config().vocab_size)));
}

TEST(V41Ced, VllmKeepsLayerEExactWhereSglangFloorsItsWindow) {
  const V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::bf16);
  const int64_t N = 50, W = m.config().window_size, E = m.plan().E, row = m.config().hc_mult * m.config().dim;
  const auto tokens = prompt(N, m.config().vocab_size, 7);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  const V41ForwardResult full = m.forward(tokens, h);
  auto tail_of_E = [&](const V41ForwardResult& r) {
    const auto& out = r.layers[static_cast<size_t>(E)].out;
    return std::vector<double>(out.end() - W * row, out.end());
  };
  const std::vector<double> exact = tail_of_E(full);
  EXPECT_EQ(tail_of_E(m.forward_ced(tokens, h, W, v41_replay_convention("vllm"))), exact);
  EXPECT_NE(tail_of_E(m.forward_ced(tokens, h, W, v41_replay_convention("sglang"))), exact);
  // Below E nothing is replayed: every row of the encoder is the prefill's.
  const V41ForwardResult c = m.forward_ced(tokens, h, W, v41_replay_convention("sglang"));
  for (int64_t l = 0; l < E; ++l) EXPECT_EQ(c.layers[static_cast<size_t>(l)].out, full.layers[static_cast<size_t>(l)].out) << l;
  EXPECT_THROW(m.forward_ced(tokens, h, 0, v41_replay_convention("vllm")), InputError);
}

TEST(V41Ced, ReuseLayersAboveEReadTheTailsRowsOfItsSelection) {
  // As the release's layers 21-23 reuse layer 20's selection: tiny with layer 4 a Reuse of layer 3 (E),
  // whose selection, made on every row with the window rows' offset, must reach the tail re-offset.
  V41Config c = v41_builtin_config("v41-tiny");
  c.index_source_layers = {1, 3};
  const V41Checkpoint ck = make_v41_random_checkpoint(c, test_seed());
  const V41Model m(ck.config, ck.weights, V41Regime::release);
  ASSERT_EQ(m.plan()[4].role, Role::Reuse);
  const int64_t N = 50, V = c.vocab_size;
  const auto tokens = prompt(N, V, 7);
  const V41EngramHashing h = v41_checkpoint_hashing(c);
  const V41ReplayConvention& vllm = v41_replay_convention("vllm");
  const V41ForwardResult tail = m.forward_ced(tokens, h, v41_exact_span(m.plan(), vllm), vllm);
  EXPECT_EQ(logits_at(tail, N - 1, V), logits_at(m.forward(tokens, h), N - 1, V));
}

TEST(V41Ced, BoundedReplayOfAPromptWithinTheWindowIsThePrefill) {
  const V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
  const int64_t W = m.config().window_size;
  const auto tokens = prompt(W, m.config().vocab_size, 7);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  EXPECT_EQ(m.forward_ced(tokens, h, W, v41_replay_convention("sglang")).logits, m.forward(tokens, h).logits);
}

TEST(V41Ced, TheSourceOnlyWriteIsBitwiseWhatThePrefillLeavesInEachKvSourcesCache) {
  for (V41Regime r : {V41Regime::bf16, V41Regime::release}) {
    const V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, r);
    const int64_t N = 41;  // odd: a ratio-2 source keeps a pending token in its group state
    const auto tokens = prompt(N, m.config().vocab_size, 7);
    V41DecodeState state;
    const V41ForwardResult full = m.forward(tokens, v41_checkpoint_hashing(m.config()), &state);
    int64_t checked = 0;
    for (const LayerPlan& lp : m.plan().layers) {
      if (!lp.owns_compressor || lp.engram) continue;
      const V41LayerCapture& cap = full.layers[static_cast<size_t>(lp.layer)];
      const V41LayerCache w = m.source_write(lp.layer, cap.in, cap.pre_mix, N);
      const V41LayerCache& want = state.layers[static_cast<size_t>(lp.layer)];
      EXPECT_EQ(w.compress_kv, want.compress_kv) << lp.layer;
      EXPECT_EQ(w.index_k, want.index_k) << lp.layer;
      EXPECT_EQ(w.kv_state, want.kv_state) << lp.layer;
      EXPECT_EQ(w.score_state, want.score_state) << lp.layer;
      EXPECT_FALSE(w.compress_kv.empty()) << lp.layer;
      ++checked;
    }
    EXPECT_GE(checked, 2);  // layer E and an encoder source at least
  }
  EXPECT_THROW(V41Model(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::bf16)
                   .source_write(0, std::vector<double>(3), std::vector<double>(1), 1),
               InputError);
}

TEST(V41Ced, ADecodeStepAfterACedPrefillOfItsDecodeSpanIsTheStepAfterThePrefill) {
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::f64);
  const int64_t N = 100, V = m.config().vocab_size;
  const auto tokens = prompt(N + 1, V, 9);
  const std::vector<int64_t> prompt_tokens(tokens.begin(), tokens.end() - 1);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  V41DecodeState exact_state;
  m.forward(prompt_tokens, h, &exact_state);
  const std::vector<double> exact = m.decode_step(tokens.back(), h, exact_state).logits;
  for (const char* name : {"sglang", "vllm", "ascend"}) {
    const V41ReplayConvention& conv = v41_replay_convention(name);
    const int64_t span = v41_exact_decode_span(m.plan(), conv);
    auto step_after = [&](int64_t replay) {
      V41DecodeState s;
      m.forward_ced(prompt_tokens, h, replay, conv, &s);
      EXPECT_EQ(s.pos, N);
      EXPECT_EQ(s.tokens, prompt_tokens);
      return m.decode_step(tokens.back(), h, s).logits;
    };
    EXPECT_EQ(step_after(N), exact) << name << ": every row replayed";
    EXPECT_EQ(step_after(span), exact) << name << ": the decode span " << span;
    m.set_floor_probe(true);  // one row fewer leaves a key of the step's cone out: NaN under the probe
    EXPECT_TRUE(all_finite(step_after(span))) << name << ": probe at the decode span";
    EXPECT_FALSE(all_finite(step_after(span - 1))) << name << ": probe one row short of the decode span";
    m.set_floor_probe(false);
  }
}

TEST(V41Ced, ReplaysOnOneEncodingAreTheCedPrefillsBitwise) {
  const V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
  const int64_t N = 60;
  const auto tokens = prompt(N, m.config().vocab_size, 7);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  for (const char* name : {"sglang", "vllm", "ascend"}) {
    const V41ReplayConvention& conv = v41_replay_convention(name);
    const V41CedEncoding enc = m.ced_encoding(tokens, h, conv, true);
    for (int64_t R : {int64_t{1}, int64_t{16}, int64_t{45}, N}) {
      V41DecodeState a, b;
      const V41ForwardResult once = m.forward_ced(tokens, h, R, conv, &a);
      const V41ForwardResult shared = m.forward_ced(enc, R, conv, &b);
      EXPECT_EQ(shared.first_row, once.first_row);
      EXPECT_EQ(shared.logits, once.logits) << name << " R " << R;
      ASSERT_EQ(shared.layers.size(), once.layers.size());
      for (size_t l = 0; l < once.layers.size(); ++l) EXPECT_EQ(shared.layers[l].out, once.layers[l].out) << l;
      EXPECT_EQ(m.decode_step(tokens[0], h, a).logits, m.decode_step(tokens[0], h, b).logits) << name << " R " << R;
    }
  }
  // An encoding is for its cut: the all-layers tail's is not SGLang's.
  EXPECT_THROW(m.forward_ced(m.ced_encoding(tokens, h, v41_replay_convention("ascend")), 16, v41_replay_convention("sglang")),
               InputError);
  V41DecodeState s;
  EXPECT_THROW(m.forward_ced(m.ced_encoding(tokens, h, v41_replay_convention("vllm")), 16, v41_replay_convention("vllm"), &s),
               InputError);
}
