#pragma once
// docs/spec.md §3.9: the order-preserving matrix product of the reference.
// Y[n, m] = X[n, k] W[k, m] with every Y[i, j] the sum, k ascending from 0, of
// the rounded products X[i, k] · W[k, j], each added on its own (no fused
// multiply-add). Packing, the register tile, the k-panels, the vector width
// and the OpenMP split only change which memory an element's sum is kept in
// between two additions, never the additions, so every path gives the naive
// loop's bits.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ced::ref::gemm {

// The instruction sets a kernel is compiled for (each with
// __attribute__((target)), never -march=native).
enum class Isa { Naive, Sse2, Avx2, Avx512 };

const char* isa_name(Isa isa);
// Parses "naive", "sse2", "avx2", "avx512"; nullopt for anything else.
std::optional<Isa> parse_isa(const std::string& name);
// Whether this CPU runs `isa`.
bool isa_supported(Isa isa);
// Every Isa this CPU runs, Naive first.
std::vector<Isa> supported_isas();

// The path products take: the widest supported ISA, unless CED_GEMM_ISA
// names another (an unknown or unsupported name is refused with an
// InputError at the first product) or force_isa() was called.
Isa active_isa();
// Forces `isa` for every later product (throws InputError if this CPU does
// not run it); nullopt returns to the default.
void force_isa(std::optional<Isa> isa);

// The panel depth: k-panel boundaries at multiples of it (tests cross them).
constexpr int64_t kPanelDepth = 256;

// The blocking of every ISA path (tests cross its edges too). MC: rows per
// task, a packed X block staying in L2; a product of more rows than one block
// packs W, one of fewer reads W in place.
constexpr int64_t kRowBlock = 64;
// Columns per task, rounded up to the strip width NR (4 to 16 lanes, each
// dividing it).
constexpr int64_t kColumnChunk = 256;
// The most a packed block of W takes: W is packed one column block at a time,
// as many column chunks as fit this at depth k, at least one chunk.
constexpr int64_t kPackedBytes = 16 << 20;

// Planted differences for the test that shows the bit comparison failing;
// never used outside tests.
enum class Plant { None, Fused, PanelsDescending };

// One product's operands: Y[n, m] = X[n, k] W[k, m], each matrix row-major
// with its own row stride (element (i, j) of X at X[i * ldx + j]), so that a
// product reads or writes a block of a larger matrix in place.
// accumulate: every Y[i, j] continues the sum it already holds, its k terms
// added after the earlier ones in the same order, instead of starting from 0;
// a sum split over two products so gives the bits of the one sum over the
// concatenated terms.
template <class T>
struct Operands {
  const T* X = nullptr;
  int64_t ldx = 0;
  const T* W = nullptr;
  int64_t ldw = 0;
  T* Y = nullptr;
  int64_t ldy = 0;
  int64_t n = 0, k = 0, m = 0;
  bool accumulate = false;
};

// Dense operands: row strides k, m and m.
template <class T>
Operands<T> dense(const T* X, int64_t n, int64_t k, const T* W, int64_t m, T* Y) {
  return {X, k, W, m, Y, m, n, k, m, false};
}

// The blocked product with the given ISA and plant (tests); gemm() uses
// active_isa(), no plant and kPackedBytes. packed_bytes: the most a packed
// block of W takes (tests shrink it to have several column blocks in a product
// of a few thousand multiply-adds).
template <class T>
void gemm_with(Isa isa, Plant plant, const Operands<T>& o, bool parallel, int64_t packed_bytes = kPackedBytes);

template <class T>
void gemm(const Operands<T>& o, bool parallel);

template <class T>
void gemm(const T* X, int64_t n, int64_t k, const T* W, int64_t m, T* Y, bool parallel) {
  gemm(dense(X, n, k, W, m, Y), parallel);
}

// columns[x * ld + e] = rows[e][x] for e < count, x < dim: count vectors as
// the columns of a [dim, count] matrix (row stride ld >= count), the right
// operand that meets queries in q · entry products. A data move, on the
// active ISA's registers.
template <class T>
void transpose_rows(const T* const* rows, int64_t count, int64_t dim, T* columns, int64_t ld);

}  // namespace ced::ref::gemm
