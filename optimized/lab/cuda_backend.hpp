#pragma once
// The optimized CUDA model (docs/spec.md §3–§6 on the device), behind ced::Backend:
// the twin of reference/lab/backend.hpp. A plain C++ header (no CUDA types): the
// tools include it with the host compiler.
// It is an independent implementation: nothing in optimized/lab/ includes reference/.
#include <cstdint>
#include <memory>
#include <string>

#include "models/lab/config.hpp"
#include "model/error.hpp"
#include "model/run.hpp"

namespace ced {

// F32: every tensor and every product in f32 (cuBLAS pedantic math: no TF32).
// BF16: the projections (every weight matrix but the embedding) take bf16
// weights and bf16-rounded activations with f32 accumulation and f32 output;
// everything else (norms, RoPE, compressor, indexer scores, attention,
// routing, residual stream, caches) stays f32.
enum class CudaPrecision { F32, BF16 };

// "f32" | "bf16": the dtype a backend of this precision reports (docs/spec.md §9).
inline const char* cuda_precision_name(CudaPrecision p) { return p == CudaPrecision::BF16 ? "bf16" : "f32"; }
// "f32" | "bf16"; InputError otherwise.
inline CudaPrecision parse_cuda_precision(const std::string& s) {
  if (s == "f32") return CudaPrecision::F32;
  if (s == "bf16") return CudaPrecision::BF16;
  throw InputError("CUDA precision: '" + s + "' is not one of f32, bf16");
}

// True iff the CUDA runtime reports at least one device. False on any error
// (no driver, no device, a too-old driver); never aborts, never throws.
bool cuda_device_available();

// The CUDA backend (name "cuda"). Generates the docs/spec.md §2 weights on the host
// and uploads them once. Throws NotSupported when there is no CUDA device or
// the weights do not fit in the device's free memory (the message gives the
// estimate), InputError for an invalid config.
std::unique_ptr<Backend> make_cuda_backend(const Config& config, uint64_t weight_seed,
                                           CudaPrecision precision = CudaPrecision::F32);

}  // namespace ced
