// The launchers of kernels.hpp: preconditions and launch shapes, written once
// for both builds (flavour.hpp). The including file defines
//   CED_LAUNCH(kernel, grid_x, grid_y, threads, shared_bytes, args...)
// which runs `k_<kernel>` over the grid: a CUDA launch (kernels.cu) or every
// block in turn on the host (kernels_host.cpp). Not a header: included once by
// each of those two files, inside namespace ced::cuda::CED_FLAVOUR.

namespace {

int64_t blocks_for(int64_t count, int64_t threads) {
  const int64_t b = (count + threads - 1) / threads;
  return b < 1 ? 1 : (b > 65535 ? 65535 : b);  // grid-stride loops cover the rest
}

void require(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("CUDA backend: launcher precondition failed: ") + what);
}

}  // namespace

void embed_rows(const int32_t* tokens, const float* embed, float* X, int64_t pos0, int64_t n, int64_t d) {
  if (n <= 0) return;
  CED_LAUNCH(embed_rows, n, 1, kRowThreads, 0, tokens, embed, X, pos0, n, d);
}

void rmsnorm_rows(const float* in, int64_t ld_in, const float* w, float* out, int64_t ld_out, int64_t n, int64_t cols,
                  float eps) {
  if (n <= 0) return;
  CED_LAUNCH(rmsnorm_rows, n, 1, kNormThreads, 0, in, ld_in, w, out, ld_out, cols, eps);
}

void rope_rows(float* buf, int64_t ld, int64_t n, int64_t n_heads, int64_t dim, int64_t rope_dim, int64_t pos0,
               int64_t pos_stride, const float* cos_tab, const float* sin_tab, bool inverse) {
  const int64_t total = n * n_heads * (rope_dim / 2);
  if (total <= 0) return;
  CED_LAUNCH(rope_rows, blocks_for(total, kThreads), 1, kThreads, 0, buf, ld, n, n_heads, dim, rope_dim, pos0,
             pos_stride, cos_tab, sin_tab, inverse);
}

void compress_blocks(const float* cbuf, const float* zbuf, int64_t j0, int64_t nb, int64_t r, int64_t hd, float* lat) {
  if (nb <= 0) return;
  CED_LAUNCH(compress_blocks, nb, (hd + kRowThreads - 1) / kRowThreads, kRowThreads, 0, cbuf, zbuf, j0, nb, r, hd,
             lat);
}

void index_scores(const float* iq, const float* iw, int64_t nq, int64_t p0, const float* keys, int64_t r, int64_t HI,
                  int64_t dI, float* scores, int64_t ld_s) {
  if (nq <= 0) return;
  require(nq <= 65535, "index_scores: at most 65535 queries per call");
  const int64_t max_vis = n_visible(p0 + nq - 1, r);
  require(max_vis <= ld_s, "index_scores: score row too short");
  if (max_vis <= 0) return;
  CED_LAUNCH(index_scores, (max_vis + kRowThreads - 1) / kRowThreads, nq, kRowThreads, 0, iq, iw, p0, keys, r, HI, dI,
             scores, ld_s);
}

void candidate_pool(const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r, int64_t block_size,
                    int64_t topk_blocks, float* block_scores, int64_t ld_b, int32_t* pool) {
  if (nq <= 0) return;
  require(pool_n_blocks(n_visible(p0 + nq - 1, r), block_size) <= ld_b, "candidate_pool: block score row too short");
  CED_LAUNCH(candidate_pool, (nq + kRowThreads - 1) / kRowThreads, 1, kRowThreads, 0, scores, ld_s, nq, p0, r,
             block_size, topk_blocks, block_scores, ld_b, pool);
}

void select_topk(const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r, int64_t k, const int32_t* pool,
                 int64_t block_size, int64_t topk_blocks, int32_t* topk, float* topk_scores) {
  if (nq <= 0) return;
  CED_LAUNCH(select_topk, (nq + kRowThreads - 1) / kRowThreads, 1, kRowThreads, 0, scores, ld_s, nq, p0, r, k, pool,
             block_size, topk_blocks, topk, topk_scores);
}

void attention(const float* q, int64_t n, int64_t pos0, int64_t first, int64_t W, const float* local,
               const float* entries, const int32_t* topk, int64_t k, const float* sink, int64_t H, int64_t hd,
               int64_t rope_dim, const float* cos_tab, const float* sin_tab, float scale, float* out) {
  if (n <= 0) return;
  require(H <= 65535, "attention: at most 65535 heads");
  const int64_t k_eff = topk ? k : 0;
  const size_t smem = static_cast<size_t>(W + k_eff + hd) * sizeof(float);
  require(smem <= 48 * 1024, "attention: W + index_topk + head_dim floats must fit in 48 KiB of shared memory");
  CED_LAUNCH(attention, n, H, kRowThreads, smem, q, pos0, first, W, local, entries, topk, k_eff, sink, H, hd, rope_dim,
             cos_tab, sin_tab, scale, out);
}

void route(const float* logits, const float* bias, int64_t n, int64_t R, int64_t A, float routed_scaling_factor,
           float* scores, int32_t* chosen, float* weights) {
  if (n <= 0) return;
  CED_LAUNCH(route, (n + kRowThreads - 1) / kRowThreads, 1, kRowThreads, 0, logits, bias, n, R, A,
             routed_scaling_factor, scores, chosen, weights);
}

void swiglu_inplace(float* h1, const float* h3, int64_t count) {
  if (count <= 0) return;
  CED_LAUNCH(swiglu, blocks_for(count, kThreads), 1, kThreads, 0, h1, h3, count);
}

void add_routed(float* acc, const float* y, const int32_t* chosen, const float* weights, int64_t expert, int64_t A,
                int64_t n, int64_t d) {
  if (n <= 0) return;
  CED_LAUNCH(add_routed, n, 1, kRowThreads, 0, acc, y, chosen, weights, expert, A, n, d);
}

void add_inplace(float* acc, const float* y, int64_t count) {
  if (count <= 0) return;
  CED_LAUNCH(add, blocks_for(count, kThreads), 1, kThreads, 0, acc, y, count);
}

void scale_inplace(float* buf, int64_t count, float s) {
  if (count <= 0) return;
  CED_LAUNCH(scale, blocks_for(count, kThreads), 1, kThreads, 0, buf, count, s);
}

void f32_to_bf16(const float* in, int64_t ld_in, uint16_t* out, int64_t n, int64_t cols) {
  const int64_t total = n * cols;
  if (total <= 0) return;
  CED_LAUNCH(f32_to_bf16, blocks_for(total, kThreads), 1, kThreads, 0, in, ld_in, out, n, cols);
}
