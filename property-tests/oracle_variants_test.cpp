// docs/spec.md §6, §7: oracle predictions no golden run exercises, each checked two
// ways: against the instrumented counter of the reference (check_flops_of,
// every layer and kind) and against counts worked out by hand. Resume with a
// short prefix (P < W, P = W, P > W), a dense FFN (no routed experts) against
// routed experts, and every compress ratio 0, 1, 2, 3 in the encoder and the
// decoder.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "oracle/analytic.hpp"
#include "checks/ced_checks.hpp"

using namespace ced;
using namespace ced::prop;

namespace {

using Row = std::array<int64_t, kFlopKinds>;

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

// The oracle's rows for a request equal `expected`, and the reference's
// counter equals the oracle (so it equals `expected` too).
void expect_rows(const Config& c, const RunRequest& req, const std::vector<Row>& expected, const std::string& what) {
  const Plan plan = make_plan(c);
  const FlopCount f = flop_model(c, plan, flop_query(req));
  ASSERT_EQ(f.per_layer.size(), expected.size()) << what;
  for (size_t l = 0; l < expected.size(); ++l)
    for (int k = 0; k < kFlopKinds; ++k)
      EXPECT_EQ(f.per_layer[l][size_t(k)], expected[l][size_t(k)])
          << what << ": row " << l << " (" << (l + 1 == expected.size() ? "lm_head" : "layer") << "), "
          << flop_kind_name(k);
  const Model m(c);
  EXPECT_EQ(check_flops_of(m, req), "") << what;
}

// tiny (docs/spec.md §1 built-in): V = 97, d = 32, L = 8, E = 4, H = 4, hd = 16,
// q_lora = 16, W = 4, ratios {0,2,2,2,1,1,1,1}, kv sources {1,4}, index
// sources {1,2,4,6}, ih = 2, ihd = 8, topk = 3, candidate source 4 (blocks of
// 2, 3 blocks), o_groups = 2, o_lora = 8, 4 routed experts (2 active), 1
// shared, moe_dim = 16. Per-position costs (2 per multiply-add):
constexpr int64_t kQ = 2 * (32 * 16 + 16 * 4 * 16);    // query 3072
constexpr int64_t kLE = 2 * 32 * 16;                   // local entry 1024
constexpr int64_t kA = 2 * 2 * 4 * 16;                 // attention 256 per entry
constexpr int64_t kO = 2 * (4 * 16 * 8 + 2 * 8 * 32);  // output 2048
constexpr int64_t kRT = 2 * 32 * 4;                    // router 256
constexpr int64_t kX = 2 * 3 * 32 * 16 * (2 + 1);      // 2 active + 1 shared expert 9216
constexpr int64_t kXDense = 2 * 3 * 32 * 16 * 1;       // the shared expert alone 3072
constexpr int64_t kIQ = 2 * (16 * 2 * 8 + 32 * 2);     // indexer queries and weights 640
constexpr int64_t kSC = 2 * 2 * 8;                     // 32 per scored entry
constexpr int64_t kC2 = 2 * 2 * 32 * 16;               // 2048 per token, r >= 2 (c and z)
constexpr int64_t kC1 = 2 * 32 * 16;                   // 1024 per token, r = 1
constexpr int64_t kIK = 2 * 16 * 8;                    // 256 per completed entry
constexpr int64_t kLM = 2 * 32 * 97;                   // 6208 per logits row

RunRequest request(const Config& c, Mode mode, int64_t N, const std::string& replay, int64_t P = -1,
                   int64_t decode = 0) {
  const Model m(c);
  RunRequest r = m.request(mode, N, replay, decode);
  r.prefix_len = P;
  return r;
}

// Resume of N = 8 tokens, bounded replay, with a prefix P <= W = 4: s_r = 0,
// so the encoder runs 0..7 with full windows, as ced does: local 1,2,3,4,4,4,
// 4,4 = 26; r = 2 visible 0,1,1,2,2,3,3,4 = 16 (scored at 1 and 2), selected
// 0,1,1,2,2,3,3,3 = 15, attention 26 + 15 = 41. Decoder s = 8 - 4 = 4, p =
// 4..7: local 1,2,3,4 = 10; r = 1 visible 5,6,7,8 = 26 (scored at 4), the
// pool of 5,6,7,8 visible entries holds 5,6,5,6 = 22 (scored at 6), selected
// 3 each = 12, attention 22. What P changes: the kv sources consume only the
// tokens P..7 (§6): layer 1 (r = 2) 8 - P tokens and the blocks they
// complete, layer 4 (r = 1) 8 - P tokens and entries.
std::vector<Row> resume_rows_short_prefix(int64_t P, int64_t blocks_after_P) {
  const int64_t ne = 8, nd = 4, nt = 8 - P;
  return {
      row(ne * kQ, ne * kLE, 0, 0, 0, 0, kA * 26, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, nt * kC2, blocks_after_P * kIK, ne * kIQ, kSC * 16, kA * 41, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 0, 0, ne * kIQ, kSC * 16, kA * 41, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 0, 0, 0, 0, kA * 41, ne * kO, ne * kRT, ne * kX),
      row(nd * kQ, nd * kLE, nt * kC1, nt * kIK, nd * kIQ, kSC * 26, kA * 22, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 22, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, nd * kIQ, kSC * 22, kA * 22, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 22, nd * kO, nd * kRT, nd * kX),
      lm_row(4 * kLM)};  // logits at s..N-1 = 4..7
}

}  // namespace

TEST(OracleVariants, ResumeWithAPrefixShorterThanTheWindowMatchesCounterAndHandCount) {
  // P = 2 < W: tokens 2..7 complete blocks 1, 2, 3 of layer 1.
  expect_rows(builtin_config("tiny"), request(builtin_config("tiny"), Mode::Resume, 8, "bounded", 2),
              resume_rows_short_prefix(2, 3), "resume N 8 P 2");
}

TEST(OracleVariants, ResumeWithAPrefixEqualToTheWindowMatchesCounterAndHandCount) {
  // P = W = 4: tokens 4..7 complete blocks 2, 3.
  expect_rows(builtin_config("tiny"), request(builtin_config("tiny"), Mode::Resume, 8, "bounded", 4),
              resume_rows_short_prefix(4, 2), "resume N 8 P 4");
}

TEST(OracleVariants, ResumeWithAPrefixLongerThanTheWindowMatchesCounterAndHandCount) {
  // P = 6 > W: s_r = 2, encoder at 2..7 with lo(p) = max(2, p - 3): local
  // 1,2,3,4,4,4 = 18; r = 2 visible 1,2,2,3,3,4 = 15 (scored), selected
  // 1,2,2,3,3,3 = 14, attention 32. Tokens 6, 7: block 3 of layer 1, entries
  // 6, 7 of layer 4. Decoder s = max(8 - 4, 2) = 4, as above.
  const int64_t ne = 6, nd = 4;
  const std::vector<Row> e = {
      row(ne * kQ, ne * kLE, 0, 0, 0, 0, kA * 18, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 2 * kC2, 1 * kIK, ne * kIQ, kSC * 15, kA * 32, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 0, 0, ne * kIQ, kSC * 15, kA * 32, ne * kO, ne * kRT, ne * kX),
      row(ne * kQ, ne * kLE, 0, 0, 0, 0, kA * 32, ne * kO, ne * kRT, ne * kX),
      row(nd * kQ, nd * kLE, 2 * kC1, 2 * kIK, nd * kIQ, kSC * 26, kA * 22, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 22, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, nd * kIQ, kSC * 22, kA * 22, nd * kO, nd * kRT, nd * kX),
      row(nd * kQ, nd * kLE, 0, 0, 0, 0, kA * 22, nd * kO, nd * kRT, nd * kX),
      lm_row(4 * kLM)};
  expect_rows(builtin_config("tiny"), request(builtin_config("tiny"), Mode::Resume, 8, "bounded", 6), e,
              "resume N 8 P 6");
}

TEST(OracleVariants, ResumeAroundTheWindowMatchesTheCounterWithDecodeAndOtherReplays) {
  // Every P from 0 to N on tiny and small, with decode steps and each replay policy.
  for (const char* name : {"tiny", "small"}) {
    const Config c = builtin_config(name);
    const Model m(c);
    const int64_t W = m.p.W, N = 2 * W + 3;
    for (int64_t P : {int64_t(0), int64_t(1), W - 1, W, W + 1, N - 1, N})
      for (const char* replay : {"bounded", "exact", "3"}) {
        RunRequest r = m.request(Mode::Resume, N, replay, 2);
        r.prefix_len = P;
        EXPECT_EQ(check_flops_of(m, r), "") << name << " P " << P << " replay " << replay;
      }
  }
}

TEST(OracleVariants, DenseFfnCountsOnlyTheSharedExpertAndNoRouter) {
  // tiny without routed experts: per position the shared expert alone
  // (2·3·d·moe_dim = 3072) and no router; with them, 9216 and 256.
  const Config dense = with_override(builtin_config("tiny"), "n_routed_experts=0");
  const Config routed = builtin_config("tiny");
  for (const auto& [c, experts, router] : {std::tuple{dense, kXDense, int64_t(0)}, std::tuple{routed, kX, kRT}}) {
    for (const RunRequest& req : {request(c, Mode::Full, 7, "none", -1, 2), request(c, Mode::Ced, 7, "bounded"),
                                  request(c, Mode::Resume, 7, "exact", 3, 1)}) {
      const Plan plan = make_plan(c);
      const FlopQuery q = flop_query(req);
      const FlopCount f = flop_model(c, plan, q);
      const EvalSchedule s = eval_schedule(plan, q);
      for (int64_t l = 0; l < plan.L; ++l) {
        const int64_t n = s.n_total - s.first[size_t(l)];  // positions layer l evaluates
        EXPECT_EQ(f.per_layer[size_t(l)][kFlopExperts], n * experts) << c.name << " layer " << l;
        EXPECT_EQ(f.per_layer[size_t(l)][kFlopRouter], n * router) << c.name << " layer " << l;
      }
      EXPECT_EQ(check_flops_of(Model(c), req), "") << c.name << " " << mode_name(req.mode);
    }
  }
}

TEST(OracleVariants, EveryCompressRatioMatchesCounterAndHandCount) {
  // Ratio 3 in the encoder (layers 1-3), full N = 7: blocks complete at tokens
  // 2 and 5, so 2 index keys; visible floor((p+1)/3) = 0,0,1,1,1,2,2 = 7,
  // scored at index sources 1 and 2, selected min(3, .) = 7; local 1,2,3,4,4,
  // 4,4 = 22, attention 22 + 7 = 29. Layer 4 (r = 1): visible p+1 = 28,
  // scored 28; pools of 1..7 visible entries hold 1,2,3,4,5,6,5 = 26 (scored
  // at 6); selected 1,2,3,3,3,3,3 = 18; attention 22 + 18 = 40.
  {
    const Config c = with_override(builtin_config("tiny"), "compress_ratios=0,3,3,3,1,1,1,1");
    const int64_t n = 7;
    const std::vector<Row> e = {
        row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 22, n * kO, n * kRT, n * kX),
        row(n * kQ, n * kLE, n * kC2, 2 * kIK, n * kIQ, kSC * 7, kA * 29, n * kO, n * kRT, n * kX),
        row(n * kQ, n * kLE, 0, 0, n * kIQ, kSC * 7, kA * 29, n * kO, n * kRT, n * kX),
        row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 29, n * kO, n * kRT, n * kX),
        row(n * kQ, n * kLE, n * kC1, n * kIK, n * kIQ, kSC * 28, kA * 40, n * kO, n * kRT, n * kX),
        row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 40, n * kO, n * kRT, n * kX),
        row(n * kQ, n * kLE, 0, 0, n * kIQ, kSC * 26, kA * 40, n * kO, n * kRT, n * kX),
        row(n * kQ, n * kLE, 0, 0, 0, 0, kA * 40, n * kO, n * kRT, n * kX),
        lm_row(n * kLM)};
    expect_rows(c, request(c, Mode::Full, 7, "none"), e, "ratio 3 encoder, full N 7");
  }
  // Ratio 0 in the decoder (layers 5 and 7 SWA-only): they attend to their
  // local entries only (22) and run no indexer; the rest is tiny's.
  {
    const Config c = with_override(builtin_config("tiny"), "compress_ratios=0,2,2,2,1,0,1,0");
    const Plan plan = make_plan(c);
    const FlopCount f = flop_model(c, plan, flop_query(request(c, Mode::Full, 7, "none")));
    for (int64_t l : {5, 7}) {
      EXPECT_EQ(f.per_layer[size_t(l)][kFlopAttention], kA * 22) << l;
      EXPECT_EQ(f.per_layer[size_t(l)][kFlopIndexerQW], 0) << l;
      EXPECT_EQ(f.per_layer[size_t(l)][kFlopIndexScoring], 0) << l;
    }
  }
  // Every ratio in both halves against the counter, in every mode.
  for (const char* ratios : {"0,3,3,3,1,1,1,1", "0,1,1,1,2,2,2,2", "0,1,1,1,3,3,3,3", "0,2,2,2,1,0,1,0",
                             "0,2,2,2,3,3,3,3"}) {
    const Config c = with_override(builtin_config("tiny"), std::string("compress_ratios=") + ratios);
    const Model m(c);
    for (int64_t N : {int64_t(7), 2 * m.p.exact_replay() + 1})
      EXPECT_EQ(check_flops(m, N), "") << ratios << " N " << N;
  }
}
