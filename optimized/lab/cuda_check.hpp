#pragma once
// The one checking macro for every CUDA runtime and cuBLAS call:
// CED_CUDA_CHECK(expr) throws std::runtime_error naming the expression, the
// file, the line and the library's own description of the error.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace ced::cuda {

[[noreturn]] inline void throw_check_failure(const std::string& why, const char* expr, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA backend: ") + expr + " failed at " + file + ":" + std::to_string(line) +
                           ": " + why);
}

inline void check(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess)
    throw_check_failure(std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")", expr, file, line);
}

inline void check(cublasStatus_t s, const char* expr, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw_check_failure(std::string(cublasGetStatusName(s)) + " (" + cublasGetStatusString(s) + ")", expr, file,
                        line);
}

}  // namespace ced::cuda

#define CED_CUDA_CHECK(expr) ::ced::cuda::check((expr), #expr, __FILE__, __LINE__)
