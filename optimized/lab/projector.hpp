#pragma once
// Projections y = x W (every weight matrix of docs/spec.md §3) through the BLAS of
// blas.hpp (cuBLAS on the device).
//
// Every product runs in tiles of exactly kTile rows, staged through fixed,
// aligned buffers, so each cuBLAS call for a given weight has the same shape,
// leading dimensions and alignment whatever the number of rows or where they
// sit: cuBLAS then runs the same kernel, and a row's result does not depend on
// the other rows evaluated in the same call (batch invariance). cuBLAS is
// deterministic run to run on one stream with the same GPU model.
#include <cstdint>

#include "optimized/lab/blas.hpp"
#include "optimized/lab/cuda_backend.hpp"
#include "optimized/lab/device_buffer.hpp"
#include "optimized/lab/device_weights.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

class Projector {
 public:
  static constexpr int64_t kTile = 128;

  Projector(CudaPrecision prec, int64_t max_in, int64_t max_out);

  // Y[n, W.cols] (row stride ldy) = X[n, W.rows] (row stride ldx) · W.
  void operator()(const float* X, int64_t ldx, int64_t n, const DevMat& W, float* Y, int64_t ldy);

 private:
  bool bf16_;
  Blas blas_;
  DeviceBuffer<float> xs_, ys_;  // [kTile, max_in], [kTile, max_out]
  DeviceBuffer<uint16_t> xb_;    // [kTile, max_in] bf16
};

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
