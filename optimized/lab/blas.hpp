#pragma once
// The matrix products the projector needs, with cuBLAS's conventions:
// column-major operands, C [m, n] = alpha · op(A) [m, k] · op(B) [k, n] + beta · C
// (beta = 0: C is not read), leading dimensions in elements.
// blas_cublas.cpp runs them through cuBLAS (cublasSgemm, cublasGemmEx);
// blas_host.cpp is the host emulation's stand-in (flavour.hpp).
#include <cstdint>
#include <memory>

#include "optimized/lab/flavour.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

enum class Op { N, T };  // op(X) = X or Xᵀ

class Blas {
 public:
  // bf16_math: the bf16 product may use the library's default math; otherwise
  // f32 products are pedantic (IEEE f32 products, no TF32).
  explicit Blas(bool bf16_math);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // f32 operands and result (cublasSgemm).
  void gemm_f32(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
  // bf16 operands (bits), f32 accumulation and result (cublasGemmEx with
  // CUDA_R_16BF inputs, CUDA_R_32F output, CUBLAS_COMPUTE_32F).
  void gemm_bf16(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* A, int64_t lda,
                 const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

 private:
  struct Handle;
  std::unique_ptr<Handle> h_;
};

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
