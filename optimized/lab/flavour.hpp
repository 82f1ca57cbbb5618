#pragma once
// The optimized model is built twice from the same sources: for the device
// (CUDA runtime, cuBLAS, the kernels of kernels.cu) and, with
// CED_CUDA_HOST_EMULATION defined, for the host (host memory, a host GEMM with
// cuBLAS's conventions, the kernels' block bodies run block by block on the
// CPU: kernels_host.cpp). Each build puts its symbols in its own inline
// namespace, so the two never collide, even in one binary.
#if defined(CED_CUDA_HOST_EMULATION)
#define CED_FLAVOUR host_emulation
#else
#define CED_FLAVOUR device
#endif
