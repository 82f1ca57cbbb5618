// docs/v41.md §14: the oracle of the release. The seed design's figures on v41-flash, the FLOP model's
// terms on v41-tiny against counts worked out by hand for one layer of each role (full and CED
// prefills), and the exact ratio's drift away from the ideal one's limit towards the one the N² index
// scores set.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include "models/v41/config.hpp"
#include "models/v41/plan.hpp"
#include "oracle/ced_split.hpp"
#include "oracle/v41_flops.hpp"
#include "oracle/v41_oracle.hpp"

namespace ced::v41 {
namespace {

using Terms = std::map<int, int64_t>;  // the terms a layer has; every other term must be 0

void expect_row(const V41FlopCount& f, int64_t l, const Terms& want) {
  for (int t = 0; t < kV41FlopTerms; ++t) {
    const auto it = want.find(t);
    EXPECT_EQ(f.rows[static_cast<size_t>(l)][static_cast<size_t>(t)], it == want.end() ? 0 : it->second)
        << "layer " << l << ", term " << v41_flop_term_name(t);
  }
}

V41FlopCount tiny_prefill(int64_t N, int64_t tail_start, bool floor_first_layer = true,
                          V41IndexScoring scoring = V41IndexScoring::Causal, bool all_layers = false) {
  const V41Config c = v41_builtin_config("v41-tiny");
  V41FlopQuery q;
  q.n_prompt = N;
  q.tail_start = tail_start;
  q.floor_first_layer = floor_first_layer;
  q.all_layers = all_layers;
  q.scoring = scoring;
  return v41_flop_model(c, make_v41_plan(c), q);
}

// v41-tiny, by hand: dim 256, hc 4 (24 mixes), Sinkhorn 20, heads 4 × 64, q / o rank 64, 2 groups,
// window 16, index heads 4 × 64, topk 8, candidate pool 3 blocks × 4, 8 experts (2 active) + 1 shared
// at 128, vocab 1024, Engram 3 n-gram sizes × 2 heads × 32.
// The block's terms on `n` rows (everything but attention and the compressed side).
Terms block(int64_t n) {
  return {{kV41HcMixes, n * 2 * (2 * 24 * 4 * 256)}, {kV41HcSinkhorn, n * 2 * (2 * 16 * 2 * 20)},
          {kV41HcCollapse, n * 2 * (2 * 4 * 256)},   {kV41HcExpand, n * 2 * (2 * 4 * 5 * 256)},
          {kV41WqA, n * 2 * 256 * 64},               {kV41WqB, n * 2 * 64 * 4 * 64},
          {kV41WindowKv, n * 2 * 256 * 64},          {kV41WoA, n * 2 * 4 * 64 * 64},
          {kV41WoB, n * 2 * 2 * 64 * 256},           {kV41Gate, n * 2 * 256 * 8},
          {kV41Experts, n * 2 * 3 * 256 * 128 * 3}};
}
Terms with(Terms t, const Terms& more) {
  for (const auto& [k, v] : more) t[k] = v;
  return t;
}
constexpr int64_t kEntry = 2 * 2 * 4 * 64;    // an attended entry: a score and a value row
constexpr int64_t kScore = 2 * 4 * (64 + 1);  // a scored entry: q·k per index head, the weighted sum

// N = 41 (odd: the ratio-2 sources leave one token waiting; past W and past the pool of 12).
// Window entries Σ_{p<41} min(p+1, 16) = 136 + 25·16 = 536.
// Ratio 2: visible Σ_{q=1}^{41} ⌊q/2⌋ = 420; selected Σ min(8, ⌊q/2⌋) = 56 + 26·8 = 264; 20 groups.
// Ratio 1: visible Σ q = 861; selected Σ min(8, q) = 36 + 33·8 = 300; pool Σ = 78 + 29·8 + 71 = 381
// (above 12 entries: 2 full blocks and the newest's ((q-1) mod 4) + 1).
TEST(V41Flops, EveryRoleOfV41TinyCostsItsHandCountInAFullPrefill) {
  const V41FlopCount f = tiny_prefill(41, 0);
  const Terms engram = {{kV41EngramWkv, 41 * 2 * 6 * 32 * 5 * 256}, {kV41EngramGate, 41 * 4 * 4 * 256}};
  const Terms indexer = {{kV41IndexerQ, 41 * 2 * 64 * 4 * 64}, {kV41IndexerWeights, 41 * 2 * 256 * 4}};
  // 0: SWA-only, Engram
  expect_row(f, 0, with(with(block(41), engram), {{kV41Attention, 536 * kEntry}}));
  // 1: ratio 2, Full: wkv and wgate on 41 tokens, the pooling of 20 groups of 2, 20 index keys
  expect_row(f, 1, with(with(block(41), indexer),
                        {{kV41Attention, (536 + 264) * kEntry},
                         {kV41Compressor, 41 * 2 * 2 * 256 * 64 + 40 * 2 * 64},
                         {kV41IndexKeys, 20 * 2 * 64 * 64},
                         {kV41IndexScores, 420 * kScore}}));
  // 2: ratio 2, Reuse of 1, Engram: layer 1's selection, nothing compressed or scored
  expect_row(f, 2, with(with(block(41), engram), {{kV41Attention, (536 + 264) * kEntry}}));
  // 3: ratio 1, Full, candidate source: a plain wkv per token, a key per token, every visible entry scored
  expect_row(f, 3, with(with(block(41), indexer),
                        {{kV41Attention, (536 + 300) * kEntry},
                         {kV41Compressor, 41 * 2 * 256 * 64},
                         {kV41IndexKeys, 41 * 2 * 64 * 64},
                         {kV41IndexScores, 861 * kScore}}));
  // 4: ratio 1, Reindex: scores only its candidate pool
  expect_row(f, 4, with(with(block(41), indexer), {{kV41Attention, (536 + 300) * kEntry}, {kV41IndexScores, 381 * kScore}}));
  // 5: ratio 1, Reuse of 4
  expect_row(f, 5, with(block(41), {{kV41Attention, (536 + 300) * kEntry}}));
  // the head's row: one collapse and the head, on the last row
  expect_row(f, 6, {{kV41FinalCollapse, 2 * 4 * 256}, {kV41Head, 2 * 256 * 1024}});
}

// The closed form against the rules read one position at a time, at the awkward sizes: N from 1 past
// the pool (12) and past topk, every first row, ratios 1 and 2, topk 8 (the pool's newest block never
// matters: 2 blocks already hold 8) and 11 (it adds up to 3 below topk).
TEST(V41Flops, TheClosedFormSumsAreTheRulesReadPositionByPosition) {
  V41Config c = v41_builtin_config("v41-tiny");
  for (int64_t topk : {8, 11}) {
    c.index_topk = topk;
    for (int64_t r : {1, 2})
      for (int64_t N = 1; N <= 60; ++N)
        for (int64_t first = 0; first < N; ++first) {
          V41CompressedSums want;
          for (int64_t p = first; p < N; ++p) {
            const int64_t vis = v41_visible(r, p), pool = v41_pool_size(c, vis);
            want.visible += vis;
            want.pool += pool;
            want.selected += std::min(topk, vis);
            want.selected_pool += std::min(topk, pool);
          }
          ASSERT_EQ(v41_compressed_sums(c, r, first, N), want)
              << "topk " << topk << ", ratio " << r << ", N " << N << ", first " << first;
        }
  }
}

// model.py's einsum: every query against all N / ratio entries (20 at ratio 2, 41 at ratio 1).
TEST(V41Flops, DenseScoresCountEveryQueryAgainstAllNOverRatioEntries) {
  const V41FlopCount f = tiny_prefill(41, 0, true, V41IndexScoring::Dense);
  EXPECT_EQ(f.rows[1][kV41IndexScores], 41 * 20 * kScore);
  EXPECT_EQ(f.rows[3][kV41IndexScores], 41 * 41 * kScore);
  EXPECT_EQ(f.rows[4][kV41IndexScores], 41 * 41 * kScore);
  EXPECT_EQ(f.rows[2][kV41IndexScores], 0);
}

// CED with B = 16 rows of 41: tail_start 25, E = 3. Tail window sums: floored at 25, Σ_{i=1}^{16} i = 136;
// layer E whole, Σ_{p=25}^{40} min(p+1, 16) = 256. Tail selected (ratio 1) 16·8 = 128; layer E's scores
// Σ_{q=26}^{41} q = 536; layer 4's pool Σ_{q=26}^{41} (8 + ((q-1) mod 4) + 1) = 128 + 40 = 168.
TEST(V41Flops, ACedPrefillOfV41TinyRunsLayerEsSourcesOnEveryRowAndTheDecoderOnTheTail) {
  const V41FlopCount full = tiny_prefill(41, 0);
  for (bool floored : {true, false}) {
    SCOPED_TRACE(floored ? "layer E floored (sglang, trtllm)" : "layer E whole (vllm)");
    const V41FlopCount f = tiny_prefill(41, 25, floored);
    // the encoder as in the full prefill
    EXPECT_EQ(f.rows[2], full.rows[2]);
    // layer E: its attention collapse, compressor and index keys on all 41 rows; the block on the tail
    expect_row(f, 3, with(block(16), {{kV41HcCollapse, (41 + 16) * 2 * 4 * 256},
                                      {kV41WindowKv, (floored ? 16 : 41) * 2 * 256 * 64},
                                      {kV41IndexerQ, 16 * 2 * 64 * 4 * 64},
                                      {kV41IndexerWeights, 16 * 2 * 256 * 4},
                                      {kV41Attention, ((floored ? 136 : 256) + 128) * kEntry},
                                      {kV41Compressor, 41 * 2 * 256 * 64},
                                      {kV41IndexKeys, 41 * 2 * 64 * 64},
                                      {kV41IndexScores, 536 * kScore}}));
    // a decoder layer above E: the tail only, its window floored
    expect_row(f, 4, with(block(16), {{kV41IndexerQ, 16 * 2 * 64 * 4 * 64},
                                      {kV41IndexerWeights, 16 * 2 * 256 * 4},
                                      {kV41Attention, (136 + 128) * kEntry},
                                      {kV41IndexScores, 168 * kScore}}));
    EXPECT_EQ(f.rows[6], full.rows[6]);
  }
}

TEST(V41Flops, TheAllLayersTailCostsItsPrefillSidePlusEveryLayerOnTheTail) {
  const V41Config c = v41_builtin_config("v41-tiny");
  const V41Plan plan = make_v41_plan(c);
  const V41RowCosts k = v41_row_costs(c);
  const int64_t N = 41, S = 25, R = N - S;
  const V41FlopCount full = tiny_prefill(N, 0), cut_at_e = tiny_prefill(N, S);
  const V41FlopCount all = tiny_prefill(N, S, true, V41IndexScoring::Causal, true);
  // Above E both tails are the same floored layers on the same rows.
  for (int64_t l = plan.E + 1; l <= plan.L; ++l)
    for (int t = 0; t < kV41FlopTerms; ++t)
      EXPECT_EQ(all.rows[size_t(l)][size_t(t)], cut_at_e.rows[size_t(l)][size_t(t)]) << l << " " << v41_flop_term_name(t);
  // Layer E: its FFN collapse on the tail and its attention collapse twice (the source write on every
  // row, the replay on the tail), where the cut at E collapses every row once.
  for (int t = 0; t < kV41FlopTerms; ++t)
    EXPECT_EQ(all.rows[size_t(plan.E)][size_t(t)] - cut_at_e.rows[size_t(plan.E)][size_t(t)],
              t == kV41HcCollapse ? R * k.hc_collapse : 0)
        << v41_flop_term_name(t);
  // Below E: every row on the prefill side and the tail's rows again, the sources written once.
  for (int64_t l = 0; l < plan.E; ++l) {
    const auto& a = all.rows[size_t(l)];
    const auto& f = full.rows[size_t(l)];
    EXPECT_EQ(a[kV41WqA], (N + R) * k.wq_a) << l;
    EXPECT_EQ(a[kV41Experts], (N + R) * k.experts) << l;
    EXPECT_EQ(a[kV41Compressor], f[kV41Compressor]) << l;
    EXPECT_EQ(a[kV41IndexKeys], f[kV41IndexKeys]) << l;
  }
  EXPECT_GT(all.total(), cut_at_e.total());
}

TEST(V41Oracle, TheReleasesSplitReproducesTheSeedDesignsFigures) {
  const V41OracleTable t = v41_oracle_table(v41_builtin_config("v41-flash"), {256, 32768, 1000000});
  EXPECT_EQ(t.split.L, 40);
  EXPECT_EQ(t.split.E, 20);
  EXPECT_EQ(t.split.D, 20);
  EXPECT_EQ(t.split.W, 128);
  const SeedFigures seed{.exact_replay = 2541, .report_upper = 2560, .exact_decode_replay = 2540,
                         .work_triangle = 24150, .work_rectangle = 50820, .work_bounded = 2560};
  EXPECT_TRUE(t.seed == seed) << format_seed_figures(t.seed);
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.rows[0].bounded_replay, 128);
  EXPECT_EQ(t.rows[0].ideal_ratio, 0.75);                    // (256·20 + 128·20)/(256·40), exact in binary
  EXPECT_EQ(t.rows[1].ideal_ratio, 0.5 + 128.0 / 65536.0);   // 1/2 + B/(2N), exact in binary
  EXPECT_EQ(oracle_percent(t.rows[0].ideal_ratio), "75.000 %");
  EXPECT_EQ(oracle_percent(t.rows[1].ideal_ratio), "50.195 %");
  EXPECT_EQ(oracle_percent(t.rows[2].ideal_ratio), "50.006 %");
}

TEST(V41Oracle, TheConventionsExactSpansAre2541WithLayerEFloored2414WithItWholeAnd5081OnTheAllLayersTail) {
  const V41OracleTable t = v41_oracle_table(v41_builtin_config("v41-flash"), {32768});
  std::map<std::string, int64_t> spans;
  for (const auto& c : t.conventions) spans[c.name] = c.exact_span;
  EXPECT_EQ(spans, (std::map<std::string, int64_t>{
                       {"sglang", 2541}, {"trtllm", 2541}, {"vllm", 2414}, {"atom", 2414}, {"ascend", 5081}}));
  for (const auto& c : t.conventions) {
    SCOPED_TRACE(c.name);
    // replaying the exact span costs more than the window, and keeping layer E whole costs its window keys
    EXPECT_GT(c.ratios[0].exact_replay_ratio, c.ratios[0].bounded_ratio);
    // the all-layers tail also pays its encoder layers on the tail
    if (c.floor_first_layer && !c.all_layers) EXPECT_EQ(c.ratios[0].bounded_ratio, t.rows[0].exact_ratio);
    else EXPECT_GT(c.ratios[0].bounded_ratio, t.rows[0].exact_ratio);
  }
}

// The ideal ratio tends to E/L = 1/2. The exact one does not: the encoder's index sources (ratio 2, at
// 2, 8, 14) score N²/4 entries each in both prefills, layer E's N²/2 only in the full one, so with
// causal scores it rises towards (3/2)/(3/2 + 1) = 60 %; with model.py's dense scores every index
// source's N·N/r counts and it falls towards (3/2)/(3/2 + 1 + 4) = 3/13.
TEST(V41Oracle, TheExactRatioLeavesTheIdealLimitForTheOneTheIndexScoresSet) {
  const V41OracleTable t = v41_oracle_table(v41_builtin_config("v41-flash"), {100000, 1000000, 10000000});
  EXPECT_EQ(t.limit_ideal, 0.5);
  EXPECT_DOUBLE_EQ(t.limit_causal, 0.6);
  EXPECT_DOUBLE_EQ(t.limit_dense, 3.0 / 13.0);
  for (size_t i = 0; i + 1 < t.rows.size(); ++i) {
    const auto &a = t.rows[i], &b = t.rows[i + 1];
    SCOPED_TRACE(b.n_prompt);
    EXPECT_LT(b.ideal_ratio, a.ideal_ratio);        // towards 1/2, from above
    EXPECT_GT(b.exact_ratio, a.exact_ratio);        // up, past the ideal
    EXPECT_LT(b.exact_ratio, t.limit_causal);       // and towards 60 % from below
    EXPECT_GT(b.exact_ratio, b.ideal_ratio);
    EXPECT_LT(b.exact_ratio_dense, a.exact_ratio_dense);  // down, towards 3/13 from above
    EXPECT_GT(b.exact_ratio_dense, t.limit_dense);
    EXPECT_GT(b.index_scores_of_full, a.index_scores_of_full);
  }
}

// Every term has its own name, the first and the last included, and a term out of range is "?".
TEST(V41Flops, EachTermIsNamedTheFirstAndTheLastIncluded) {
  EXPECT_STREQ(v41_flop_term_name(0), "hc_mixes");
  EXPECT_STREQ(v41_flop_term_name(kV41WqA), "wq_a");
  EXPECT_STREQ(v41_flop_term_name(kV41FlopTerms - 1), "head");
  EXPECT_STREQ(v41_flop_term_name(-1), "?");
  EXPECT_STREQ(v41_flop_term_name(kV41FlopTerms), "?");
}

// The oracle's table of ratios per convention has a line for every convention at every prompt length asked,
// the last length included (here the longer of two).
TEST(V41Oracle, TheConventionTableHasEveryConventionAtEveryLengthTheLastIncluded) {
  const V41OracleTable t = v41_oracle_table(v41_builtin_config("v41-tiny"), {100, 1000});
  const std::string s = format_v41_oracle_table(t);
  const size_t from = s.find("ced ratio per convention"), to = s.find("where the release departs");
  ASSERT_NE(from, std::string::npos) << s;
  ASSERT_NE(to, std::string::npos) << s;
  std::map<std::string, std::vector<std::string>> lengths;  // convention -> N of its lines, in order
  std::stringstream section(s.substr(from, to - from));
  std::string line;
  std::getline(section, line);  // the title
  std::getline(section, line);  // the heading
  while (std::getline(section, line)) {
    std::stringstream words(line);
    std::string n, name;
    words >> n >> name;
    lengths[name].push_back(n);
  }
  ASSERT_EQ(lengths.size(), t.conventions.size()) << s;
  for (const auto& c : t.conventions)
    EXPECT_EQ(lengths[c.name], (std::vector<std::string>{"100", "1000"})) << c.name << "\n" << s;
}

TEST(V41Oracle, AFlopCountThatLeavesInt64IsAnErrorNotAWrappedNumber) {
  EXPECT_THROW(v41_oracle_table(v41_builtin_config("v41-flash"), {1000000000}), std::overflow_error);
}

}  // namespace
}  // namespace ced::v41

// The release's KV cache as the seed counts it (docs/v41.md §14.5): v41-flash's four kv sources (three at
// ratio 2, one at ratio 1, each owning its index keys) make the seed's 2.5 copies of 40, (512 + 128)/2 · 3 +
// (512 + 128) = 1600 elements a token, 3200 bytes in bf16; its rings 40 · 128 · 512 values.
TEST(V41Oracle, TheReleasesCacheIsTwoAndAHalfCopiesAndSixteenHundredElementsAToken) {
  using namespace ced::v41;
  const V41OracleTable t = v41_oracle_table(v41_builtin_config("v41-flash"), {4096});
  EXPECT_EQ(t.cache.kv_sources, 4);
  EXPECT_EQ(t.cache.copies, 2.5);
  EXPECT_EQ(t.cache.n_layers, 40);
  EXPECT_EQ(t.cache.elements_per_token, 1600);
  EXPECT_EQ(t.cache.bytes_per_token_bf16, 3200);
  EXPECT_EQ(t.cache.window_elements, 40 * 128 * 512);
  EXPECT_NE(format_v41_oracle_table(t).find("copies Σ 1/ratio (of 40 per-layer; the seed's lab-flash: 2.5)"),
            std::string::npos);
  EXPECT_NE(v41_oracle_table_json(t).find("\"copies\": 2.5"), std::string::npos) << v41_oracle_table_json(t);
}
