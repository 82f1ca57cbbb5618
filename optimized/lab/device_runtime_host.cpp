// device_runtime.hpp for the host emulation (flavour.hpp): "device" memory is
// host memory, copies are memcpy, launches have finished when they return.
#include <cstdlib>
#include <cstring>
#include <new>

#include "optimized/lab/device_runtime.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {
namespace rt {

bool device_available() { return true; }

void select_device() {}

// The emulated device reports 64 GiB, far above what tiny and small need; the
// backend's capacity check then passes as it would on a large device.
void memory_info(size_t& free_bytes, size_t& total_bytes) {
  total_bytes = size_t(64) << 30;
  free_bytes = total_bytes;
}

void* allocate(size_t bytes) {
  void* p = std::malloc(bytes);
  if (!p) throw std::bad_alloc();
  return p;
}

void release(void* p) noexcept { std::free(p); }

void fill(void* p, int v, size_t bytes) { std::memset(p, v, bytes); }

void to_device(void* dst, const void* host_src, size_t bytes) { std::memcpy(dst, host_src, bytes); }

void to_host(void* host_dst, const void* src, size_t bytes) { std::memcpy(host_dst, src, bytes); }

void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) {
  for (size_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(dst) + i * dst_pitch, static_cast<const char*>(src) + i * src_pitch, width);
}

void synchronize() {}

}  // namespace rt
}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
