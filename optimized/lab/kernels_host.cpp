// The host emulation of kernels.cu (flavour.hpp): the same launchers
// (kernels.inl) and the same kernel bodies (kernel_blocks.cuh), each grid run
// block by block on the CPU, each block's threads in turn phase by phase.
// Shared memory is fresh per block and starts as NaN (0xFF bytes), so a body
// that reads shared memory no thread of its block wrote shows in the outputs.
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "optimized/lab/device_math.cuh"
#include "optimized/lab/kernel_blocks.cuh"
#include "optimized/lab/kernels.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {
namespace {

// Runs body(block) for every block of a grid_x × grid_y grid of `threads` threads.
template <class Body>
void for_each_block(int64_t grid_x, int64_t grid_y, int64_t threads, Body&& body) {
  BlockCtx b;
  b.gx = grid_x;
  b.gy = grid_y;
  b.nt = threads;
  b.t_begin = 0;
  b.t_end = threads;
  for (b.by = 0; b.by < grid_y; ++b.by)
    for (b.bx = 0; b.bx < grid_x; ++b.bx) body(b);
}

template <class T>
std::vector<T> nan_shared(size_t count) {
  std::vector<T> v(count);
  std::memset(v.data(), 0xFF, count * sizeof(T));
  return v;
}

// One function per kernel of kernels.cu, with its shared memory.
void k_embed_rows(const BlockCtx& b, size_t, const int32_t* tokens, const float* embed, float* X, int64_t pos0,
                  int64_t n, int64_t d) {
  embed_rows_block(b, tokens, embed, X, pos0, n, d);
}
void k_rmsnorm_rows(const BlockCtx& b, size_t, const float* in, int64_t ld_in, const float* w, float* out,
                    int64_t ld_out, int64_t cols, float eps) {
  std::vector<float> red = nan_shared<float>(kNormThreads);
  rmsnorm_rows_block(b, red.data(), in, ld_in, w, out, ld_out, cols, eps);
}
void k_rope_rows(const BlockCtx& b, size_t, float* buf, int64_t ld, int64_t n, int64_t n_heads, int64_t dim,
                 int64_t rope_dim, int64_t pos0, int64_t pos_stride, const float* cos_tab, const float* sin_tab,
                 bool inverse) {
  rope_rows_block(b, buf, ld, n, n_heads, dim, rope_dim, pos0, pos_stride, cos_tab, sin_tab, inverse);
}
void k_compress_blocks(const BlockCtx& b, size_t, const float* cbuf, const float* zbuf, int64_t j0, int64_t nb,
                       int64_t r, int64_t hd, float* lat) {
  compress_blocks_block(b, cbuf, zbuf, j0, nb, r, hd, lat);
}
void k_index_scores(const BlockCtx& b, size_t, const float* iq, const float* iw, int64_t p0, const float* keys,
                    int64_t r, int64_t HI, int64_t dI, float* scores, int64_t ld_s) {
  index_scores_block(b, iq, iw, p0, keys, r, HI, dI, scores, ld_s);
}
void k_candidate_pool(const BlockCtx& b, size_t, const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r,
                      int64_t block_size, int64_t topk_blocks, float* block_scores, int64_t ld_b, int32_t* pool) {
  candidate_pool_block(b, scores, ld_s, nq, p0, r, block_size, topk_blocks, block_scores, ld_b, pool);
}
void k_select_topk(const BlockCtx& b, size_t, const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r,
                   int64_t k, const int32_t* pool, int64_t block_size, int64_t topk_blocks, int32_t* topk,
                   float* topk_scores) {
  select_topk_block(b, scores, ld_s, nq, p0, r, k, pool, block_size, topk_blocks, topk, topk_scores);
}
void k_attention(const BlockCtx& b, size_t shared_bytes, const float* q, int64_t pos0, int64_t first, int64_t W,
                 const float* local, const float* entries, const int32_t* topk, int64_t k, const float* sink,
                 int64_t H, int64_t hd, int64_t rope_dim, const float* cos_tab, const float* sin_tab, float scale,
                 float* out) {
  std::vector<float> sh = nan_shared<float>(shared_bytes / sizeof(float));
  int64_t nsel = -1;
  attention_block(b, sh.data(), &nsel, q, pos0, first, W, local, entries, topk, k, sink, H, hd, rope_dim, cos_tab,
                  sin_tab, scale, out);
}
void k_route(const BlockCtx& b, size_t, const float* logits, const float* bias, int64_t n, int64_t R, int64_t A,
             float rsf, float* scores, int32_t* chosen, float* weights) {
  route_block(b, logits, bias, n, R, A, rsf, scores, chosen, weights);
}
void k_swiglu(const BlockCtx& b, size_t, float* h1, const float* h3, int64_t count) { swiglu_block(b, h1, h3, count); }
void k_add_routed(const BlockCtx& b, size_t, float* acc, const float* y, const int32_t* chosen, const float* weights,
                  int64_t expert, int64_t A, int64_t n, int64_t d) {
  add_routed_block(b, acc, y, chosen, weights, expert, A, n, d);
}
void k_add(const BlockCtx& b, size_t, float* acc, const float* y, int64_t count) { add_block(b, acc, y, count); }
void k_scale(const BlockCtx& b, size_t, float* buf, int64_t count, float s) { scale_block(b, buf, count, s); }
void k_f32_to_bf16(const BlockCtx& b, size_t, const float* in, int64_t ld_in, uint16_t* out, int64_t n,
                   int64_t cols) {
  f32_to_bf16_block(b, in, ld_in, out, n, cols);
}

}  // namespace

#define CED_LAUNCH(kernel, grid_x, grid_y, threads, shared_bytes, ...)                                   \
  for_each_block((grid_x), (grid_y), (threads), [&](const BlockCtx& ced_block) {                       \
    k_##kernel(ced_block, static_cast<size_t>(shared_bytes), __VA_ARGS__);                             \
  })

#include "optimized/lab/kernels.inl"

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
