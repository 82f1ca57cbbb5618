// The ports' bugs planted in the reference (V41Fault), and the shortest prompt that shows each in the
// logits' bits on v41-tiny. Below that length a port with the bug passes every comparison, bitwise; the
// length follows from the config's constants, which is why a port's suite must reach it (docs/v41.md §13.10:
// `ced spans` prints the boundary lengths).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "checks/v41/agreement.hpp"
#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward.hpp"
#include "unit-tests/v41_test_model.hpp"

namespace ced::v41 {
namespace {

using testing::prompt;
using testing::tiny_checkpoint;

// The shortest N in [1, n_max] whose prefill logits differ, bitwise, with the fault planted (0: none).
int64_t shortest_visible(V41Fault fault, int64_t n_max) {
  const V41Checkpoint& ck = tiny_checkpoint();
  const V41EngramHashing hashing = v41_checkpoint_hashing(ck.config);
  V41Model clean(ck.config, ck.weights, V41Regime::release), planted(ck.config, ck.weights, V41Regime::release);
  clean.set_captures(false);
  planted.set_captures(false);
  planted.set_fault(fault);
  const std::vector<int64_t> tokens = prompt(n_max, ck.config.vocab_size, 38);
  for (int64_t N = 1; N <= n_max; ++N) {
    const std::span<const int64_t> p(tokens.data(), static_cast<size_t>(N));
    if (clean.forward(p, hashing).logits != planted.forward(p, hashing).logits) return N;
  }
  return 0;
}

// The shortest prefill N in [1, n_max] after which one decode step's logits differ, bitwise (0: none).
int64_t shortest_visible_in_decode(V41Fault fault, int64_t n_max) {
  const V41Checkpoint& ck = tiny_checkpoint();
  const V41EngramHashing hashing = v41_checkpoint_hashing(ck.config);
  V41Model clean(ck.config, ck.weights, V41Regime::release), planted(ck.config, ck.weights, V41Regime::release);
  planted.set_fault(fault);
  const std::vector<int64_t> tokens = prompt(n_max + 1, ck.config.vocab_size, 39);
  for (int64_t N = 1; N <= n_max; ++N) {
    const std::span<const int64_t> p(tokens.data(), static_cast<size_t>(N));
    V41DecodeState a, b;
    clean.forward(p, hashing, &a);
    planted.forward(p, hashing, &b);
    const int64_t next = tokens[static_cast<size_t>(N)];
    if (clean.decode_step(next, hashing, a).logits != planted.decode_step(next, hashing, b).logits) return N;
  }
  return 0;
}

// 1Cat-vLLM's bug: a head's negative index score is kept. It cannot move a selection while no row has more
// groups than index_topk to choose among (every group is selected, whatever its score): no prompt shorter than
// index_topk + 1 groups of the finest index source shows it. From there it shows when the changed scores
// reorder the groups around the cut, which a prompt decides: on this one, one row later (N = 10 on v41-tiny).
TEST(V41PortBugs, IndexReluDroppedIsInvisibleUntilTheTopKChooses) {
  const V41Config& c = tiny_checkpoint().config;
  const V41Plan plan = make_v41_plan(c);
  int64_t expected = 0;
  for (const LayerPlan& lp : plan.layers)
    if (lp.owns_indexer) {
      const int64_t n = (c.index_topk + 1) * lp.ratio;
      if (expected == 0 || n < expected) expected = n;
    }
  const int64_t found = shortest_visible(V41Fault::index_relu_dropped, 3 * c.window_size);
  std::printf("index_topk %lld: visible from N = %lld (never before %lld)\n", (long long)c.index_topk,
              (long long)found, (long long)expected);
  EXPECT_GE(found, expected);
  EXPECT_LE(found, expected + c.window_size) << "the bug stayed hidden (0: on every length tried)";
  EXPECT_GT(found, 0);
}

// The MLX ports' bug: the ring the prefill hands to decode lacks its last row's entry once the prompt is longer
// than the window. The prefill itself is right, so only a decode step after a prompt of W + 1 shows it.
TEST(V41PortBugs, WindowRingDropsLastShowsInTheFirstDecodeStepAfterAPromptOfWPlus1) {
  const V41Config& c = tiny_checkpoint().config;
  EXPECT_EQ(shortest_visible(V41Fault::window_ring_drops_last, c.window_size + 2), 0);
  EXPECT_EQ(shortest_visible_in_decode(V41Fault::window_ring_drops_last, 2 * c.window_size), c.window_size + 1);
}

// 1Cat-vLLM's indexer-cache offsets: a decode step reads each group's index key one group late. Like any score
// change it moves no selection while the step's groups are no more than index_topk (all selected): no prompt
// shorter than index_topk × the finest ratio shows it in the step after it.
TEST(V41PortBugs, IndexCacheOffsetShowsInDecodeOnlyOnceTheTopKChooses) {
  const V41Config& c = tiny_checkpoint().config;
  const V41Plan plan = make_v41_plan(c);
  int64_t expected = 0;  // the prompt whose next step (position N) has index_topk + 1 groups
  for (const LayerPlan& lp : plan.layers)
    if (lp.owns_indexer) {
      const int64_t n = (c.index_topk + 1) * lp.ratio - 1;
      if (expected == 0 || n < expected) expected = n;
    }
  EXPECT_EQ(shortest_visible(V41Fault::index_cache_offset, c.window_size), 0) << "a prefill reads no cache";
  const int64_t found = shortest_visible_in_decode(V41Fault::index_cache_offset, 3 * c.window_size);
  std::printf("decode after N = %lld first shows it (never before %lld)\n", (long long)found, (long long)expected);
  EXPECT_GE(found, expected);
  EXPECT_LE(found, expected + c.window_size);
  EXPECT_GT(found, 0);
}

// The MLX ports' prefix-cache contamination: a cache keyed by the hit's length alone serves one request's
// cached groups to the next request with a hit of that length. One request alone never shows it (its own cache
// is the one served), nor a hit the rule does not adopt (vLLM's rule runs a hit shorter than W cold) or one too
// short to hold a whole group of a kv source: the shortest hit that shows it in the second request is the first
// the rule adopts with a group cached. Measured on v41-tiny with W rebuilt rows, per rule.
TEST(V41PortBugs, PrefixCacheKeyedByLengthShowsInTheSecondRequestFromTheFirstAdoptedGroup) {
  const V41Checkpoint& ck = tiny_checkpoint();
  const V41EngramHashing hashing = v41_checkpoint_hashing(ck.config);
  const V41Plan plan = make_v41_plan(ck.config);
  const int64_t N = 2 * ck.config.window_size, W = ck.config.window_size;
  const std::vector<int64_t> a = prompt(N, ck.config.vocab_size, 40), b = prompt(N, ck.config.vocab_size, 41);
  int64_t finest = 0;  // the smallest group a kv source caches
  for (const LayerPlan& lp : plan.layers)
    if (lp.owns_compressor && lp.ratio > 0) finest = finest ? std::min(finest, lp.ratio) : lp.ratio;
  auto last_rows = [](const std::vector<double>& cold, const std::vector<double>& resumed) {
    return std::vector<double>(cold.end() - static_cast<std::ptrdiff_t>(resumed.size()), cold.end()) == resumed;
  };
  for (const char* name : {"vllm", "sglang"}) {
    const V41EncoderReplayRule& rule = v41_encoder_replay_rule(name);
    int64_t expected = 0, first = 0;
    for (int64_t H = 1; H <= W && (expected == 0 || first == 0); ++H) {
      if (expected == 0 && v41_resume(plan, rule, H, W).hit >= finest) expected = H;
      if (first != 0) continue;
      V41Model planted(ck.config, ck.weights, V41Regime::release);
      planted.set_captures(false);
      planted.set_fault(V41Fault::prefix_cache_keyed_by_length);
      V41DecodeState ca, cb;
      const std::vector<double> cold_a = planted.forward(a, hashing, &ca).logits;
      const std::vector<double> cold_b = planted.forward(b, hashing, &cb).logits;
      const V41PrefixHit hit_a = planted.prefix_hit(ca, H), hit_b = planted.prefix_hit(cb, H);
      // The first request alone: its own cache served, its resume the cold run.
      ASSERT_TRUE(last_rows(cold_a, planted.forward_resume(a, hashing, hit_a, rule, W, N, nullptr).logits))
          << name << " H = " << H;
      if (!last_rows(cold_b, planted.forward_resume(b, hashing, hit_b, rule, W, N, nullptr).logits)) first = H;
    }
    std::printf("prefix-cache-keyed-by-length, rule %s: the second request's resume differs from its cold run from a "
                "hit of %lld (the first the rule adopts with a group of %lld cached: %lld)\n",
                name, (long long)first, (long long)finest, (long long)expected);
    EXPECT_EQ(first, expected) << name;
  }
}

// An Ascend fork's bug: the compressor was given no sequence lengths, and the model went wrong from exactly the
// prompt that completes a group (4 tokens, its ratio). A pooling compressor that pools nothing changes no logit
// until some row of a kv source with ratio > 1 sees a complete group: N = the smallest such ratio (2 on
// v41-tiny), derived from the plan and measured. A ratio-1 source is a plain linear with no pooling and keeps
// its rows.
TEST(V41PortBugs, CompressorWithoutLengthsShowsFromThePromptThatCompletesAGroup) {
  const V41Config& c = tiny_checkpoint().config;
  const V41Plan plan = make_v41_plan(c);
  int64_t expected = 0;
  for (const LayerPlan& lp : plan.layers)
    if (lp.owns_compressor && lp.ratio > 1) expected = expected ? std::min(expected, lp.ratio) : lp.ratio;
  ASSERT_GT(expected, 1);
  const int64_t found = shortest_visible(V41Fault::compressor_without_lengths, c.window_size);
  std::printf("compressor-without-lengths: visible from N = %lld (the smallest pooling ratio %lld)\n",
              (long long)found, (long long)expected);
  EXPECT_EQ(found, expected);
}

// vLLM's report: two router top-k kernels agree on random inputs and shift outputs in production. Two correct
// kernels can choose differently only where the biased scores tie exactly at the k-th place, which random weights
// never make: another tie order (lower expert first) moves no logit on any prompt up to 2W. A router that gives two
// experts the same row and bias ties them on every token; there the two orders choose different experts for some
// pair (the k-th chosen and one left out), the logits move, and the sound gate, judging the other order's run
// against torch's order's, admits it (both are correct), where a bitwise check would fail it.
TEST(V41PortBugs, RouterTieOrderMovesOnlyAnExactTieAndTheGateAdmitsEitherOrder) {
  const V41Checkpoint& ck = tiny_checkpoint();
  const V41Config& c = ck.config;
  EXPECT_EQ(shortest_visible(V41Fault::router_ties_lowest_index, 2 * c.window_size), 0) << "no exact tie, no change";
  const V41EngramHashing hashing = v41_checkpoint_hashing(c);
  const std::vector<int64_t> tokens = prompt(5, c.vocab_size, 42);
  const V41Model clean(c, ck.weights, V41Regime::release);
  const std::vector<int32_t> chosen = clean.forward(tokens, hashing).layers[0].experts;
  const int64_t E = c.n_routed_experts, K = c.n_activated_experts, D = c.dim;
  bool moved = false;
  for (int64_t j = 0; j < K && !moved; ++j) {
    const int64_t from = chosen[static_cast<size_t>(j)];  // one of token 0's experts, copied over one left out
    for (int64_t to = 0; to < E && !moved; ++to) {
      if (std::find(chosen.begin(), chosen.begin() + K, static_cast<int32_t>(to)) != chosen.begin() + K) continue;
      V41Checkpoint tied = ck;
      for (SafetensorsTensor& t : tied.weights.tensors) {
        const int64_t width = t.name == "layers.0.ffn.gate.weight" ? 2 * D : t.name == "layers.0.ffn.gate.bias" ? 4 : 0;
        if (width) std::memcpy(t.bytes.data() + to * width, t.bytes.data() + from * width, static_cast<size_t>(width));
      }
      V41Model torch_order(tied.config, tied.weights, V41Regime::release), other(tied.config, tied.weights, V41Regime::release);
      other.set_fault(V41Fault::router_ties_lowest_index);
      V41RunFile run;
      run.config = tied.config;
      run.regime = V41Regime::release;
      run.tokens = tokens;
      run.result = torch_order.forward(tokens, hashing);
      const V41ForwardResult theirs = other.forward(tokens, hashing);
      if (theirs.layers[0].experts == run.result.layers[0].experts) continue;  // the tie fell inside the top-k
      moved = true;
      std::printf("router rows %lld := %lld tied: the orders choose other experts at layer 0; logits %s\n",
                  (long long)to, (long long)from, theirs.logits == run.result.logits ? "equal" : "differ");
      EXPECT_NE(theirs.logits, run.result.logits);
      const V41Agreement judged = v41_agreement(other, run);
      const V41TensorAgreement* f = judged.first_failure();
      EXPECT_EQ(f, nullptr) << f->pass << " layer " << f->layer << " " << f->kind << ": " << f->failure;
      // The same verdict is not blind to the router: the untied router (its row `to` its own) fails it there.
      const V41Model untied(c, ck.weights, V41Regime::release);
      const V41Agreement untied_judged = v41_agreement(untied, run);
      const V41TensorAgreement* u = untied_judged.first_failure();
      ASSERT_NE(u, nullptr) << "the gate passed a router whose row differs";
      std::printf("the untied router: %s layer %lld %s\n", u->pass.c_str(), (long long)u->layer, u->kind.c_str());
      EXPECT_EQ(u->layer, 0);
      EXPECT_EQ(u->kind, "experts (forced x)");
    }
  }
  EXPECT_TRUE(moved) << "no tied pair moved a choice";
}

// Megatron-LM's and NeMo's bug: the Sinkhorn matrix is not symmetric, so one token shows it.
TEST(V41PortBugs, MhcCombTransposedMovesTheLogitsOfOneToken) {
  EXPECT_EQ(shortest_visible(V41Fault::mhc_comb_transposed, 4), 1);
}

// ATOM's bug (index_topk hard-coded below the model's): a row selects among the groups complete at it, so the
// cap changes nothing until some row of an index source has more groups than the cap.
TEST(V41PortBugs, IndexTopkCappedIsInvisibleUntilARowHasMoreGroupsThanTheCap) {
  const V41Config& c = tiny_checkpoint().config;
  const V41Plan plan = make_v41_plan(c);
  const int64_t cap = c.index_topk / 2;
  int64_t expected = 0;  // the first N whose last row has cap + 1 complete groups, over the index sources
  for (const LayerPlan& lp : plan.layers)
    if (lp.owns_indexer) {
      const int64_t n = (cap + 1) * lp.ratio;
      if (expected == 0 || n < expected) expected = n;
    }
  const int64_t found = shortest_visible(V41Fault::index_topk_capped, 3 * c.window_size);
  std::printf("index_topk %lld, cap %lld: visible from N = %lld (derived %lld)\n", (long long)c.index_topk,
              (long long)cap, (long long)found, (long long)expected);
  EXPECT_EQ(found, expected);
}

}  // namespace
}  // namespace ced::v41
