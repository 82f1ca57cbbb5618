// The CUDA kernels of the optimized model (docs/spec.md §3) and their checked
// launchers. Simple by design: each kernel mirrors one spec step, reductions
// run in a fixed order (no atomics), the per-element maths lives in
// device_math.cuh and each kernel's body in kernel_blocks.cuh, where the host
// build (kernels_host.cpp) runs it too. A kernel here only declares its shared
// memory and hands its block's coordinates to the body.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "optimized/lab/cuda_check.hpp"
#include "optimized/lab/device_math.cuh"
#include "optimized/lab/kernel_blocks.cuh"
#include "optimized/lab/kernels.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {
namespace {

// This thread's view of its block: the body runs the calling thread only.
__device__ inline BlockCtx this_block() {
  BlockCtx b;
  b.bx = blockIdx.x;
  b.by = blockIdx.y;
  b.gx = gridDim.x;
  b.gy = gridDim.y;
  b.nt = blockDim.x;
  b.t_begin = threadIdx.x;
  b.t_end = static_cast<int64_t>(threadIdx.x) + 1;
  return b;
}

__global__ void k_embed_rows(const int32_t* tokens, const float* embed, float* X, int64_t pos0, int64_t n, int64_t d) {
  embed_rows_block(this_block(), tokens, embed, X, pos0, n, d);
}

__global__ void k_rmsnorm_rows(const float* in, int64_t ld_in, const float* w, float* out, int64_t ld_out,
                               int64_t cols, float eps) {
  __shared__ float red[kNormThreads];
  rmsnorm_rows_block(this_block(), red, in, ld_in, w, out, ld_out, cols, eps);
}

__global__ void k_rope_rows(float* buf, int64_t ld, int64_t n, int64_t n_heads, int64_t dim, int64_t rope_dim,
                            int64_t pos0, int64_t pos_stride, const float* cos_tab, const float* sin_tab,
                            bool inverse) {
  rope_rows_block(this_block(), buf, ld, n, n_heads, dim, rope_dim, pos0, pos_stride, cos_tab, sin_tab, inverse);
}

__global__ void k_compress_blocks(const float* cbuf, const float* zbuf, int64_t j0, int64_t nb, int64_t r, int64_t hd,
                                  float* lat) {
  compress_blocks_block(this_block(), cbuf, zbuf, j0, nb, r, hd, lat);
}

__global__ void k_index_scores(const float* iq, const float* iw, int64_t p0, const float* keys, int64_t r,
                               int64_t HI, int64_t dI, float* scores, int64_t ld_s) {
  index_scores_block(this_block(), iq, iw, p0, keys, r, HI, dI, scores, ld_s);
}

__global__ void k_candidate_pool(const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r,
                                 int64_t block_size, int64_t topk_blocks, float* block_scores, int64_t ld_b,
                                 int32_t* pool) {
  candidate_pool_block(this_block(), scores, ld_s, nq, p0, r, block_size, topk_blocks, block_scores, ld_b, pool);
}

__global__ void k_select_topk(const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r, int64_t k,
                              const int32_t* pool, int64_t block_size, int64_t topk_blocks, int32_t* topk,
                              float* topk_scores) {
  select_topk_block(this_block(), scores, ld_s, nq, p0, r, k, pool, block_size, topk_blocks, topk, topk_scores);
}

// Dynamic shared memory: [W + k + hd] floats (see attention_block).
__global__ void k_attention(const float* q, int64_t pos0, int64_t first, int64_t W, const float* local,
                            const float* entries, const int32_t* topk, int64_t k, const float* sink, int64_t H,
                            int64_t hd, int64_t rope_dim, const float* cos_tab, const float* sin_tab, float scale,
                            float* out) {
  extern __shared__ float sh[];
  __shared__ int64_t sh_nsel;
  attention_block(this_block(), sh, &sh_nsel, q, pos0, first, W, local, entries, topk, k, sink, H, hd, rope_dim,
                  cos_tab, sin_tab, scale, out);
}

__global__ void k_route(const float* logits, const float* bias, int64_t n, int64_t R, int64_t A, float rsf,
                        float* scores, int32_t* chosen, float* weights) {
  route_block(this_block(), logits, bias, n, R, A, rsf, scores, chosen, weights);
}

__global__ void k_swiglu(float* h1, const float* h3, int64_t count) { swiglu_block(this_block(), h1, h3, count); }

__global__ void k_add_routed(float* acc, const float* y, const int32_t* chosen, const float* weights, int64_t expert,
                             int64_t A, int64_t n, int64_t d) {
  add_routed_block(this_block(), acc, y, chosen, weights, expert, A, n, d);
}

__global__ void k_add(float* acc, const float* y, int64_t count) { add_block(this_block(), acc, y, count); }

__global__ void k_scale(float* buf, int64_t count, float s) { scale_block(this_block(), buf, count, s); }

__global__ void k_f32_to_bf16(const float* in, int64_t ld_in, uint16_t* out, int64_t n, int64_t cols) {
  f32_to_bf16_block(this_block(), in, ld_in, out, n, cols);
}

}  // namespace

// A CUDA launch, checked for launch errors (faults surface at the next sync).
#define CED_LAUNCH(kernel, grid_x, grid_y, threads, shared_bytes, ...)                                     \
  do {                                                                                                   \
    const dim3 ced_grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));                   \
    k_##kernel<<<ced_grid, static_cast<unsigned>(threads), static_cast<size_t>(shared_bytes)>>>(__VA_ARGS__); \
    CED_CUDA_CHECK(cudaGetLastError());                                                                  \
  } while (0)

#include "optimized/lab/kernels.inl"

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
