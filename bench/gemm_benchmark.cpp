// GEMM micro-benchmark (docs/spec.md §10, bench/): the order-preserving
// product of reference/lab/gemm.hpp on every ISA path this CPU runs, beside the
// machine's BLAS sgemm/dgemm (OpenBLAS through libblas.so.3 on Debian) when
// CMake found one, on the matrix shapes of the `bench` config's layer at
// N = 1024 positions. One thread on each side: run with
// OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 (BLAS reads them when it loads).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "reference/lab/gemm.hpp"

#ifdef CED_HAVE_CBLAS
#include <cblas.h>
#endif

namespace {

using ced::ref::gemm::Isa;

// {n, k, m} of Y[n, m] = X[n, k] W[k, m] for the bench config (d = 1024,
// q_lora_rank = 256, H·hd = 512, hd = 64, o_lora_rank·G = 512, moe_dim = 256,
// V = 8191) at N = 1024; routed experts see about N·2/8 rows.
const std::vector<std::vector<int64_t>> kShapes = {
    {1024, 1024, 256},  // wq_a, shared w1/w3
    {1024, 256, 512},   // wq_b
    {1024, 1024, 64},   // wkv, comp_wkv
    {1024, 512, 1024},  // wo_b
    {1024, 256, 1024},  // shared w2
    {256, 1024, 256},   // routed w1/w3
    {1, 1024, 8191},    // lm_head at the last position
};

template <class T>
struct Operands {
  std::vector<T> X, W, Y;
  Operands(int64_t n, int64_t k, int64_t m) : X(size_t(n * k)), W(size_t(k * m)), Y(size_t(n * m)) {
    std::mt19937_64 g(1);  // seed 1
    std::uniform_real_distribution<double> u(-1, 1);
    for (auto& x : X) x = T(u(g));
    for (auto& x : W) x = T(u(g));
  }
};

void set_flops(benchmark::State& st, int64_t n, int64_t k, int64_t m) {
  st.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(n * k * m) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void ordered(benchmark::State& st, Isa isa) {
  const int64_t n = st.range(0), k = st.range(1), m = st.range(2);
  Operands<T> o(n, k, m);
  for (auto _ : st) {
    ced::ref::gemm::gemm_with(isa, ced::ref::gemm::Plant::None, ced::ref::gemm::dense(o.X.data(), n, k, o.W.data(), m, o.Y.data()), false);
    benchmark::DoNotOptimize(o.Y.data());
  }
  set_flops(st, n, k, m);
}

#ifdef CED_HAVE_CBLAS
template <class T>
void blas(benchmark::State& st) {
  const int n = int(st.range(0)), k = int(st.range(1)), m = int(st.range(2));
  Operands<T> o(n, k, m);
  for (auto _ : st) {
    if constexpr (sizeof(T) == 8)
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, k, 1.0, o.X.data(), k, o.W.data(), m, 0.0,
                  o.Y.data(), m);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, k, 1.0f, o.X.data(), k, o.W.data(), m, 0.0f,
                  o.Y.data(), m);
    benchmark::DoNotOptimize(o.Y.data());
  }
  set_flops(st, n, k, m);
}
#endif

void apply_shapes(benchmark::internal::Benchmark* b) {
  for (const auto& s : kShapes) b->Args(s);
  b->ArgNames({"n", "k", "m"})->Unit(benchmark::kMillisecond);
}

void register_all() {
  for (Isa isa : ced::ref::gemm::supported_isas()) {
    if (isa == Isa::Naive) continue;  // the definition, far slower; not a candidate
    const std::string name = ced::ref::gemm::isa_name(isa);
    apply_shapes(benchmark::RegisterBenchmark(("ordered_f64/" + name).c_str(), ordered<double>, isa));
    apply_shapes(benchmark::RegisterBenchmark(("ordered_f32/" + name).c_str(), ordered<float>, isa));
  }
#ifdef CED_HAVE_CBLAS
  apply_shapes(benchmark::RegisterBenchmark("blas_dgemm", blas<double>));
  apply_shapes(benchmark::RegisterBenchmark("blas_sgemm", blas<float>));
#endif
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
