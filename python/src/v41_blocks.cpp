// ced._core's v41 building blocks, one function each: the reference's FP4 quantizers, candidate pool, Engram
// primes and multipliers and bounded CED tail, so that a test can hold them against the serving engines' own
// CPU-runnable pieces (python/tests/test_v41_engine_blocks.py). Each calls the function the reference runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "models/v41/config.hpp"
#include "python/src/numpy_arrays.hpp"
#include "reference/v41/forward.hpp"
#include "reference/v41/forward_ops.hpp"
#include "models/v41/numerics.hpp"
#include "models/v41/plan.hpp"

namespace py = pybind11;
using namespace ced::v41;

namespace {

using Floats = py::array_t<float, py::array::c_style | py::array::forcecast>;
using Doubles = py::array_t<double, py::array::c_style | py::array::forcecast>;
using Ints = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// An in-place quantizer of [rows, K] on a copy of x (the last dimension K), returned in x's shape.
template <void (*qdq)(std::span<float>, int64_t)>
py::array quantized(const Floats& x) {
  py::array out = ced::python::numpy_array(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()), x.data());
  qdq(std::span<float>(static_cast<float*>(out.mutable_data()), static_cast<size_t>(x.size())), x.shape(x.ndim() - 1));
  return out;
}

}  // namespace

void bind_v41_blocks(py::module_& m) {
  m.def("v41_fp4_qdq_ue8m0_32", &quantized<fp4_qdq_ue8m0_32>,
        "FP4 e2m1 with one ue8m0 scale per 32, quantized and back (the index queries and keys): x [..., K] bf16 values.");
  m.def("v41_fp4_qdq_e4m3_16", &quantized<fp4_qdq_e4m3_16>,
        "FP4 e2m1 with one e4m3 scale per 16, quantized and back (the compressed KV): x [..., K] bf16 values.");
  m.def("v41_candidate_mask", [](const Doubles& scores, const Ints& visible, int64_t topk_blocks, int64_t block_size) {
    const py::ssize_t rows = scores.shape(0), T = scores.shape(1);
    py::array mask = ced::python::numpy_array<uint8_t>({rows, T});
    uint8_t* m = static_cast<uint8_t*>(mask.mutable_data());
    for (py::ssize_t t = 0; t < rows; ++t)
      fwd::candidate_blocks(std::span<const double>(scores.data() + t * T, static_cast<size_t>(T)), visible.at(t),
                            topk_blocks, block_size, true,
                            std::span<uint8_t>(m + t * T, static_cast<size_t>(T)));
    return mask;
  }, "The candidate source's pool (select_candidate_blocks) per row: scores [rows, T] (-inf past the row's causal "
     "length), visible [rows] its compress length; mask [rows, T] of 0/1.");
  m.def("v41_engram_primes", [](const std::string& config) { return v41_engram_primes(v41_builtin_config(config)); },
        "A built-in's Engram bucket primes: per Engram layer, (max_ngram_size - 1) * n_heads in (n-gram, head) order.");
  m.def("v41_engram_multipliers",
        [](const std::string& config) { return v41_engram_multipliers(v41_builtin_config(config)); },
        "A built-in's Engram hash multipliers: [engram layers][max_ngram_size].");
  m.def("v41_tail_layout", [](const std::string& config, const std::string& convention, int64_t n, int64_t speculative) {
    const V41Plan p = make_v41_plan(v41_builtin_config(config));
    const V41ReplayConvention& c = v41_replay_convention(convention);
    const int64_t tail = v41_bounded_tail(p, c, speculative);
    const int64_t first = std::max<int64_t>(0, n - tail);  // V41Model::forward_ced's first replayed row
    return py::dict(py::arg("tail") = tail, py::arg("first_row") = first, py::arg("floor") = first,
                    py::arg("floored_layers") = v41_floored_layers(p, c), py::arg("L") = p.L, py::arg("W") = p.W);
  }, "A bounded CED replay of an n-token prompt: the tail's length, its first row, the window floor of the floored "
     "layers (the first row) and how many layers are floored.");
}
