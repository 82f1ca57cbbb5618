// docs/v41.md §8.8: v41 decode steps after a prefill. In f64 a prefill of P tokens and then one step per
// token computes the prefill of all of them (the ring holds the same window, the compressor's group the
// same tokens, the indexer the same keys), up to the rounding of sums taken in another order; with the
// official index-key pointer it does not, and each planted hand-off bug breaks it at its layer. The
// comparison with the official code's own decode is the golden gate's (v41_golden_test.cpp).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward.hpp"
#include "unit-tests/v41_test_model.hpp"

using namespace ced;
using namespace ced::v41;
using namespace ced::v41::testing;

namespace {

// Lowest-index ties: ReLU'd index scores tie at exactly 0, and torch's CPU top-k places ties by an
// algorithm that depends on the row's length, which is the prompt's in a prefill and the groups so far in
// a decode step; the lowest-index rule does not, so with it equal scores select alike.
V41Model tiny(V41Regime r, V41DecodeIndexK k = V41DecodeIndexK::owner, V41Fault f = V41Fault::none,
              V41TopkTies ties = V41TopkTies::lowest_index) {
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, r);
  V41Options o;
  o.topk_ties = ties;
  o.decode_index_k = k;
  m.set_options(o);
  m.set_fault(f);
  return m;
}

// The prefill of the first P tokens, then one decode step per remaining token.
struct Decoded {
  V41ForwardResult prefill;
  std::vector<V41ForwardResult> steps;
};
Decoded decode(const V41Model& m, const std::vector<int64_t>& tokens, int64_t P) {
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  Decoded d;
  V41DecodeState st;
  d.prefill = m.forward(std::span<const int64_t>(tokens).first(static_cast<size_t>(P)), h, &st);
  for (size_t i = static_cast<size_t>(P); i < tokens.size(); ++i) d.steps.push_back(m.decode_step(tokens[i], h, st));
  EXPECT_EQ(st.pos, static_cast<int64_t>(tokens.size()));
  return d;
}

// The largest |decode - prefill| over the decoded positions' logits, relative to the largest logit.
double logit_gap(const V41ForwardResult& full, const Decoded& d, int64_t P, int64_t V, int64_t* first_step = nullptr,
                 double above = 0) {
  double gap = 0, scale = 0;
  if (first_step) *first_step = -1;
  for (size_t s = 0; s < d.steps.size(); ++s)
    for (int64_t v = 0; v < V; ++v) {
      const double a = d.steps[s].logits[static_cast<size_t>(v)], b = full.logits[static_cast<size_t>((P + s) * V + v)];
      scale = std::max(scale, std::fabs(b));
      gap = std::max(gap, std::fabs(a - b));
      if (first_step && *first_step < 0 && std::fabs(a - b) > above) *first_step = static_cast<int64_t>(s);
    }
  return gap / scale;
}

// The first layer whose output at a decoded position differs from the prefill's by more than `tol`
// relative to its scale, -1 when none does.
int64_t first_layer_apart(const V41ForwardResult& full, const Decoded& d, int64_t P, int64_t row, double tol) {
  for (size_t l = 0; l < full.layers.size(); ++l) {
    double gap = 0, scale = 0;
    for (size_t s = 0; s < d.steps.size(); ++s)
      for (int64_t i = 0; i < row; ++i) {
        const double a = d.steps[s].layers[l].out[static_cast<size_t>(i)];
        const double b = full.layers[l].out[static_cast<size_t>((P + static_cast<int64_t>(s)) * row + i)];
        gap = std::max(gap, std::fabs(a - b));
        scale = std::max(scale, std::fabs(b));
      }
    if (gap > tol * scale) return static_cast<int64_t>(l);
  }
  return -1;
}

// The groups a row selects, without the offset and the -1s.
std::set<int64_t> groups(const std::vector<int32_t>& idx, int64_t row, int64_t k, int64_t offset) {
  std::set<int64_t> g;
  for (int64_t j = 0; j < k; ++j)
    if (idx[static_cast<size_t>(row * k + j)] >= 0) g.insert(idx[static_cast<size_t>(row * k + j)] - offset);
  return g;
}

// Prompt P = 13: odd (a ratio-2 group open across the hand-off), below the window 16; 17 steps wrap the
// ring and complete and open groups of both ratios.
constexpr int64_t kP = 13, kN = 30;
// f64 sums taken in other orders (sparse_attn's 64-blocks over a ring listed from its oldest slot, the
// indexer's keys in one product) differ by a few units of 2^-52 per layer; 1e-9 of the logits' scale
// leaves six orders of magnitude of margin, and any real difference (a wrong key, group or rotation) is
// of the order of the values themselves (the faults below: above 1e-3).
constexpr double kF64Rounding = 1e-9;

}  // namespace

TEST(V41Decode, StepsAfterAPrefillComputeThePrefillOfAllTokensInF64WithOwnerIndexKeys) {
  const V41Model m = tiny(V41Regime::f64);
  const V41Config& c = m.config();
  const auto tokens = prompt(kN, c.vocab_size, 1);
  const V41ForwardResult full = m.forward(tokens, v41_checkpoint_hashing(c));
  const Decoded d = decode(m, tokens, kP);
  int64_t fs = -1;
  EXPECT_LT(logit_gap(full, d, kP, c.vocab_size, &fs, 1e-9), kF64Rounding) << "first step " << fs;
  EXPECT_EQ(first_layer_apart(full, d, kP, c.hc_mult * c.dim, kF64Rounding), -1);
  int64_t compared = 0;
  for (size_t s = 0; s < d.steps.size(); ++s)
    for (const LayerPlan& lp : m.plan().layers) {
      const auto& dl = d.steps[s].layers[static_cast<size_t>(lp.layer)];
      const auto& fl = full.layers[static_cast<size_t>(lp.layer)];
      EXPECT_EQ(dl.experts, std::vector<int32_t>(fl.experts.begin() + (kP + s) * c.n_activated_experts,
                                                 fl.experts.begin() + (kP + s + 1) * c.n_activated_experts))
          << "step " << s << " layer " << lp.layer;
      if (!lp.owns_indexer || dl.topk == 0) continue;
      EXPECT_EQ(groups(dl.topk_idxs, 0, dl.topk, c.window_size), groups(fl.topk_idxs, kP + s, fl.topk, kN))
          << "step " << s << " layer " << lp.layer;
      ++compared;
    }
  EXPECT_GT(compared, 30);
}

TEST(V41Decode, OfficialIndexKeyPointerScoresAnOpenRatio2GroupAgainstAnotherLayersKeys) {
  // model.py republishes a ratio-2 owner's keys only on the steps that complete its group; on the others
  // its indexer reads the ratio-1 owner's keys of the step before, so the decode leaves the prefill.
  const V41Model owner = tiny(V41Regime::f64), official = tiny(V41Regime::f64, V41DecodeIndexK::official);
  const V41Config& c = owner.config();
  const auto tokens = prompt(kN, c.vocab_size, 2);
  const V41ForwardResult full = owner.forward(tokens, v41_checkpoint_hashing(c));
  int64_t step = -1;
  EXPECT_GT(logit_gap(full, decode(official, tokens, kP), kP, c.vocab_size, &step, 1e-6), 1e-3);
  // Only a step with an open group reads the other keys, and only once more groups exist than index_topk
  // (8) can other keys select differently: position 18 (9 groups) is the first such, step 5.
  EXPECT_GE(step, 5);
  EXPECT_EQ((kP + step + 1) % 2, 1) << "step " << step << " completes its group: the pointer is the owner's";
  EXPECT_EQ(first_layer_apart(full, decode(official, tokens, kP), kP, c.hc_mult * c.dim, kF64Rounding), 1);
  EXPECT_LT(logit_gap(full, decode(owner, tokens, kP), kP, c.vocab_size), kF64Rounding);
}

TEST(V41Decode, EachPlantedHandOffBugLeavesThePrefillAtTheFirstRatio2Layer) {
  for (V41Fault f : {V41Fault::decode_group_rope_at_step, V41Fault::decode_fresh_compressor}) {
    const V41Model m = tiny(V41Regime::f64, V41DecodeIndexK::owner, f);
    const V41Model clean = tiny(V41Regime::f64);
    const V41Config& c = m.config();
    const auto tokens = prompt(kN, c.vocab_size, 3);
    const V41ForwardResult full = clean.forward(tokens, v41_checkpoint_hashing(c));
    const Decoded d = decode(m, tokens, kP);
    const char* name = v41_fault_names()[static_cast<size_t>(f)].c_str();
    EXPECT_GT(logit_gap(full, d, kP, c.vocab_size), 1e-3) << name;
    EXPECT_EQ(first_layer_apart(full, d, kP, c.hc_mult * c.dim, kF64Rounding), 1) << name;  // the ratio-2 source
  }
}

TEST(V41Decode, IsBitwiseTheSameOnEveryRunAndThreadCount) {
  const int saved = omp_get_max_threads();
  for (V41Regime r : {V41Regime::bf16, V41Regime::release}) {
    const V41Model m = tiny(r, V41DecodeIndexK::official, V41Fault::none, V41TopkTies::torch);
    const auto tokens = prompt(kN, m.config().vocab_size, 4);
    std::vector<Decoded> runs;
    for (int threads : {1, 3, 1}) {
      omp_set_num_threads(threads);
      runs.push_back(decode(m, tokens, kP));
    }
    omp_set_num_threads(saved);
    for (size_t i = 1; i < runs.size(); ++i)
      for (size_t s = 0; s < runs[0].steps.size(); ++s) {
        EXPECT_EQ(runs[i].steps[s].logits, runs[0].steps[s].logits) << v41_regime_name(r) << " run " << i << " step " << s;
        for (size_t l = 0; l < runs[0].steps[s].layers.size(); ++l)
          EXPECT_EQ(runs[i].steps[s].layers[l].out, runs[0].steps[s].layers[l].out) << "step " << s << " layer " << l;
      }
  }
}

TEST(V41Decode, RefusesAStateNoPrefillSeededAndATokenOutsideTheVocabulary) {
  const V41Model m = tiny(V41Regime::bf16);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  V41DecodeState empty;
  EXPECT_THROW(m.decode_step(1, h, empty), InputError);
  V41DecodeState st;
  m.forward(prompt(5, m.config().vocab_size, 5), h, &st);
  EXPECT_THROW(m.decode_step(m.config().vocab_size, h, st), InputError);
  EXPECT_EQ(st.pos, 5);  // a refused step leaves the state as it was
  EXPECT_EQ(st.tokens.size(), 5u);
  EXPECT_NO_THROW(m.decode_step(0, h, st));
}
