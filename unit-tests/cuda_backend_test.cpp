// The CUDA backend on a device: every mode runs on the tiny config, returns
// finite logits of the right shape and the same bits on every run. Without a
// device it prints "SKIP: no CUDA device" and exits 77 (CTest: skipped).
// Side-by-side comparison with the reference lives with the comparison engine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "models/lab/config.hpp"
#include "model/error.hpp"
#include "models/lab/plan.hpp"
#include "model/run.hpp"
#include "models/lab/weights.hpp"
#include "optimized/lab/cuda_backend.hpp"
#include "optimized/lab/device_math.cuh"

namespace {

constexpr uint64_t kWeightSeed = 1;
constexpr uint64_t kTokenSeed = 2;

class CudaBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::printf("weight_seed=%llu token_seed=%llu\n", static_cast<unsigned long long>(kWeightSeed),
                static_cast<unsigned long long>(kTokenSeed));
    cfg_ = new ced::Config(ced::builtin_config("tiny"));
    backend_ = ced::make_cuda_backend(*cfg_, kWeightSeed, ced::CudaPrecision::F32).release();
  }
  static void TearDownTestSuite() {
    delete backend_;
    delete cfg_;
  }

  static ced::RunRequest request(ced::Mode mode, int64_t n, const char* replay = "none", int64_t decode = 0) {
    ced::RunRequest r;
    r.mode = mode;
    r.replay = ced::ReplayPolicy::parse(replay);
    r.n_prompt = n;
    r.decode_steps = decode;
    r.tokens = ced::make_tokens(kTokenSeed, cfg_->vocab_size, n + decode);
    return r;
  }

  static ced::Config* cfg_;
  static ced::Backend* backend_;
};
ced::Config* CudaBackendTest::cfg_ = nullptr;
ced::Backend* CudaBackendTest::backend_ = nullptr;

// Finite, the right shape, and not all zero (an unwritten output must not pass).
void expect_sane_logits(const ced::RunResult& res, const std::vector<int64_t>& positions, int64_t V) {
  ASSERT_EQ(res.positions, positions);
  ASSERT_EQ(res.logits.rows(), static_cast<int64_t>(positions.size()));
  ASSERT_EQ(res.logits.cols(), V);
  EXPECT_TRUE(res.logits.allFinite());
  EXPECT_GT(res.logits.norm(), 0.0);
}

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> v;
  for (int64_t p = a; p < b; ++p) v.push_back(p);
  return v;
}

bool bitwise_equal(const ced::MatD& a, const ced::MatD& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::equal(a.data(), a.data() + a.size(), b.data(),
                    [](double x, double y) { return std::memcmp(&x, &y, sizeof x) == 0; });
}

TEST_F(CudaBackendTest, ReportsNameAndDtype) {
  EXPECT_EQ(backend_->name(), "cuda");
  EXPECT_EQ(backend_->dtype(), "f32");
}

TEST_F(CudaBackendTest, FullModeGivesFiniteLogitsAtEveryPosition) {
  const auto res = backend_->run(request(ced::Mode::Full, 11));
  expect_sane_logits(res, range(0, 11), cfg_->vocab_size);
  EXPECT_EQ(res.n_replay, -1);
  EXPECT_EQ(res.replay_start, 0);
  EXPECT_EQ(static_cast<int64_t>(res.flops.per_layer.size()), cfg_->n_layers + 1);
}

TEST_F(CudaBackendTest, CedBoundedReplayGivesLogitsFromTheReplayStart) {
  const auto res = backend_->run(request(ced::Mode::Ced, 11, "bounded"));
  // B = min(N, W) = 4, s = N − B = 7.
  expect_sane_logits(res, range(7, 11), cfg_->vocab_size);
  EXPECT_EQ(res.replay_start, 7);
  EXPECT_EQ(res.n_replay, 4);
}

TEST_F(CudaBackendTest, LastScopeGivesOnlyTheLastPosition) {
  auto req = request(ced::Mode::Full, 9);
  req.logits = ced::LogitsScope::Last;
  expect_sane_logits(backend_->run(req), {8}, cfg_->vocab_size);
}

TEST_F(CudaBackendTest, DecodeAppendsLogitsForEveryStep) {
  const auto res = backend_->run(request(ced::Mode::Ced, 9, "bounded", 3));
  expect_sane_logits(res, range(5, 12), cfg_->vocab_size);
}

TEST_F(CudaBackendTest, ResumeFromComputedCacheReturnsThatCache) {
  auto req = request(ced::Mode::Resume, 13, "bounded", 2);
  req.prefix_len = 7;
  req.want_cache = true;
  const auto res = backend_->run(req);
  // s_r = P − W = 3, s = max(N − B, s_r) = 9.
  expect_sane_logits(res, range(9, 15), cfg_->vocab_size);
  ASSERT_TRUE(res.cache);
  EXPECT_EQ(res.cache->prefix_len, 7);
  ASSERT_EQ(res.cache->sources.size(), 2u);  // kv sources 1 (r = 2) and 4 (r = 1)
  EXPECT_EQ(res.cache->sources[0].entries.rows(), 3);
  EXPECT_EQ(res.cache->sources[0].pending_c.rows(), 1);
  EXPECT_EQ(res.cache->sources[1].entries.rows(), 7);
  EXPECT_TRUE(res.cache->sources[0].entries.allFinite());
  EXPECT_TRUE(res.cache->sources[1].index_keys.allFinite());
}

TEST_F(CudaBackendTest, ResumeFromAGivenCacheEqualsResumeFromTheComputedOne) {
  auto req = request(ced::Mode::Resume, 13, "bounded");
  req.prefix_len = 7;
  req.want_cache = true;
  const auto computed = backend_->run(req);
  req.cache_in = computed.cache;
  req.want_cache = false;
  const auto given = backend_->run(req);
  EXPECT_TRUE(bitwise_equal(computed.logits, given.logits));
}

TEST_F(CudaBackendTest, RunsAreBitwiseDeterministicInEveryMode) {
  std::vector<ced::RunRequest> reqs = {request(ced::Mode::Full, 10, "none", 2),
                                       request(ced::Mode::Ced, 10, "bounded", 2),
                                       request(ced::Mode::Ced, 10, "exact"),
                                       request(ced::Mode::Resume, 12, "bounded", 2)};
  reqs[3].prefix_len = 6;
  for (auto& req : reqs) {
    req.capture_layers = true;
    const auto a = backend_->run(req), b = backend_->run(req);
    EXPECT_TRUE(bitwise_equal(a.logits, b.logits)) << ced::mode_name(req.mode) << " " << req.replay.str();
    ASSERT_EQ(a.layers.size(), b.layers.size());
    for (size_t l = 0; l < a.layers.size(); ++l) {
      EXPECT_TRUE(bitwise_equal(a.layers[l].out, b.layers[l].out)) << "layer " << l;
      EXPECT_EQ(a.layers[l].topk, b.layers[l].topk) << "layer " << l;
    }
  }
}

TEST_F(CudaBackendTest, CapturedSelectionsAreVisibleDistinctAndPadded) {
  auto req = request(ced::Mode::Full, 14);
  req.capture_layers = true;
  const auto res = backend_->run(req);
  const ced::Plan plan = ced::make_plan(*cfg_);
  ASSERT_EQ(static_cast<int64_t>(res.layers.size()), cfg_->n_layers);
  for (const auto& lc : res.layers) {
    const auto& lp = plan[lc.layer];
    EXPECT_EQ(lc.positions, range(0, 14));
    EXPECT_TRUE(lc.out.allFinite());
    EXPECT_EQ(lc.has_topk, lp.ratio > 0) << "layer " << lc.layer;
    if (!lc.has_topk) continue;
    for (int64_t i = 0; i < lc.topk.rows(); ++i) {
      const int64_t p = lc.positions[size_t(i)];
      const int64_t n_vis = ced::cuda::n_visible(p, lp.ratio);
      const int64_t want = std::min<int64_t>(cfg_->index_topk, n_vis);
      std::vector<int64_t> ids;
      for (int64_t k = 0; k < lc.topk.cols(); ++k) {
        const int64_t j = lc.topk(i, k);
        if (k < want || !lp.selects_in_pool) {
          // Outside a pool every visible entry is eligible: exactly min(k, n_vis) ids.
          EXPECT_EQ(j >= 0, k < want) << "layer " << lc.layer << " p " << p << " slot " << k;
        }
        if (j < 0) continue;
        EXPECT_LT(j, n_vis) << "layer " << lc.layer << " p " << p;
        ids.push_back(j);
      }
      std::sort(ids.begin(), ids.end());
      EXPECT_TRUE(std::adjacent_find(ids.begin(), ids.end()) == ids.end()) << "layer " << lc.layer << " p " << p;
    }
  }
}

// docs/spec.md §4: with B >= R = 1 + D(W − 1) the last position's logits are exact.
// The CUDA model is batch-invariant by design, so this holds bitwise here too.
TEST_F(CudaBackendTest, ExactReplayMatchesFullModeBitwiseAtTheLastPosition) {
  auto full = request(ced::Mode::Full, 20);
  auto ced_req = request(ced::Mode::Ced, 20, "exact");  // R = 13 < N
  full.logits = ced_req.logits = ced::LogitsScope::Last;
  const auto a = backend_->run(full), b = backend_->run(ced_req);
  EXPECT_EQ(b.replay_start, 7);
  EXPECT_TRUE(bitwise_equal(a.logits, b.logits));
}

// docs/spec.md §6: when P <= W the resume is exact (bitwise equal to ced from scratch).
TEST_F(CudaBackendTest, ResumeWithPrefixWithinTheWindowMatchesCedBitwise) {
  auto resume = request(ced::Mode::Resume, 12, "bounded", 2);
  resume.prefix_len = 3;
  const auto a = backend_->run(resume), b = backend_->run(request(ced::Mode::Ced, 12, "bounded", 2));
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_TRUE(bitwise_equal(a.logits, b.logits));
}

TEST_F(CudaBackendTest, FaultInjectionIsReportedAsNotSupported) {
  auto req = request(ced::Mode::Full, 5);
  req.fault = ced::Fault::SinkDropped;
  EXPECT_THROW(backend_->run(req), ced::NotSupported);
}

TEST(CudaBackendOtherConfigs, Bf16PrecisionRunsEveryModeWithFiniteLogits) {
  const auto cfg = ced::builtin_config("small");
  auto be = ced::make_cuda_backend(cfg, kWeightSeed, ced::CudaPrecision::BF16);
  EXPECT_EQ(be->dtype(), "bf16");
  ced::RunRequest r;
  r.mode = ced::Mode::Ced;
  r.replay = ced::ReplayPolicy::parse("bounded");
  r.n_prompt = 30;
  r.decode_steps = 2;
  r.tokens = ced::make_tokens(kTokenSeed, cfg.vocab_size, 32);
  const auto res = be->run(r);
  expect_sane_logits(res, range(22, 32), cfg.vocab_size);
}

TEST(CudaBackendOtherConfigs, V41ShapeRunsCedWithDecode) {
  const auto cfg = ced::builtin_config("v41-shape");
  auto be = ced::make_cuda_backend(cfg, kWeightSeed, ced::CudaPrecision::F32);
  ced::RunRequest r;
  r.mode = ced::Mode::Ced;
  r.replay = ced::ReplayPolicy::parse("bounded");
  r.n_prompt = 301;  // odd, not a multiple of r or the candidate block
  r.decode_steps = 3;
  r.tokens = ced::make_tokens(kTokenSeed, cfg.vocab_size, 304);
  r.logits = ced::LogitsScope::Last;
  const auto res = be->run(r);
  expect_sane_logits(res, {300, 301, 302, 303}, cfg.vocab_size);
}

}  // namespace

int main(int argc, char** argv) {
  if (!ced::cuda_device_available()) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
