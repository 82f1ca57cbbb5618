#pragma once
// Device memory owned by one object (on the host emulation, host memory).
#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <utility>

#include "optimized/lab/device_runtime.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(int64_t n) { allocate(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  void allocate(int64_t n) {
    release();
    if (n > 0) {
      p_ = static_cast<T*>(rt::allocate(bytes(n)));
      n_ = n;
    }
  }
  // Every byte = v (0xFF: NaN for floats, −1 for int32).
  void fill_bytes(int v) {
    if (n_ > 0) rt::fill(p_, v, bytes(n_));
  }
  // The first `count` elements = 0.
  void zero(int64_t count) {
    bounds(count, 0);
    if (count > 0) rt::fill(p_, 0, bytes(count));
  }
  void upload(const T* host, int64_t count, int64_t offset = 0) {
    bounds(count, offset);
    if (count > 0) rt::to_device(p_ + offset, host, bytes(count));
  }
  void download(T* host, int64_t count, int64_t offset = 0) const {
    bounds(count, offset);
    if (count > 0) rt::to_host(host, p_ + offset, bytes(count));
  }
  T* get() const { return p_; }
  int64_t size() const { return n_; }

 private:
  static size_t bytes(int64_t n) { return static_cast<size_t>(n) * sizeof(T); }
  void bounds(int64_t count, int64_t offset) const {
    if (count < 0 || offset < 0 || offset + count > n_)
      throw std::logic_error(fmt::format("CUDA backend: copy of {} elements at {} outside a buffer of {}", count,
                                         offset, n_));
  }
  void release() noexcept {
    rt::release(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
