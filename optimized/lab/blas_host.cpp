// blas.hpp for the host emulation: the plain triple loop with cuBLAS's
// conventions (column-major, op(A) [m, k] with op = N or T, beta = 0 leaves C
// unread). Each C element sums its k products in index order in f32; cuBLAS
// picks its own order, so the two agree to f32 rounding, not bitwise.
// The bf16 path multiplies the bf16 values exactly as f32 (a bf16 value is an
// f32 with a short mantissa) and accumulates in f32, as CUBLAS_COMPUTE_32F does.
#include "optimized/lab/blas.hpp"
#include "optimized/lab/device_math.cuh"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

struct Blas::Handle {};

namespace {

inline float value(float x) { return x; }
inline float value(uint16_t b) { return bf16_to_float(b); }

// Element (i, j) of op(X) for X column-major with leading dimension ld.
template <class T>
inline float at(const T* X, int64_t ld, Op o, int64_t i, int64_t j) {
  return value(o == Op::N ? X[i + j * ld] : X[j + i * ld]);
}

template <class T>
void gemm(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.0f;
      for (int64_t l = 0; l < k; ++l) acc += at(A, lda, ta, i, l) * at(B, ldb, tb, l, j);
      float& c = C[i + j * ldc];
      c = beta == 0.0f ? alpha * acc : alpha * acc + beta * c;
    }
}

}  // namespace

Blas::Blas(bool) : h_(std::make_unique<Handle>()) {}
Blas::~Blas() = default;

void Blas::gemm_f32(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
                    const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void Blas::gemm_bf16(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* A, int64_t lda,
                     const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
