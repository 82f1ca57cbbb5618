// docs/spec.md §7: the analytic oracle. The seed figures of lab-flash, FLOP counts of
// the tiny config worked out by hand, the closed form against the
// position-by-position reading of the same rules, and the ratio formulas.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "models/lab/config.hpp"
#include "model/error.hpp"
#include "models/lab/plan.hpp"
#include "oracle/analytic.hpp"

namespace ced {
namespace {

using Row = std::array<int64_t, kFlopKinds>;

// A per-layer row in FlopKind order, named so the hand counts read as a table.
Row row(int64_t query, int64_t local_entry, int64_t compressor, int64_t index_keys, int64_t indexer_qw,
        int64_t index_scoring, int64_t attention, int64_t output, int64_t router, int64_t experts) {
  Row r{};
  r[kFlopQuery] = query;
  r[kFlopLocalEntry] = local_entry;
  r[kFlopCompressor] = compressor;
  r[kFlopIndexKeys] = index_keys;
  r[kFlopIndexerQW] = indexer_qw;
  r[kFlopIndexScoring] = index_scoring;
  r[kFlopAttention] = attention;
  r[kFlopOutput] = output;
  r[kFlopRouter] = router;
  r[kFlopExperts] = experts;
  return r;
}
Row lm_row(int64_t lm_head) {
  Row r{};
  r[kFlopLmHead] = lm_head;
  return r;
}

FlopQuery full_query(int64_t N, LogitsScope logits = LogitsScope::All, int64_t decode = 0) {
  FlopQuery q;
  q.mode = Mode::Full;
  q.n_prompt = N;
  q.logits = logits;
  q.decode_steps = decode;
  return q;
}
FlopQuery ced_query(int64_t N, const std::string& replay, LogitsScope logits = LogitsScope::All, int64_t decode = 0) {
  FlopQuery q = full_query(N, logits, decode);
  q.mode = Mode::Ced;
  q.replay = ReplayPolicy::parse(replay);
  return q;
}
FlopQuery resume_query(int64_t N, int64_t P, const std::string& replay, LogitsScope logits = LogitsScope::All,
                       int64_t decode = 0) {
  FlopQuery q = ced_query(N, replay, logits, decode);
  q.mode = Mode::Resume;
  q.prefix_len = P;
  return q;
}

// Checks both implementations of the model against the expected rows.
void expect_counts(const Config& c, const FlopQuery& q, const std::vector<Row>& expected) {
  const Plan plan = make_plan(c);
  for (const FlopCount& f : {flop_model(c, plan, q), flop_model_by_position(c, plan, q)}) {
    ASSERT_EQ(f.per_layer.size(), expected.size());
    for (size_t l = 0; l < expected.size(); ++l)
      for (int k = 0; k < kFlopKinds; ++k)
        EXPECT_EQ(f.per_layer[l][size_t(k)], expected[l][size_t(k)])
            << "row " << l << " (" << (l + 1 == expected.size() ? "lm_head" : "layer") << "), " << flop_kind_name(k)
            << "\n"
            << format_flop_count(f);
  }
}

// ---- tiny, by hand ----------------------------------------------------------------
// tiny: V = 97, d = 32, L = 8, E = 4, H = 4, hd = 16, q_lora = 16, W = 4,
// ratios {0,2,2,2,1,1,1,1}, kv sources {1,4}, index sources {1,2,4,6},
// ih = 2, ihd = 8, topk = 3, candidate source 4 (bs = 2, 3 blocks),
// o_groups = 2, o_lora = 8, 4 routed experts (2 active), 1 shared, moe_dim = 16.
// Layer roles: 0 SWA-only; 1 Full r2; 2 Reindex r2; 3 Reuse r2; 4 Full r1 and
// candidate source; 5 Reuse; 6 Reindex in the pool; 7 Reuse.
constexpr int64_t kQ = 2 * (32 * 16 + 16 * 4 * 16);    // 3072 per position
constexpr int64_t kLE = 2 * 32 * 16;                   // 1024
constexpr int64_t kA = 2 * 2 * 4 * 16;                 // 256 per entry
constexpr int64_t kO = 2 * (4 * 16 * 8 + 2 * 8 * 32);  // 2048
constexpr int64_t kRT = 2 * 32 * 4;                    // 256
constexpr int64_t kX = 2 * 3 * 32 * 16 * (2 + 1);      // 9216
constexpr int64_t kIQ = 2 * (16 * 2 * 8 + 32 * 2);     // 640
constexpr int64_t kSC = 2 * 2 * 8;                     // 32 per scored entry
constexpr int64_t kC2 = 2 * 2 * 32 * 16;               // 2048 per token, r = 2
constexpr int64_t kC1 = 2 * 32 * 16;                   // 1024 per token, r = 1
constexpr int64_t kIK = 2 * 16 * 8;                    // 256 per completed entry
constexpr int64_t kLM = 2 * 32 * 97;                   // 6208 per logits row

TEST(AnalyticFlops, TinyPerPositionCostsMatchHandCounts) {
  const Config c = builtin_config("tiny");
  EXPECT_EQ(flops_query(c), kQ);
  EXPECT_EQ(flops_local_entry(c), kLE);
  EXPECT_EQ(flops_attention(c, 1), kA);
  EXPECT_EQ(flops_output(c), kO);
  EXPECT_EQ(flops_router(c), kRT);
  EXPECT_EQ(flops_experts(c), kX);
  EXPECT_EQ(flops_indexer_qw(c), kIQ);
  EXPECT_EQ(flops_index_scoring(c, 1), kSC);
  EXPECT_EQ(flops_compressor_token(c, 2), kC2);
  EXPECT_EQ(flops_compressor_token(c, 1), kC1);
  EXPECT_EQ(flops_index_key(c), kIK);
  EXPECT_EQ(flops_lm_head(c), kLM);
}

TEST(AnalyticFlops, TinyFullPrefillOfOnePositionMatchesHandCount) {
  // p = 0: one local entry; r = 2 sees no entry yet, r = 1 sees entry 0.
  std::vector<Row> e = {
      row(kQ, kLE, 0, 0, 0, 0, kA * 1, kO, kRT, kX),              // 0 SWA-only
      row(kQ, kLE, kC2, 0, kIQ, 0, kA * 1, kO, kRT, kX),          // 1 Full r2: token 0, no block complete
      row(kQ, kLE, 0, 0, kIQ, 0, kA * 1, kO, kRT, kX),            // 2 Reindex r2
      row(kQ, kLE, 0, 0, 0, 0, kA * 1, kO, kRT, kX),              // 3 Reuse r2
      row(kQ, kLE, kC1, kIK, kIQ, kSC * 1, kA * 2, kO, kRT, kX),  // 4 Full r1: entry 0 completes, selected
      row(kQ, kLE, 0, 0, 0, 0, kA * 2, kO, kRT, kX),              // 5 Reuse
      row(kQ, kLE, 0, 0, kIQ, kSC * 1, kA * 2, kO, kRT, kX),      // 6 Reindex in the pool
      row(kQ, kLE, 0, 0, 0, 0, kA * 2, kO, kRT, kX),              // 7 Reuse
      lm_row(kLM)};
  expect_counts(builtin_config("tiny"), full_query(1), e);
  // ced with any replay covers the one position: the same work.
  expect_counts(builtin_config("tiny"), ced_query(1, "bounded"), e);
  const Plan plan = make_plan(builtin_config("tiny"));
  EXPECT_EQ(flop_model(builtin_config("tiny"), plan, full_query(1)).total(), 140160);
}

TEST(AnalyticFlops, TinyFullPrefillAtTheWindowMatchesHandCount) {
  // N = W = 4, p = 0..3: local 1+2+3+4 = 10; r = 2 visible 0,1,1,2 = 4 (all
  // selected, topk 3); r = 1 visible 1..4 = 10, selected 1,2,3,3 = 9.
  const int64_t n = 4;
  std::vector<Row> e = {
      row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 10, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, n * kC2, 2 * kIK, n * kIQ, kSC * 4, kA * 14, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, 0, 0, n * kIQ, kSC * 4, kA * 14, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 14, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, n * kC1, 4 * kIK, n * kIQ, kSC * 10, kA * 19, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 19, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, 0, 0, n * kIQ, kSC * 10, kA * 19, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 19, n * kO, n * kRT, n * kX),
      lm_row(4 * kLM)};
  expect_counts(builtin_config("tiny"), full_query(4), e);
}

TEST(AnalyticFlops, TinyCedPrefillAtWindowPlusOneMatchesHandCount) {
  // N = W + 1 = 5, bounded: B = 4, s = 1. Encoder at 0..4: local 1+2+3+4+4 =
  // 14; r = 2 visible 0,1,1,2,2 = 6. Decoder at 1..4, lo(p) = max(1, p-3):
  // local 1+2+3+4 = 10; visible 2,3,4,5 = 14, selected 2,3,3,3 = 11. Layer 4's
  // compressor covers all 5 tokens (source-only write). Logits at 1..4.
  const int64_t ne = 5, nd = 4;
  std::vector<Row> e = {
      row(ne * kQ, ne * kLE, 0, 0, 0, 0, kA * 14, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 5 * kC2, 2 * kIK, ne * kIQ, kSC * 6, kA * 20, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 0, 0, ne * kIQ, kSC * 6, kA * 20, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 0, 0, 0, 0, kA * 20, ne * kO, ne * kRT, ne * kX),
      row(nd * kQ, nd * kLE, 5 * kC1, 5 * kIK, nd * kIQ, kSC * 14, kA * 21, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 21, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, nd * kIQ, kSC * 14, kA * 21, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 21, nd * kO, nd * kRT, nd * kX),
      lm_row(4 * kLM)};
  expect_counts(builtin_config("tiny"), ced_query(5, "bounded"), e);
}

TEST(AnalyticFlops, TinyCandidatePoolTruncatesScoringAtLaterIndexSources) {
  // N = 8. A query that sees n_vis > kb·bs = 6 entries has nb = 4 > 3 blocks:
  // its pool is 2 full blocks plus the newest, (3-1)·2 + (n_vis - 3·2).
  // Full mode, r = 1, p = 0..7: visible 1..8 = 36 (scored at the candidate
  // source 4); pool 1,2,3,4,5,6,5,6 = 32 (scored at layer 6); selected
  // 1,2,3,3,3,3,3,3 = 21; local 1+2+3+4·5 = 26. r = 2: visible
  // 0,1,1,2,2,3,3,4 = 16, selected 15.
  const int64_t n = 8;
  std::vector<Row> full = {
      row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 26, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, n * kC2, 4 * kIK, n * kIQ, kSC * 16, kA * 41, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, 0, 0, n * kIQ, kSC * 16, kA * 41, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 41, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, n * kC1, 8 * kIK, n * kIQ, kSC * 36, kA * 47, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 47, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, 0, 0, n * kIQ, kSC * 32, kA * 47, n * kO, n * kRT, n * kX),
      row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 47, n * kO, n * kRT, n * kX),
      lm_row(kLM)};  // last position only
  expect_counts(builtin_config("tiny"), full_query(8, LogitsScope::Last), full);

  // ced bounded: s = 4, decoder at 4..7: local 10; visible 5..8 = 26; pool
  // 5,6,5,6 = 22; selected 3·4 = 12.
  const int64_t nd = 4;
  std::vector<Row> ced = full;
  ced[4] = row(nd * kQ, nd * kLE, n * kC1, 8 * kIK, nd * kIQ, kSC * 26, kA * 22, nd * kO, nd * kRT, nd * kX);
  ced[5] = row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 22, nd * kO, nd * kRT, nd * kX);
  ced[6] = row(nd * kQ, nd * kLE, 0, 0, nd * kIQ, kSC * 22, kA * 22, nd * kO, nd * kRT, nd * kX);
  ced[7] = ced[5];
  expect_counts(builtin_config("tiny"), ced_query(8, "bounded", LogitsScope::Last), ced);
  const Config c = builtin_config("tiny");
  EXPECT_EQ(pool_size(c, 6), 6);
  EXPECT_EQ(pool_size(c, 7), 5);
  EXPECT_EQ(pool_size(c, 8), 6);
  EXPECT_EQ(pool_size(c, 9), 5);
}

TEST(AnalyticFlops, TinyResumeCountsOnlyNewTokensInTheCompressor) {
  // N = 8, P = 6 > W: s_r = 2, decoder s = max(8-4, 2) = 4. Encoder at 2..7,
  // lo(p) = max(2, p-3): local 1,2,3,4,4,4 = 18; r = 2 visible 1,2,2,3,3,4 =
  // 15, selected 14. Kv sources consume tokens 6, 7 only: layer 1 completes
  // block 3 (tokens 6, 7), layer 4 entries 6 and 7. Decoder as in ced.
  const int64_t ne = 6, nd = 4;
  std::vector<Row> e = {
      row(ne * kQ, ne * kLE, 0, 0, 0, 0, kA * 18, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 2 * kC2, 1 * kIK, ne * kIQ, kSC * 15, kA * 32, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 0, 0, ne * kIQ, kSC * 15, kA * 32, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 0, 0, 0, 0, kA * 32, ne * kO, ne * kRT, ne * kX),
      row(nd * kQ, nd * kLE, 2 * kC1, 2 * kIK, nd * kIQ, kSC * 26, kA * 22, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 22, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, nd * kIQ, kSC * 22, kA * 22, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 22, nd * kO, nd * kRT, nd * kX),
      lm_row(4 * kLM)};  // logits at s..N-1 = 4..7
  expect_counts(builtin_config("tiny"), resume_query(8, 6, "bounded"), e);
}

TEST(AnalyticFlops, TinyDecodeStepsExtendEveryLayerAndProduceTheirLogits) {
  // ced N = 5 bounded (s = 1), 2 decode steps (positions 5, 6), prefill
  // logits last only. Decoder at 1..6: local 1,2,3,4,4,4 = 18; visible 2..7 =
  // 27; selected 2,3,3,3,3,3 = 17; pool 2,3,4,5,6,5 = 25. Encoder at 0..6:
  // local 1+2+3+4·4 = 22, r = 2 visible 0,1,1,2,2,3,3 = 12, selected 12.
  // Compressors consume tokens 0..6. Logits: position 4, 5, 6.
  const int64_t ne = 7, nd = 6;
  std::vector<Row> e = {
      row(ne * kQ, ne * kLE, 0, 0, 0, 0, kA * 22, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 7 * kC2, 3 * kIK, ne * kIQ, kSC * 12, kA * 34, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 0, 0, ne * kIQ, kSC * 12, kA * 34, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 0, 0, 0, 0, kA * 34, ne * kO, ne * kRT, ne * kX),
      row(nd * kQ, nd * kLE, 7 * kC1, 7 * kIK, nd * kIQ, kSC * 27, kA * 35, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 35, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, nd * kIQ, kSC * 25, kA * 35, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 35, nd * kO, nd * kRT, nd * kX),
      lm_row(3 * kLM)};
  expect_counts(builtin_config("tiny"), ced_query(5, "bounded", LogitsScope::Last, 2), e);
}

// ---- closed form vs the rules read position by position ---------------------------

// Variants of the built-ins that move each term of the model to an edge.
std::vector<Config> model_configs() {
  std::vector<Config> out = {builtin_config("tiny"), builtin_config("small")};
  Config c = builtin_config("tiny");
  c.name = "tiny-no-pool";
  c.candidate_source_layer = -1;
  out.push_back(c);
  c = builtin_config("tiny");
  c.name = "tiny-one-pool-block-big-topk";  // the pool is the newest block; topk never caps it
  c.candidate_topk_blocks = 1;
  c.candidate_block_size = 3;
  c.index_topk = 50;
  out.push_back(c);
  c = builtin_config("tiny");
  c.name = "tiny-topk-inside-the-sawtooth";  // min(topk, pool) cuts the pool's sawtooth
  c.candidate_topk_blocks = 2;
  c.candidate_block_size = 4;
  c.index_topk = 6;
  out.push_back(c);
  c = builtin_config("tiny");
  c.name = "tiny-ratio-3-window-1-dense";
  c.compress_ratios = {0, 3, 3, 3, 1, 1, 1, 1};
  c.window = 1;
  c.n_routed_experts = 0;
  c.n_active_experts = 0;
  c.n_shared_experts = 2;
  out.push_back(c);
  c = builtin_config("tiny");
  c.name = "tiny-E5";  // E != D
  c.n_encoder_layers = 5;
  c.compress_ratios = {0, 2, 2, 2, 2, 1, 1, 1};
  c.kv_source_layers = {1, 5};
  c.index_source_layers = {1, 2, 5, 6};
  c.candidate_source_layer = 5;
  out.push_back(c);
  c = builtin_config("tiny");
  c.name = "tiny-tied-two-decoder-sources";
  c.kv_source_layers = {1, 4, 6};
  c.tie_decoder_kv = true;
  out.push_back(c);
  for (const auto& x : out) validate(x);
  return out;
}

TEST(AnalyticFlops, ClosedFormEqualsThePositionByPositionCount) {
  std::vector<FlopQuery> queries;
  for (int64_t N : {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 31, 40}) {
    for (int64_t K : {0, 1, 3}) {
      for (LogitsScope ls : {LogitsScope::All, LogitsScope::Last}) {
        queries.push_back(full_query(N, ls, K));
        for (const char* r : {"bounded", "exact", "full", "1", "2", "7"}) queries.push_back(ced_query(N, r, ls, K));
        for (int64_t P : {int64_t(0), int64_t(1), N / 2, N - 1, N}) {
          if (P < 0) continue;
          for (const char* r : {"bounded", "exact", "3"}) {
            queries.push_back(resume_query(N, P, r, ls, K));
            FlopQuery q = resume_query(N, P, r, ls, K);
            q.resume_replay = 2;  // `ced spans` sweeps the encoder replay length
            queries.push_back(q);
          }
        }
      }
    }
  }
  for (const Config& c : model_configs()) {
    const Plan plan = make_plan(c);
    for (const FlopQuery& q : queries) {
      const FlopCount a = flop_model(c, plan, q), b = flop_model_by_position(c, plan, q);
      ASSERT_EQ(a.per_layer, b.per_layer) << c.name << " mode " << mode_name(q.mode) << " N " << q.n_prompt
                                          << " replay " << q.replay.str() << " P " << q.prefix_len << " K "
                                          << q.decode_steps << "\nclosed form:\n"
                                          << format_flop_count(a) << "by position:\n"
                                          << format_flop_count(b);
    }
  }
  // The v41 schedule past its window and past its pool (16 blocks of 8).
  const Config v = builtin_config("v41-shape");
  const Plan vp = make_plan(v);
  for (int64_t N : {127, 128, 129, 300, 641}) {
    for (const FlopQuery& q : {full_query(N), ced_query(N, "bounded", LogitsScope::Last, 2),
                               resume_query(N, N / 2, "bounded")})
      ASSERT_EQ(flop_model(v, vp, q).per_layer, flop_model_by_position(v, vp, q).per_layer) << "v41-shape N " << N;
  }
}

TEST(AnalyticFlops, CedWithFullReplayCostsTheSameAsFull) {
  for (const Config& c : model_configs()) {
    const Plan plan = make_plan(c);
    for (int64_t N : {1, 6, 17})
      EXPECT_EQ(flop_model(c, plan, ced_query(N, "full", LogitsScope::All, 2)).per_layer,
                flop_model(c, plan, full_query(N, LogitsScope::All, 2)).per_layer)
          << c.name << " N " << N;
  }
}

TEST(AnalyticFlops, ResumeFromAnEmptyPrefixCostsTheSameAsCed) {
  for (const Config& c : model_configs()) {
    const Plan plan = make_plan(c);
    for (int64_t N : {1, 6, 17})
      EXPECT_EQ(flop_model(c, plan, resume_query(N, 0, "bounded", LogitsScope::All, 1)).per_layer,
                flop_model(c, plan, ced_query(N, "bounded", LogitsScope::All, 1)).per_layer)
          << c.name << " N " << N;
  }
}

TEST(AnalyticFlops, BadQueriesAreInputErrors) {
  const Config c = builtin_config("tiny");
  const Plan plan = make_plan(c);
  EXPECT_THROW(flop_model(c, plan, full_query(0)), InputError);
  EXPECT_THROW(flop_model(c, plan, full_query(4, LogitsScope::All, -1)), InputError);
  FlopQuery no_policy = ced_query(4, "bounded");
  no_policy.replay = ReplayPolicy{};
  EXPECT_THROW(flop_model(c, plan, no_policy), InputError);
  EXPECT_THROW(flop_model(c, plan, resume_query(4, 5, "bounded")), InputError);
  FlopQuery prefix_in_ced = ced_query(4, "bounded");
  prefix_in_ced.prefix_len = 2;
  EXPECT_THROW(flop_model(c, plan, prefix_in_ced), InputError);
}

// ---- the §7 table ---------------------------------------------------------------------

TEST(AnalyticTable, V41FlashSeedFiguresAreReproduced) {
  const Config c = builtin_config("lab-flash");
  const OracleTable t = oracle_table(c, {256, 32768, 1000000}, 4096);
  EXPECT_EQ(t.seed.exact_replay, 2541);
  EXPECT_EQ(t.seed.report_upper, 2560);
  EXPECT_EQ(t.seed.exact_decode_replay, 2540);
  EXPECT_EQ(t.seed.work_triangle, 24150);
  EXPECT_EQ(t.seed.work_rectangle, 50820);
  EXPECT_EQ(t.seed.work_bounded, 2560);
  EXPECT_EQ(t.cache_copies, 2.5);  // 3 × 1/2 + 1: exact in binary
  EXPECT_EQ(t.cache_elements_per_token, 1600.0);  // (512 + 128) · 2.5
  EXPECT_EQ(t.cache_bytes_per_token_bf16, 3200.0);
  EXPECT_EQ(t.cache_bytes_per_token_f32, 6400.0);
  EXPECT_EQ(t.local_entries_elements, 40 * 128 * 512);
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.rows[0].bounded_replay, 128);
  // Ideal ratios: 1/2 + 128/512 = 0.75; 1/2 + 128/65536; 1/2 + 128/2e6 (exact in double to an ulp).
  EXPECT_DOUBLE_EQ(t.rows[0].ideal_ratio, 0.75);
  EXPECT_DOUBLE_EQ(t.rows[1].ideal_ratio, 0.5 + 128.0 / 65536.0);
  EXPECT_DOUBLE_EQ(t.rows[2].ideal_ratio, 0.5 + 128.0 / 2e6);
  for (const auto& r : t.rows) {
    EXPECT_GT(r.ced_flops, 0);
    EXPECT_LT(r.ced_flops, r.full_flops);
  }
  ASSERT_EQ(t.cone.size(), 20u);
  EXPECT_EQ(t.cone.front().min_replay, 128);  // layer E: 1 + (W-1)
  EXPECT_EQ(t.cone.back().min_replay, 2541);  // the last layer needs R
  ASSERT_TRUE(t.spans);
  EXPECT_EQ(t.spans->bounded_span, 128);
  EXPECT_EQ(t.spans->bounded_work, 2560);
  EXPECT_EQ(t.spans->exact_local_span, 2540);
  EXPECT_EQ(t.spans->exact_hidden_span, 2541);

  const std::string text = format_oracle_table(t);
  for (const char* figure : {"2541", "2560", "2540", "24150", "50820", "75.000 %", "50.195 %", "50.006 %", "2.5"})
    EXPECT_NE(text.find(figure), std::string::npos) << figure << " missing from\n" << text;
  const std::string json = oracle_table_json(t);
  for (const char* figure : {"\"exact_replay\": 2541", "\"report_upper\": 2560", "\"exact_decode_replay\": 2540",
                             "\"work_triangle\": 24150", "\"work_rectangle\": 50820", "\"work_bounded\": 2560",
                             "\"cache_copies\": 2.5", "\"ideal_ratio\": 0.75,"})
    EXPECT_NE(json.find(figure), std::string::npos) << figure << " missing from\n" << json;
}

TEST(AnalyticTable, EncoderReplayOfAPrefixShorterThanTheWindowIsThePrefix) {
  // tiny: E = 4, W = 4. docs/spec.md §6.2: a resume from a prefix P starts the encoder at
  // s_r = max(0, P - W), so the cached positions it evaluates again are s_r..P-1, P - s_r =
  // min(P, W) of them, at each of the E encoder layers. For P < W that is the whole prefix:
  //   P = 3 = W - 1: s_r = 0, span 3, work 12;  P = 1: span 1, work 4;
  //   P = 0: nothing is cached, span 0, work 0;
  // and from P = W on the window caps it: P = 4: span 4, work 16; P = 5: s_r = 1, span 4, work 16.
  // The exact rebuild does not depend on P: E(W-1) = 12 positions for the local entries the
  // next position reads, 1 + E(W-1) = 13 for an exact H_E at P - 1.
  const Config c = builtin_config("tiny");
  const std::vector<std::array<int64_t, 3>> cases = {{3, 3, 12}, {1, 1, 4}, {0, 0, 0}, {4, 4, 16}, {5, 4, 16}};
  for (const auto& [P, span, work] : cases) {
    const OracleTable t = oracle_table(c, {20}, P);
    ASSERT_TRUE(t.spans) << "P = " << P;
    EXPECT_EQ(t.spans->prefix_len, P);
    EXPECT_EQ(t.spans->bounded_span, span) << "P = " << P;
    EXPECT_EQ(t.spans->bounded_work, work) << "P = " << P;
    EXPECT_EQ(t.spans->exact_local_span, 12) << "P = " << P;
    EXPECT_EQ(t.spans->exact_hidden_span, 13) << "P = " << P;
  }
}

TEST(AnalyticTable, ExactRatioApproachesTheIdealRatioAsNGrowsOnV41Shape) {
  // The FLOP model carries what the ideal ratio leaves out: the source-only
  // write, the indexer and the lm_head row. From N = 2W to N = 4096 the
  // per-position layer work dominates: the exact ratio falls with N, and its
  // gap to 1/2 + B/(2N) shrinks monotonically, to under 0.1 % at N = 4096
  // (printed values of this model: gaps -2.885, -2.198, -1.274, -0.595, -0.041 %).
  const Config c = builtin_config("v41-shape");
  const Plan plan = make_plan(c);
  double previous_ratio = 1.0, previous_gap = 1.0;
  for (int64_t N : {256, 512, 1024, 2048, 4096}) {
    const double ideal = 0.5 + 128.0 / (2.0 * double(N));  // B = W = 128
    EXPECT_DOUBLE_EQ(ideal_ratio(plan, N), ideal);
    const double exact = exact_ratio_flops(c, plan, N).ratio();
    const double gap = std::abs(exact - ideal);
    SCOPED_TRACE(testing::Message() << "N " << N << " ideal " << ideal << " exact " << exact);
    EXPECT_LT(exact, previous_ratio);
    EXPECT_LT(gap, previous_gap);
    previous_ratio = exact;
    previous_gap = gap;
  }
  EXPECT_LT(previous_gap, 1e-3);
  // N <= W: B = N, the decoder replays everything; ced does the full work.
  EXPECT_EQ(exact_ratio_flops(c, plan, 128).ratio(), 1.0);
}

TEST(AnalyticTable, ExactRatioTendsToTheIndexersShareForVeryLongPrompts) {
  // Index scoring before the pool is quadratic in N: the encoder's three r = 2
  // sources score ~N²/4 entries each, layer 20 (candidate source, r = 1, full
  // mode only) ~N²/2; everything else is linear. So ced / full -> (3/4) / (3/4 +
  // 1/2) = 3/5, not 1/2, once N is far beyond the model width.
  const Config c = builtin_config("v41-shape");
  const Plan plan = make_plan(c);
  EXPECT_NEAR(exact_ratio_flops(c, plan, 100'000'000).ratio(), 0.6, 1e-3);
}

TEST(AnalyticTable, IdealRatioWeighsEncoderAndDecoderWhenEDiffersFromD) {
  Config c = builtin_config("tiny");  // tiny-E5: E = 5, D = 3, W = 4
  c.n_encoder_layers = 5;
  c.compress_ratios = {0, 2, 2, 2, 2, 1, 1, 1};
  c.kv_source_layers = {1, 5};
  c.index_source_layers = {1, 2, 5, 6};
  c.candidate_source_layer = 5;
  validate(c);
  const Plan plan = make_plan(c);
  // (N·E + B·D) / (N·L) with B = min(N, W): N = 10 → (50 + 12) / 80.
  EXPECT_DOUBLE_EQ(ideal_ratio(plan, 10), 62.0 / 80.0);
  EXPECT_DOUBLE_EQ(ideal_ratio(plan, 3), (15.0 + 9.0) / 24.0);  // B = N: everything
  EXPECT_NE(ideal_ratio(plan, 10), 0.5 + 4.0 / 20.0);           // not the E = D formula
  const OracleTable t = oracle_table(c, {10}, std::nullopt);
  EXPECT_EQ(t.seed.exact_replay, 1 + 3 * 3);
  EXPECT_EQ(t.seed.work_triangle, 3 + 3 * 3 * 2 / 2);
  EXPECT_DOUBLE_EQ(t.rows[0].ideal_ratio, 62.0 / 80.0);
  EXPECT_FALSE(t.spans);
}

TEST(AnalyticCone, PredictionsFollowTheSpecBounds) {
  const Plan plan = make_plan(builtin_config("v41-shape"));  // D = 20, W = 128
  EXPECT_EQ(predicted_min_exact_replay(plan, 100), 100);
  EXPECT_EQ(predicted_min_exact_replay(plan, 4096), 2541);
  EXPECT_EQ(predicted_min_exact_decode_replay(plan, 4096), 2540);
  EXPECT_EQ(predicted_min_exact_decode_replay(plan, 2000), 2000);
  // Layer E+k at the last position of N = 4096 with B = B_k is exact, B_k - 1 is not.
  for (int64_t k = 0; k < plan.D; ++k) {
    const int64_t N = 4096, Bk = cone_min_replay(plan, k);
    EXPECT_TRUE(cone_exact(plan, k, N - 1, N - Bk)) << k;
    EXPECT_FALSE(cone_exact(plan, k, N - 1, N - Bk + 1)) << k;
  }
  EXPECT_TRUE(cone_exact(plan, plan.D - 1, 5, 0));  // s = 0 is the full forward
  EXPECT_THROW(cone_exact(plan, plan.D, 5, 0), InputError);
  // The last decoder layer's cone is the exact replay R.
  EXPECT_EQ(cone_min_replay(plan, plan.D - 1), plan.exact_replay());
}

}  // namespace
}  // namespace ced
