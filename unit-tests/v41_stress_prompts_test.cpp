// docs/v41.md §13.12: the CED properties on the prompts that make ties likely. Random prompts almost never tie,
// so the suite that passes on them says nothing of a tie's order; on a token repeated, two alternating, a period
// of the compress ratio or of the window, every replay, span, decode and resume property must hold bit for bit
// all the same (a tie is broken the same way on the same inputs), and a prompt of one token is its own replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "checks/v41_ced_checks.hpp"
#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/numerics.hpp"
#include "models/v41/stress_prompts.hpp"
#include "reference/v41/forward.hpp"
#include "unit-tests/v41_test_model.hpp"

using namespace ced;
using namespace ced::v41;
using namespace ced::v41::testing;

namespace {

constexpr int64_t kN = 100;  // past every span of v41-tiny (ascend's 91), a hit past the encoder span (45)

const V41Model& model() {
  static const V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
  return m;
}
const V41EngramHashing& hashing() {
  static const V41EngramHashing h = v41_checkpoint_hashing(tiny_checkpoint().config);
  return h;
}

// How many rows of a layer's selection have a tie at its boundary: the k-th and (k + 1)-th largest index scores
// equal, so the top-k's tie order decides what is picked.
int64_t boundary_ties(const V41LayerCapture& cap, int64_t N) {
  if (cap.index_score.empty() || cap.topk == 0) return 0;
  const int64_t cols = static_cast<int64_t>(cap.index_score.size()) / N;
  int64_t tied = 0;
  for (int64_t r = 0; r < N; ++r) {
    std::vector<double> s;
    for (int64_t g = 0; g < cols; ++g)
      if (const double x = cap.index_score[static_cast<size_t>(r * cols + g)]; std::isfinite(x)) s.push_back(x);
    if (static_cast<int64_t>(s.size()) <= cap.topk) continue;
    std::sort(s.begin(), s.end(), std::greater<>());
    tied += s[static_cast<size_t>(cap.topk - 1)] == s[static_cast<size_t>(cap.topk)];
  }
  return tied;
}

int64_t boundary_ties(const std::vector<int64_t>& tokens) {
  const V41ForwardResult r = model().forward(std::span(tokens).first(kN), hashing());
  int64_t tied = 0;
  for (const auto& cap : r.layers) tied += boundary_ties(cap, kN);
  return tied;
}

class StressPrompt : public ::testing::TestWithParam<std::string> {};

TEST_P(StressPrompt, EveryCedPropertyHoldsBitwise) {
  const V41Plan& p = model().plan();
  for (const V41StressPrompt& s : v41_stress_prompts(model().config(), p, kN + 1)) {
    if (s.name != GetParam()) continue;
    V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
    for (const V41Check& c : v41_ced_checks()) {
      const std::string why = c.run(m, hashing(), s.tokens);
      EXPECT_EQ(why, "") << s.name << " (" << s.why << "): " << c.name;
    }
    // What the prompt made tie, for the record, beside a random prompt's.
    std::printf("%s: %lld selection rows tied at the top-k's boundary over the layers (a random prompt: %lld)\n",
                s.name.c_str(), (long long)boundary_ties(s.tokens),
                (long long)boundary_ties(prompt(kN, model().config().vocab_size, 3)));
  }
}

INSTANTIATE_TEST_SUITE_P(V41Tiny, StressPrompt,
                         ::testing::Values("one-token", "two-alternating", "period-ratio", "period-window"),
                         [](const auto& i) {
                           std::string n = i.param;
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

TEST(StressPrompts, APromptOfOneTokenIsItsOwnReplayAndDecodesAsItsPrefill) {
  const std::vector<V41StressPrompt> all = v41_stress_prompts(model().config(), model().plan(), kN);
  const V41StressPrompt& single = all.back();
  ASSERT_EQ(single.name, "single");
  ASSERT_EQ(single.tokens.size(), 1u);
  for (const V41ReplayConvention& conv : v41_replay_conventions()) {
    V41DecodeState a, b;
    const V41ForwardResult full = model().forward(single.tokens, hashing(), &a);
    const V41ForwardResult ced = model().forward_ced(single.tokens, hashing(), 1, conv, &b);
    EXPECT_TRUE(same_bits(full.logits, ced.logits)) << conv.name;
    const V41ForwardResult sa = model().decode_step(single.tokens[0], hashing(), a);
    const V41ForwardResult sb = model().decode_step(single.tokens[0], hashing(), b);
    EXPECT_TRUE(same_bits(sa.logits, sb.logits)) << conv.name;
  }
}

TEST(StressPrompts, EachIsOfTheConfigsVocabularyAndLengthAndTheyDiffer) {
  const V41Config& c = model().config();
  const std::vector<V41StressPrompt> all = v41_stress_prompts(c, model().plan(), 40);
  ASSERT_EQ(all.size(), 5u);
  std::set<std::vector<int64_t>> distinct;
  for (const V41StressPrompt& s : all) {
    EXPECT_EQ(static_cast<int64_t>(s.tokens.size()), s.name == "single" ? 1 : 40) << s.name;
    for (int64_t t : s.tokens) EXPECT_TRUE(t >= 0 && t < c.vocab_size) << s.name;
    distinct.insert(s.tokens);
  }
  EXPECT_EQ(distinct.size(), all.size());
  EXPECT_THROW(v41_stress_prompts(c, model().plan(), 0), InputError);
}

}  // namespace
