// docs/spec.md §3, op by op, on hand-built cases.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "reference/lab/ops.hpp"

using namespace ced;
using namespace ced::ref;

TEST(RmsNorm, MatchesHandComputation) {
  const double v[2] = {3.0, 4.0}, w[2] = {1.0, 2.0};
  double out[2];
  rmsnorm(v, w, 2, 0.0, out);  // mean(v²) = 12.5
  EXPECT_DOUBLE_EQ(out[0], 3.0 / std::sqrt(12.5));
  EXPECT_DOUBLE_EQ(out[1], 2.0 * 4.0 / std::sqrt(12.5));
}

// docs/spec.md §3 written out: per row, the sum of squares i ascending from 0,
// then (v_i * (1 / sqrt(ss / n + eps))) * w_i.
template <class T>
Mat<T> sequential_rmsnorm(const Mat<T>& X, const Vec<T>& w, T eps) {
  Mat<T> Y(X.rows(), X.cols());
  const int64_t n = X.cols();
  for (int64_t r = 0; r < X.rows(); ++r) {
    T ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += X(r, i) * X(r, i);
    const T inv = T(1) / std::sqrt(ss / T(n) + eps);
    for (int64_t i = 0; i < n; ++i) Y(r, i) = (X(r, i) * inv) * w(i);
  }
  return Y;
}

template <class T>
int64_t bit_differences(const Mat<T>& a, const Mat<T>& b) {
  int64_t d = 0;
  for (int64_t i = 0; i < a.size(); ++i) d += std::memcmp(a.data() + i, b.data() + i, sizeof(T)) != 0;
  return d;
}

// rmsnorm_rows opens its OpenMP region from kParallelElements elements on,
// which the invariance checks of the wide configs (40 rows of 256) never
// reach. Past it every row must still get the sequential sum of squares,
// whichever thread runs it and however many there are: many narrow rows
// (groups of eight shared out) and a few wide ones (a group of eight and
// three single rows), at 1, 2 and 3 threads, bitwise against the sum written
// out above. Values over 41 binades, so that a row summed in parts by several
// threads rounds differently from the sequential sum.
template <class T>
void expect_sequential_rmsnorm_on_every_thread_count() {
  struct Shape {
    int64_t rows, n;
  };
  for (const Shape s : {Shape{8 * 123 + 3, 67}, Shape{11, kParallelElements / 8 + 5}}) {
    ASSERT_GE(s.rows * s.n, kParallelElements) << "the parallel region must open";
    Mat<T> X(s.rows, s.n);
    Vec<T> w(s.n);
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t i = 0; i < s.n; ++i)
        X(r, i) = T(std::ldexp(std::sin(double(r * s.n + i) * 0.7), int((i * 7 + r) % 41) - 20));
    for (int64_t i = 0; i < s.n; ++i) w(i) = T(1 + std::cos(double(i)) / 2);
    const T eps = T(1e-6);
    const Mat<T> want = sequential_rmsnorm(X, w, eps);
    const int saved = omp_get_max_threads();
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      EXPECT_EQ(bit_differences(rmsnorm_rows(X, w, eps), want), 0)
          << s.rows << " rows of " << s.n << " on " << threads << " threads";
    }
    omp_set_num_threads(saved);
  }
}

TEST(RmsNorm, RowsPastTheParallelThresholdGetTheSequentialSumsBitsOnOneTwoAndThreeThreads) {
  expect_sequential_rmsnorm_on_every_thread_count<float>();
  expect_sequential_rmsnorm_on_every_thread_count<double>();
}

// Rows each at least kParallelElements wide. The test above reaches rmsnorm_rows' region with rows of
// 8197, where a sum of squares split over a row's columns only for wide rows (a region of its own,
// `if (n >= kParallelElements)`, on rmsnorm()'s loop or on a group's) never opens; here it would.
// rmsnorm() on one wide row called outside any parallel region (as the engine calls it for the
// compressor's norms when its position loop stays closed: inside an open region a nested one gets one
// thread), and rmsnorm_rows on 1, 3 and 9 wide rows (the single-row path alone, then a group of eight and
// one more), at 1, 2 and 3 threads set here (the CI machine has 2 cores: nproc would give 2), each
// bitwise against the sequential sum, i ascending from 0, written out above.
template <class T>
void expect_sequential_rmsnorm_of_wide_rows_on_every_thread_count() {
  const int64_t n = kParallelElements + 5;  // odd: no even split of the columns
  Mat<T> X(9, n);
  Vec<T> w(n);
  for (int64_t r = 0; r < X.rows(); ++r)
    for (int64_t i = 0; i < n; ++i)
      X(r, i) = T(std::ldexp(std::sin(double(r * n + i) * 0.7), int((i * 7 + r) % 41) - 20));
  for (int64_t i = 0; i < n; ++i) w(i) = T(1 + std::cos(double(i)) / 2);
  const T eps = T(1e-6);
  const int saved = omp_get_max_threads();
  for (int64_t rows : {1, 3, 9}) {
    const Mat<T> Xr = X.topRows(rows);
    const Mat<T> want = sequential_rmsnorm(Xr, w, eps);
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      EXPECT_EQ(bit_differences(rmsnorm_rows(Xr, w, eps), want), 0) << rows << " rows of " << n << " on " << threads
                                                                     << " threads";
      if (rows == 1) {
        Mat<T> one(1, n);
        rmsnorm(Xr.data(), w.data(), n, eps, one.data());
        EXPECT_EQ(bit_differences(one, want), 0) << "rmsnorm() of a row of " << n << " on " << threads << " threads";
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(RmsNorm, RowsEachWiderThanTheParallelThresholdGetTheSequentialSumsBitsOnOneTwoAndThreeThreads) {
  expect_sequential_rmsnorm_of_wide_rows_on_every_thread_count<float>();
  expect_sequential_rmsnorm_of_wide_rows_on_every_thread_count<double>();
}

TEST(Rope, RotatesOnlyTheLastRopeDimPairs) {
  double v[6] = {1, 2, 1, 0, 0, 1};
  rope(v, 6, 4, 10000.0, 3);
  EXPECT_EQ(v[0], 1);
  EXPECT_EQ(v[1], 2);
  // pair 0: θ = 3, (1, 0) -> (cos 3, sin 3)
  EXPECT_DOUBLE_EQ(v[2], std::cos(3.0));
  EXPECT_DOUBLE_EQ(v[3], std::sin(3.0));
  // pair 1: θ = 3 · 10000^(-1/2) = 0.03, (0, 1) -> (-sin θ, cos θ)
  EXPECT_DOUBLE_EQ(v[4], -std::sin(0.03));
  EXPECT_DOUBLE_EQ(v[5], std::cos(0.03));
}

TEST(Rope, InverseUndoesRotation) {
  double v[8] = {0.3, -1.2, 0.7, 2.0, -0.5, 0.25, 1.5, -0.75};
  double orig[8];
  std::copy(v, v + 8, orig);
  rope(v, 8, 8, 10000.0, 1234);
  rope(v, 8, 8, 10000.0, 1234, -1);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(v[i], orig[i], 1e-14);
}

TEST(Visibility, BlockIsVisibleOnlyOnceItsLastTokenExists) {
  // r = 2: entry j covers tokens 2j, 2j+1; visible iff 2j + 1 <= p.
  EXPECT_EQ(n_visible(0, 2), 0);
  EXPECT_EQ(n_visible(1, 2), 1);
  EXPECT_EQ(n_visible(2, 2), 1);
  EXPECT_EQ(n_visible(3, 2), 2);
  EXPECT_EQ(n_visible(0, 1), 1);
  EXPECT_EQ(n_visible(6, 1), 7);
}

TEST(Compressor, BlockIsTheChannelwiseSoftmaxGatedSum) {
  // r = 2, dim = 2: gates z equal in channel 0 (weights 1/2), and
  // z = (0, ln 3) in channel 1 (weights 1/4, 3/4).
  const double c[4] = {2.0, 4.0, 6.0, 8.0};  // token 0: (2, 4); token 1: (6, 8)
  const double z[4] = {0.5, 0.0, 0.5, std::log(3.0)};
  double out[2];
  compress_block(c, z, 2, 2, out);
  EXPECT_DOUBLE_EQ(out[0], 4.0);
  EXPECT_NEAR(out[1], 0.25 * 4.0 + 0.75 * 8.0, 1e-15);
}

TEST(IndexScore, IsWeightedSumOfReluDots) {
  // 2 heads of dim 2; head 0 dot = 1·1 + 2·1 = 3; head 1 dot = -1 -> ReLU 0.
  const double iq[4] = {1, 2, -1, 0}, w[2] = {0.5, 10.0}, ik[2] = {1, 1};
  EXPECT_DOUBLE_EQ(index_score(iq, w, ik, 2, 2), 1.5);
}

TEST(TopK, EqualScoresPreferTheLargerId) {
  const std::vector<int64_t> ids = {0, 1, 2, 3};
  const std::vector<double> s = {1.0, 2.0, 1.0, 1.0};
  EXPECT_EQ(topk(ids, s, 3), (std::vector<int64_t>{1, 3, 2}));
}

TEST(TopK, NegativeZeroTiesWithPositiveZero) {
  const std::vector<int64_t> ids = {0, 1};
  const std::vector<double> s = {0.0, -0.0};
  EXPECT_EQ(topk(ids, s, 1), (std::vector<int64_t>{1}));
}

TEST(TopK, ReversedTieBreakIsDetectable) {
  const std::vector<int64_t> ids = {0, 1, 2};
  const std::vector<double> s = {0.0, 0.0, 0.0};
  EXPECT_EQ(topk(ids, s, 2), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(topk(ids, s, 2, true), (std::vector<int64_t>{0, 1}));
}

// docs/spec.md §9.1: the scores stored with a selection, by hand: 2 at id 3
// ranks before 2 at id 1 (larger id first), then 0.5; 0 is the best left out.
TEST(TopK, ScoredTopkIsTopkWithItsScoresAndTheBestLeftOut) {
  const std::vector<int64_t> ids = {0, 1, 2, 3, 4};
  const std::vector<double> s = {0.5, 2.0, -1.0, 2.0, 0.0};
  const ScoredTopk<double> a = topk_scored(ids, s, 3);
  EXPECT_EQ(a.ids, (std::vector<int64_t>{3, 1, 0}));
  EXPECT_EQ(a.scores, (std::vector<double>{2.0, 2.0, 0.5}));
  EXPECT_EQ(a.left_out, 0.0);
  EXPECT_EQ(a.ids, topk(ids, s, 3));
  // every entry taken: nothing left out
  const ScoredTopk<double> all = topk_scored(ids, s, 5);
  EXPECT_EQ(all.scores, (std::vector<double>{2.0, 2.0, 0.5, 0.0, -1.0}));
  EXPECT_TRUE(std::isnan(all.left_out));
  // the reversed tie-break fault moves the left-out entry with the selection
  const ScoredTopk<double> rev = topk_scored(ids, s, 1, true);
  EXPECT_EQ(rev.ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(rev.left_out, 2.0);
}

TEST(TopK, TakesAllWhenFewerThanK) {
  EXPECT_EQ(topk<double>({4, 7}, {1.0, 3.0}, 5), (std::vector<int64_t>{7, 4}));
}

TEST(CandidatePool, NewestBlockIsPinnedFirstEvenWithTheLowestScore) {
  // 7 visible entries in blocks of 2: blocks 0..3, block 3 = {6} (partial).
  const std::vector<double> s = {5, 1, 9, 0, 2, 2, -1};
  EXPECT_EQ(candidate_pool(s, 7, 2, 3), (std::vector<int64_t>{3, 1, 0}));
  // Block scores are the max of visible entries only: entry 7 does not exist.
  EXPECT_EQ(candidate_pool(s, 7, 2, 1), (std::vector<int64_t>{3}));
  EXPECT_EQ(candidate_pool(s, 7, 2, 3, /*pin_newest=*/false), (std::vector<int64_t>{1, 0, 2}));
}

TEST(CandidatePool, EqualBlockScoresPreferTheLargerBlock) {
  const std::vector<double> s = {1, 1, 1, 1, 1, 1};
  EXPECT_EQ(candidate_pool(s, 6, 2, 2), (std::vector<int64_t>{2, 1}));
}

TEST(Sink, JoinsTheDenominatorWithoutAValue) {
  std::vector<double> l = {0.0, 0.0};
  softmax_with_sink(l, 0.0);
  EXPECT_DOUBLE_EQ(l[0], 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(l[1], 1.0 / 3.0);
  std::vector<double> m = {0.0, 0.0};
  softmax_with_sink(m, 0.0, false);
  EXPECT_DOUBLE_EQ(m[0], 0.5);
}

TEST(Sink, VeryNegativeSinkVanishes) {
  std::vector<double> l = {1.0};
  softmax_with_sink(l, -1e4);
  EXPECT_DOUBLE_EQ(l[0], 1.0);
}

TEST(Router, ScoreIsSqrtSoftplus) {
  EXPECT_DOUBLE_EQ(router_score(0.0), std::sqrt(std::log(2.0)));
  EXPECT_NEAR(router_score(50.0), std::sqrt(50.0), 1e-12);
  EXPECT_TRUE(std::isfinite(router_score(-800.0)));
}

TEST(Router, EqualScoresPreferTheLowerExpert) {
  const double s[4] = {1.0, 2.0, 1.0, 2.0}, bias[4] = {0, 0, 0, 0};
  EXPECT_EQ(route(s, bias, 4, 1), (std::vector<int64_t>{1}));
  EXPECT_EQ(route(s, bias, 4, 3), (std::vector<int64_t>{0, 1, 3}));
}

TEST(Router, BiasChoosesButDoesNotWeigh) {
  const double s[3] = {1.0, 1.5, 1.2}, bias[3] = {1.0, 0.0, 0.0};
  EXPECT_EQ(route(s, bias, 3, 1), (std::vector<int64_t>{0}));
}

TEST(Matmul, EachElementIsTheSequentialSumOverK) {
  Mat<double> X(2, 3), W(3, 2);
  X << 1, 2, 3, 4, 5, 6;
  W << 1, 0, 0, 1, 1, 1;
  const Mat<double> Y = matmul(X, W);
  EXPECT_EQ(Y(0, 0), 4);
  EXPECT_EQ(Y(0, 1), 5);
  EXPECT_EQ(Y(1, 0), 10);
  EXPECT_EQ(Y(1, 1), 11);
}

TEST(Matmul, RowResultDoesNotDependOnTheOtherRows) {
  Mat<float> X = Mat<float>::Random(9, 37), W = Mat<float>::Random(37, 13);
  const Mat<float> all = matmul(X, W);
  for (int i = 0; i < 9; ++i) {
    const Mat<float> one = matmul(Mat<float>(X.row(i)), W);
    for (int j = 0; j < 13; ++j) EXPECT_EQ(one(0, j), all(i, j));
  }
}

TEST(Dots, EachSumHasTheBitsOfTheSequentialDotWhateverItsPlaceInTheBlock) {
  // Values over many binades so that any reordering of a sum changes bits.
  std::vector<float> q(67), store(67 * 21);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::ldexp(float(std::sin(double(i) * 1.7)), int(i % 23) - 11);
  for (size_t i = 0; i < store.size(); ++i) store[i] = std::ldexp(float(std::cos(double(i) * 0.9)), int(i % 19) - 9);
  for (int64_t count : {0, 1, 7, 8, 9, 16, 21})
    for (int64_t n : {1, 5, 67}) {
      std::vector<const float*> rows;
      for (int64_t e = 0; e < count; ++e) rows.push_back(store.data() + ((e * 5) % 21) * 67);
      std::vector<float> got(size_t(count) + 1, -1.0f);
      dots(q.data(), rows.data(), count, n, got.data());
      for (int64_t e = 0; e < count; ++e)
        EXPECT_EQ(std::bit_cast<uint32_t>(got[size_t(e)]), std::bit_cast<uint32_t>(dot(q.data(), rows[size_t(e)], n)))
            << "count " << count << " n " << n << " entry " << e;
      EXPECT_EQ(got[size_t(count)], -1.0f);  // nothing past count is written
    }
}
