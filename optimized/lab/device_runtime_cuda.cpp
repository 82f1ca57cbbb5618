// device_runtime.hpp on the CUDA runtime.
#include <cuda_runtime_api.h>

#include "optimized/lab/cuda_check.hpp"
#include "optimized/lab/device_runtime.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {
namespace rt {

bool device_available() {
  try {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // clear it; nothing else of ours ran
      return false;
    }
    return n > 0;
  } catch (...) {
    return false;
  }
}

void select_device() { CED_CUDA_CHECK(cudaSetDevice(0)); }

void memory_info(size_t& free_bytes, size_t& total_bytes) { CED_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes)); }

void* allocate(size_t bytes) {
  void* p = nullptr;
  CED_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void release(void* p) noexcept {
  if (p) (void)cudaFree(p);  // nothing useful to do with an error while releasing
}

void fill(void* p, int v, size_t bytes) { CED_CUDA_CHECK(cudaMemset(p, v, bytes)); }

void to_device(void* dst, const void* host_src, size_t bytes) {
  CED_CUDA_CHECK(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
}

void to_host(void* host_dst, const void* src, size_t bytes) {
  CED_CUDA_CHECK(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
}

void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) {
  CED_CUDA_CHECK(cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice));
}

void synchronize() { CED_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace rt
}  // namespace CED_FLAVOUR
}  // namespace ced::cuda

namespace ced {
bool cuda_device_available() { return cuda::rt::device_available(); }
}  // namespace ced
