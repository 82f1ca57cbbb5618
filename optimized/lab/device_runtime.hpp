#pragma once
// The few device-runtime services the optimized model uses: memory, copies,
// synchronisation and what the device holds. device_runtime_cuda.cpp
// implements them with the CUDA runtime; device_runtime_host.cpp with host
// memory for the host emulation (flavour.hpp). Errors throw
// std::runtime_error naming the call (CED_CUDA_CHECK on the device).
#include <cstddef>

#include "optimized/lab/flavour.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {
namespace rt {

// True iff a device can run the model; never throws.
bool device_available();
// Makes device 0 current.
void select_device();
// Free and total device memory in bytes.
void memory_info(size_t& free_bytes, size_t& total_bytes);

void* allocate(size_t bytes);
void release(void* p) noexcept;
// Every byte of [p, p + bytes) = v.
void fill(void* p, int v, size_t bytes);
void to_device(void* dst, const void* host_src, size_t bytes);
void to_host(void* host_dst, const void* src, size_t bytes);
// rows rows of `width` bytes, device to device, with row pitches in bytes.
void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows);
// Waits for every queued launch; reports faults they raised.
void synchronize();

}  // namespace rt
}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
