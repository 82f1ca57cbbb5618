// docs/spec.md §3.9: every path of the blocked product gives, element by
// element, the bits of the sequential sum over k ascending, whatever the tile
// edges, the k-panel boundaries, the vector width and the threads; and the
// comparison that says so catches a fused multiply-add or a reordered k.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <vector>

#include "model/error.hpp"
#include "reference/lab/gemm.hpp"

namespace ced::ref::gemm {
namespace {

constexpr int64_t P = kPanelDepth;

struct Shape {
  int64_t n, k, m;
};
// Odd sizes around the streaming limit (4 rows), the register tiles (4 rows x
// 2 vectors on sse2/avx2, 8 rows x 1 vector on avx512; up to 16 lanes), the
// row block (64), the column chunk (256) and the k-panel boundaries.
const Shape kShapes[] = {{1, 1, 1},      {1, 7, 33},       {3, 5, 2},       {5, P - 1, 17},   {4, P, 16},
                         {7, P + 1, 31}, {13, 2 * P + 3, 9}, {65, 67, 257}, {66, P + 5, 40}, {2, 3 * P, 130},
                         {129, 19, 3},   {9, 1, 300},      {8, P + 2, 64},  {17, 33, 24}};

// Values over many binades with signed zeros, so that any change of order or
// of rounding shows in the bits. The seed is fixed and printed on failure.
template <class T>
std::vector<T> values(int64_t count, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d;
  std::uniform_int_distribution<int> e(-12, 12), z(0, 40);
  std::vector<T> v(static_cast<size_t>(count));
  for (auto& x : v) {
    const int pick = z(g);
    x = pick == 0 ? T(0) : pick == 1 ? T(-0.0) : T(std::ldexp(d(g), e(g)));
  }
  return v;
}

// The definition, written out here (the tree builds with -ffp-contract=off).
template <class T>
std::vector<T> definition(const std::vector<T>& X, const std::vector<T>& W, const Shape& s) {
  std::vector<T> Y(static_cast<size_t>(s.n * s.m));
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t j = 0; j < s.m; ++j) {
      T acc = 0;
      for (int64_t kk = 0; kk < s.k; ++kk) acc += X[size_t(i * s.k + kk)] * W[size_t(kk * s.m + j)];
      Y[size_t(i * s.m + j)] = acc;
    }
  return Y;
}

// How many elements differ in their bits.
template <class T>
int64_t bit_differences(const std::vector<T>& a, const std::vector<T>& b) {
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return d;
}

template <class T>
int64_t differences_from_definition(Isa isa, Plant plant, const Shape& s, bool parallel, uint64_t seed) {
  const auto X = values<T>(s.n * s.k, seed), W = values<T>(s.k * s.m, seed + 1);
  std::vector<T> Y(static_cast<size_t>(s.n * s.m), T(7));  // not zero: the product must overwrite it
  gemm_with(isa, plant, dense(X.data(), s.n, s.k, W.data(), s.m, Y.data()), parallel);
  return bit_differences(Y, definition(X, W, s));
}

template <class T>
class GemmPaths : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(GemmPaths, Scalars);

TYPED_TEST(GemmPaths, EverySupportedIsaGivesTheSequentialSumsBitsOnEveryShape) {
  omp_set_num_threads(3);  // an uneven split of the row blocks and column chunks
  for (Isa isa : supported_isas())
    for (const Shape& s : kShapes)
      for (bool parallel : {false, true}) {
        const uint64_t seed = uint64_t(s.n * 1000003 + s.k * 1009 + s.m);
        EXPECT_EQ(differences_from_definition<TypeParam>(isa, Plant::None, s, parallel, seed), 0)
            << isa_name(isa) << " n=" << s.n << " k=" << s.k << " m=" << s.m << " parallel=" << parallel
            << " seed=" << seed;
      }
}

TYPED_TEST(GemmPaths, AFusedMultiplyAddOrAReorderedKIsCaughtOnEveryIsa) {
  // The plants reach the same kernels through the same driver; the comparison
  // above must see them. k spans three panels so that reordering panels moves
  // additions.
  // Two rows take the streaming path, nine the blocked one.
  for (const Shape& s : {Shape{9, 3 * P - 5, 37}, Shape{2, 3 * P - 5, 37}})
    for (Isa isa : supported_isas()) {
      EXPECT_GT(differences_from_definition<TypeParam>(isa, Plant::Fused, s, false, 11), 0)
          << isa_name(isa) << " n=" << s.n;
      EXPECT_GT(differences_from_definition<TypeParam>(isa, Plant::PanelsDescending, s, false, 11), 0)
          << isa_name(isa) << " n=" << s.n;
    }
}

// Operands inside larger matrices (row strides above the widths) and a sum
// continued from what Y holds: Y = Y0 + X W, each element Y0[i, j] followed by
// its k products in order. The padding around each block is a sentinel that
// must survive.
template <class T>
int64_t strided_differences(Isa isa, const Shape& s, bool accumulate, bool parallel, uint64_t seed) {
  const int64_t ldx = s.k + 3, ldw = s.m + 5, ldy = s.m + 2;
  const T sentinel = T(-7.25);
  auto X = values<T>(s.n * ldx, seed), W = values<T>(s.k * ldw, seed + 1), Y0 = values<T>(s.n * ldy, seed + 2);
  std::vector<T> Y = Y0;
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t j = s.m; j < ldy; ++j) Y[size_t(i * ldy + j)] = sentinel;
  Operands<T> o{X.data(), ldx, W.data(), ldw, Y.data(), ldy, s.n, s.k, s.m, accumulate};
  gemm_with(isa, Plant::None, o, parallel);
  int64_t d = 0;
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t j = 0; j < ldy; ++j) {
      T want = sentinel;
      if (j < s.m) {
        want = accumulate ? Y0[size_t(i * ldy + j)] : T(0);
        for (int64_t kk = 0; kk < s.k; ++kk) want += X[size_t(i * ldx + kk)] * W[size_t(kk * ldw + j)];
      }
      d += std::memcmp(&want, &Y[size_t(i * ldy + j)], sizeof(T)) != 0;
    }
  return d;
}

TYPED_TEST(GemmPaths, StridedOperandsAndAContinuedSumGiveTheSequentialSumsBits) {
  omp_set_num_threads(3);
  for (Isa isa : supported_isas())
    for (const Shape& s : kShapes)
      for (bool accumulate : {false, true})
        for (bool parallel : {false, true}) {
          const uint64_t seed = uint64_t(s.n * 7919 + s.k * 104729 + s.m);
          EXPECT_EQ(strided_differences<TypeParam>(isa, s, accumulate, parallel, seed), 0)
              << isa_name(isa) << " n=" << s.n << " k=" << s.k << " m=" << s.m << " accumulate=" << accumulate
              << " parallel=" << parallel << " seed=" << seed;
        }
}

// W is packed one column block at a time, as many column chunks as fit
// kPackedBytes at depth k, and none of the shapes above has a second block
// (at one chunk a block that takes some 16k rows of W). With the budget shrunk
// to one chunk of k rows a block is one chunk (kColumnChunk columns, every
// strip width dividing it), and m = 2 chunks + 13 columns makes three blocks,
// the last ragged (13 columns: no whole strip on any ISA). kRowBlock + 1 rows
// pack W, 9 rows read it in place; k crosses a panel boundary; dense, and
// strided with a continued sum (the padding a sentinel that must survive);
// serial (row blocks x chunks) and on 3 threads (each thread packing strips
// of its own). The naive path has no blocks. (Blocks of two chunks, a chunk
// past the first in a block, are the shape {65, 67, 257} above.)
TYPED_TEST(GemmPaths, SeveralColumnBlocksWithARaggedLastOneGiveTheSequentialSumsBits) {
  using T = TypeParam;
  const int64_t k = P + 5, m = 2 * kColumnChunk + 13, budget = kColumnChunk * k * int64_t(sizeof(T));
  omp_set_num_threads(3);
  for (const bool strided : {false, true}) {
    const int64_t ldx = k + (strided ? 3 : 0), ldw = m + (strided ? 5 : 0), ldy = m + (strided ? 2 : 0);
    const auto W = values<T>(k * ldw, uint64_t(17 + strided));
    for (const int64_t n : {kRowBlock + 1, int64_t(9)}) {
      const uint64_t seed = uint64_t(n * 31 + strided);
      const auto X = values<T>(n * ldx, seed);
      std::vector<T> Y0 = values<T>(n * ldy, seed + 2);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = m; j < ldy; ++j) Y0[size_t(i * ldy + j)] = T(-7.25);
      // The definition: Y0 (continued) or 0, then the k products in order.
      std::vector<T> want = Y0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
          T acc = strided ? Y0[size_t(i * ldy + j)] : T(0);
          for (int64_t kk = 0; kk < k; ++kk) acc += X[size_t(i * ldx + kk)] * W[size_t(kk * ldw + j)];
          want[size_t(i * ldy + j)] = acc;
        }
      for (Isa isa : supported_isas()) {
        if (isa == Isa::Naive) continue;
        for (const bool parallel : {false, true}) {
          std::vector<T> Y = Y0;
          gemm_with(isa, Plant::None, Operands<T>{X.data(), ldx, W.data(), ldw, Y.data(), ldy, n, k, m, strided},
                    parallel, budget);
          EXPECT_EQ(bit_differences(Y, want), 0) << isa_name(isa) << " n=" << n << " k=" << k << " m=" << m
                                                 << (strided ? " strided, accumulating" : " dense")
                                                 << " parallel=" << parallel << " seed=" << seed;
        }
      }
    }
  }
}

TYPED_TEST(GemmPaths, TransposeRowsMovesEveryValueToItsColumnOnEveryIsa) {
  // Counts and widths around the register blocks (4 and 8) and their edges.
  for (Isa isa : supported_isas()) {
    force_isa(isa);
    for (int64_t count : {1, 7, 8, 9, 17, 130})
      for (int64_t dim : {1, 3, 8, 12, 64}) {
        const int64_t ld = count + 3;
        const auto v = values<TypeParam>(count * dim, uint64_t(count * 131 + dim));
        std::vector<const TypeParam*> rows(static_cast<size_t>(count));
        for (int64_t e = 0; e < count; ++e) rows[size_t(e)] = v.data() + e * dim;
        std::vector<TypeParam> columns(static_cast<size_t>(dim * ld), TypeParam(-7.25));
        transpose_rows(rows.data(), count, dim, columns.data(), ld);
        int64_t wrong = 0;
        for (int64_t x = 0; x < dim; ++x)
          for (int64_t e = 0; e < ld; ++e) {
            const TypeParam want = e < count ? v[size_t(e * dim + x)] : TypeParam(-7.25);
            wrong += std::memcmp(&want, &columns[size_t(x * ld + e)], sizeof(TypeParam)) != 0;
          }
        EXPECT_EQ(wrong, 0) << isa_name(isa) << " count=" << count << " dim=" << dim;
      }
  }
  force_isa(std::nullopt);
}

TEST(GemmIsa, TheNaiveAndBaselinePathsRunEverywhereAndNamesRoundTrip) {
  const auto isas = supported_isas();
  ASSERT_GE(isas.size(), 2u);
  EXPECT_EQ(isas[0], Isa::Naive);
  EXPECT_EQ(isas[1], Isa::Sse2);
  for (Isa i : {Isa::Naive, Isa::Sse2, Isa::Avx2, Isa::Avx512}) EXPECT_EQ(parse_isa(isa_name(i)), i);
  EXPECT_EQ(parse_isa("avx"), std::nullopt);
}

TEST(GemmIsa, ForcingAPathSelectsItAndAnUnsupportedOneIsRefused) {
  for (Isa i : supported_isas()) {
    force_isa(i);
    EXPECT_EQ(active_isa(), i);
  }
  for (Isa i : {Isa::Avx2, Isa::Avx512})
    if (!isa_supported(i)) EXPECT_THROW(force_isa(i), InputError) << isa_name(i);
  force_isa(std::nullopt);
  EXPECT_EQ(active_isa(), supported_isas().back());
}

}  // namespace
}  // namespace ced::ref::gemm
