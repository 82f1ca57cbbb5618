// The projector of projector.hpp.
#include "optimized/lab/projector.hpp"

#include <algorithm>

#include "optimized/lab/device_runtime.hpp"
#include "optimized/lab/kernels.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

Projector::Projector(CudaPrecision prec, int64_t max_in, int64_t max_out)
    : bf16_(prec == CudaPrecision::BF16), blas_(bf16_) {
  xs_.allocate(kTile * max_in);
  ys_.allocate(kTile * max_out);
  xs_.fill_bytes(0);
  ys_.fill_bytes(0);
  if (bf16_) {
    xb_.allocate(kTile * max_in);
    xb_.fill_bytes(0);
  }
}

void Projector::operator()(const float* X, int64_t ldx, int64_t n, const DevMat& W, float* Y, int64_t ldy) {
  const int64_t in = W.rows, out = W.cols;
  const size_t fs = sizeof(float);
  for (int64_t i0 = 0; i0 < n; i0 += kTile) {
    const int64_t rows = std::min(kTile, n - i0);
    // Column-major view: Y^T [out, kTile] = W^T [out, in] · X^T [in, kTile].
    if (bf16_) {
      f32_to_bf16(X + i0 * ldx, ldx, xb_.get(), rows, in);
      blas_.gemm_bf16(Op::N, Op::N, out, kTile, in, 1.0f, W.bf16.get(), out, xb_.get(), in, 0.0f, ys_.get(), out);
    } else {
      rt::copy_rows(xs_.get(), size_t(in) * fs, X + i0 * ldx, size_t(ldx) * fs, size_t(in) * fs, size_t(rows));
      blas_.gemm_f32(Op::N, Op::N, out, kTile, in, 1.0f, W.f32.get(), out, xs_.get(), in, 0.0f, ys_.get(), out);
    }
    rt::copy_rows(Y + i0 * ldy, size_t(ldy) * fs, ys_.get(), size_t(out) * fs, size_t(out) * fs, size_t(rows));
  }
}

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
