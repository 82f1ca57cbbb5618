#pragma once
// Arrays made by numpy itself (numpy.empty) and filled by copy, for every array ced._core returns.
// pybind11 2.10 (Debian 12's) reads a dtype's item size at numpy 1's descriptor layout, which numpy 2
// changed, and shapes its own arrays with strides from it: under numpy 2 such an int32 array has strides
// of 0 and reads as its first element repeated (ced.tokens gave [40, 40, ...]). numpy computes the strides
// of the arrays it makes, under either version.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace ced::python {

template <class T>
const char* numpy_dtype_name() {
  if constexpr (std::is_same_v<T, double>) return "float64";
  else if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, uint8_t>) return "uint8";
  else static_assert(sizeof(T) == 0, "numpy_array: a dtype numpy_dtype_name does not name");
}

// A C-contiguous array of the shape, its values copied from `data` (left uninitialised when null).
template <class T>
pybind11::array numpy_array(const std::vector<pybind11::ssize_t>& shape, const T* data = nullptr) {
  pybind11::ssize_t n = 1;
  for (pybind11::ssize_t d : shape) n *= d;
  pybind11::array a = pybind11::module_::import("numpy").attr("empty")(pybind11::tuple(pybind11::cast(shape)),
                                                                        numpy_dtype_name<T>());
  if (data && n > 0) std::memcpy(a.mutable_data(), data, sizeof(T) * static_cast<size_t>(n));
  return a;
}

}  // namespace ced::python
