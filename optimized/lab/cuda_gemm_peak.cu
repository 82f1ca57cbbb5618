// cuda_gemm_peak: the device's cuBLAS GEMM rate, measured, so that `ced bench`
// figures can be read as a fraction of what this GPU really does (not of a
// datasheet). Two precisions, the ones the CUDA backend uses:
//   f32:  cublasSgemm with CUBLAS_PEDANTIC_MATH (IEEE f32 products, no TF32)
//   bf16: cublasGemmEx, bf16 inputs, f32 accumulation and output (COMPUTE_32F)
// at a large square shape (the peak) and at the backend's own shape: the
// projector multiplies tiles of 128 rows, Y^T[out, 128] = W^T[out, in] X^T[in, 128].
// Data are pseudo-random (zeros run faster on some GPUs). Each shape: 3 warm-up
// products, then the median of 10 timed with CUDA events.
//
// Output: one JSON object on stdout. Exit 0; 77 with "SKIP: no CUDA device"
// on a machine without a device (CTest's skip code); 1 on a CUDA error.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "optimized/lab/cuda_check.hpp"

namespace {

// splitmix64 of the index, scaled to [-1, 1): cheap, reproducible, not zero.
__device__ inline float pseudo_random(uint64_t i) {
  uint64_t z = i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(double(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

__global__ void fill_f32(float* x, uint64_t n, uint64_t salt) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    x[i] = pseudo_random(i + salt);
}

__global__ void fill_bf16(__nv_bfloat16* x, uint64_t n, uint64_t salt) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16(pseudo_random(i + salt));
}

struct Shape {
  const char* what;
  int m, n, k;
};

struct Buffers {
  void* a = nullptr;
  void* b = nullptr;
  float* c = nullptr;
  ~Buffers() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
};

// Median milliseconds of one product C[m, n] = A[m, k] B[k, n] (column-major).
double time_gemm(cublasHandle_t h, bool bf16, const Shape& s) {
  Buffers buf;
  const size_t na = size_t(s.m) * s.k, nb = size_t(s.k) * s.n, nc = size_t(s.m) * s.n;
  const size_t elem = bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
  CED_CUDA_CHECK(cudaMalloc(&buf.a, na * elem));
  CED_CUDA_CHECK(cudaMalloc(&buf.b, nb * elem));
  CED_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&buf.c), nc * sizeof(float)));
  if (bf16) {
    fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(buf.a), na, 1);
    fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(buf.b), nb, 1u << 30);
  } else {
    fill_f32<<<1024, 256>>>(static_cast<float*>(buf.a), na, 1);
    fill_f32<<<1024, 256>>>(static_cast<float*>(buf.b), nb, 1u << 30);
  }
  CED_CUDA_CHECK(cudaGetLastError());
  CED_CUDA_CHECK(cublasSetMathMode(h, bf16 ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH));
  const float alpha = 1.0f, beta = 0.0f;
  auto product = [&] {
    if (bf16)
      CED_CUDA_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s.m, s.n, s.k, &alpha, buf.a, CUDA_R_16BF, s.m, buf.b,
                                  CUDA_R_16BF, s.k, &beta, buf.c, CUDA_R_32F, s.m, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    else
      CED_CUDA_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, s.m, s.n, s.k, &alpha, static_cast<float*>(buf.a), s.m,
                                 static_cast<float*>(buf.b), s.k, &beta, buf.c, s.m));
  };
  for (int i = 0; i < 3; ++i) product();
  cudaEvent_t t0, t1;
  CED_CUDA_CHECK(cudaEventCreate(&t0));
  CED_CUDA_CHECK(cudaEventCreate(&t1));
  std::vector<double> ms;
  for (int i = 0; i < 10; ++i) {
    CED_CUDA_CHECK(cudaEventRecord(t0));
    product();
    CED_CUDA_CHECK(cudaEventRecord(t1));
    CED_CUDA_CHECK(cudaEventSynchronize(t1));
    float t = 0;
    CED_CUDA_CHECK(cudaEventElapsedTime(&t, t0, t1));
    ms.push_back(t);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  std::sort(ms.begin(), ms.end());
  return (ms[4] + ms[5]) / 2;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  try {
    cudaDeviceProp prop{};
    CED_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    cublasHandle_t h = nullptr;
    CED_CUDA_CHECK(cublasCreate(&h));
    // The projector's shapes on the `bench` config (d = 1024): a 128-row tile
    // through a d x d and a d x 4d weight; and the square peak.
    const Shape shapes[] = {{"peak", 8192, 8192, 8192}, {"tile128-1024x1024", 1024, 128, 1024},
                            {"tile128-1024x4096", 4096, 128, 1024}};
    std::printf("{\"device\": \"%s\", \"sm\": \"%d.%d\", \"results\": [", prop.name, prop.major, prop.minor);
    bool first = true;
    for (const bool bf16 : {false, true})
      for (const Shape& s : shapes) {
        const double ms = time_gemm(h, bf16, s);
        const double tflops = 2.0 * s.m * s.n * double(s.k) / (ms * 1e-3) / 1e12;
        std::printf("%s\n  {\"dtype\": \"%s\", \"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"ms\": %.4f, "
                    "\"tflops\": %.2f}",
                    first ? "" : ",", bf16 ? "bf16" : "f32", s.what, s.m, s.n, s.k, ms, tflops);
        first = false;
      }
    std::printf("\n]}\n");
    cublasDestroy(h);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_gemm_peak: %s\n", e.what());
    return 1;
  }
  return 0;
}
