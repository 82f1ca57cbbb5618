#pragma once
// The CUDA backend built for the host (flavour.hpp): the same engine, forward
// pass, launchers and kernel bodies as the device build, with host memory,
// every kernel run block by block on the CPU, and a host GEMM with cuBLAS's
// conventions in place of cuBLAS. No CUDA toolkit is needed to build it. It
// proves the control flow, indexing and per-row maths of the CUDA model; it
// cannot prove what only a device shows (races between threads, warp
// semantics, cuBLAS's own results, timing).
#include <cstdint>
#include <memory>

#include "models/lab/config.hpp"
#include "model/run.hpp"
#include "optimized/lab/cuda_backend.hpp"

namespace ced {

// The host-emulated CUDA backend (name "cuda", dtype of the precision).
std::unique_ptr<Backend> make_cuda_host_backend(const Config& config, uint64_t weight_seed,
                                                CudaPrecision precision = CudaPrecision::F32);

}  // namespace ced
