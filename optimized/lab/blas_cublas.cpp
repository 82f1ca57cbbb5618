// blas.hpp through cuBLAS.
#include <cublas_v2.h>

#include "optimized/lab/blas.hpp"
#include "optimized/lab/cuda_check.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

struct Blas::Handle {
  cublasHandle_t h = nullptr;
  Handle() { CED_CUDA_CHECK(cublasCreate(&h)); }
  ~Handle() {
    if (h) (void)cublasDestroy(h);
  }
};

namespace {
cublasOperation_t op(Op o) { return o == Op::T ? CUBLAS_OP_T : CUBLAS_OP_N; }
}  // namespace

Blas::Blas(bool bf16_math) : h_(std::make_unique<Handle>()) {
  // F32: pedantic math (IEEE f32 products, no TF32). BF16: bf16 inputs with f32 compute (CUBLAS_COMPUTE_32F).
  CED_CUDA_CHECK(cublasSetMathMode(h_->h, bf16_math ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH));
  CED_CUDA_CHECK(cublasSetPointerMode(h_->h, CUBLAS_POINTER_MODE_HOST));
}

Blas::~Blas() = default;

void Blas::gemm_f32(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
                    const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  CED_CUDA_CHECK(cublasSgemm(h_->h, op(ta), op(tb), int(m), int(n), int(k), &alpha, A, int(lda), B, int(ldb), &beta,
                             C, int(ldc)));
}

void Blas::gemm_bf16(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* A, int64_t lda,
                     const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  CED_CUDA_CHECK(cublasGemmEx(h_->h, op(ta), op(tb), int(m), int(n), int(k), &alpha, A, CUDA_R_16BF, int(lda), B,
                              CUDA_R_16BF, int(ldb), &beta, C, CUDA_R_32F, int(ldc), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
