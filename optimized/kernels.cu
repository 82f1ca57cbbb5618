// The CUDA kernels of the optimized model (SPEC §3) and their checked
// launchers. Simple by design: each kernel mirrors one SPEC step, reductions
// run in a fixed order (no atomics), and the per-element maths lives in
// device_math.cuh where the host tests check it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>

#include "optimized/cuda_check.hpp"
#include "optimized/device_math.cuh"
#include "optimized/kernels.hpp"

namespace ced::cuda {
namespace {

constexpr int kNormThreads = 256;  // power of two: the tree reduction below needs it
constexpr int kThreads = 256;
constexpr int kRowThreads = 128;

int64_t blocks_for(int64_t count, int64_t threads) {
  const int64_t b = (count + threads - 1) / threads;
  return b < 1 ? 1 : (b > 65535 ? 65535 : b);  // grid-stride loops cover the rest
}

void require(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("CUDA backend: launcher precondition failed: ") + what);
}

// ---------------------------------------------------------------------------

__global__ void k_embed_rows(const int32_t* tokens, const float* embed, float* X, int64_t pos0, int64_t n, int64_t d) {
  const int64_t i = blockIdx.x;
  if (i >= n) return;
  const int64_t p = pos0 + i;
  const float* src = embed + static_cast<int64_t>(tokens[p]) * d;
  float* dst = X + p * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = src[c];
}

// One block per row; the sum of squares is a fixed-shape tree reduction.
__global__ void k_rmsnorm_rows(const float* in, int64_t ld_in, const float* w, float* out, int64_t ld_out,
                               int64_t cols, float eps) {
  __shared__ float red[kNormThreads];
  const int64_t row = blockIdx.x;
  const float* x = in + row * ld_in;
  float* y = out + row * ld_out;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += kNormThreads) s += x[c] * x[c];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kNormThreads / 2; stride > 0; stride >>= 1) {
    if (static_cast<int>(threadIdx.x) < stride) red[threadIdx.x] += red[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = 1.0f / sqrtf(red[0] / static_cast<float>(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += kNormThreads) y[c] = (x[c] * inv) * w[c];
}

__global__ void k_rope_rows(float* buf, int64_t ld, int64_t n, int64_t n_heads, int64_t dim, int64_t rope_dim,
                            int64_t pos0, int64_t pos_stride, const float* cos_tab, const float* sin_tab,
                            bool inverse) {
  const int64_t half = rope_dim / 2;
  const int64_t total = n * n_heads * half;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = t % half;
    const int64_t h = (t / half) % n_heads;
    const int64_t row = t / (half * n_heads);
    const int64_t pos = pos0 + row * pos_stride;
    float* v = buf + row * ld + h * dim + rope_offset(dim, rope_dim) + 2 * i;
    float a = v[0], b = v[1];
    const float c = cos_tab[pos * half + i], s = sin_tab[pos * half + i];
    if (inverse)
      rope_unrotate_pair(a, b, c, s);
    else
      rope_rotate_pair(a, b, c, s);
    v[0] = a;
    v[1] = b;
  }
}

__global__ void k_compress_blocks(const float* cbuf, const float* zbuf, int64_t j0, int64_t nb, int64_t r, int64_t hd,
                                  float* lat) {
  const int64_t b = blockIdx.x;
  const int64_t ch = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (b >= nb || ch >= hd) return;
  const int64_t t0 = (j0 + b) * r;
  lat[b * hd + ch] = compress_channel(cbuf + t0 * hd + ch, zbuf + t0 * hd + ch, hd, r);
}

// grid (entry blocks, queries): one thread per (query, entry).
__global__ void k_index_scores(const float* iq, const float* iw, int64_t p0, const float* keys, int64_t r,
                               int64_t HI, int64_t dI, float* scores, int64_t ld_s) {
  const int64_t qi = blockIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n_visible(p0 + qi, r)) return;
  scores[qi * ld_s + j] = index_score(iq + qi * HI * dI, iw + qi * HI, keys + j * dI, HI, dI);
}

// One thread per query (serial repeated argmax, see device_math.cuh).
__global__ void k_candidate_pool(const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r,
                                 int64_t block_size, int64_t topk_blocks, float* block_scores, int64_t ld_b,
                                 int32_t* pool) {
  const int64_t qi = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (qi >= nq) return;
  const int64_t p = p0 + qi;
  candidate_pool_query(scores + qi * ld_s, n_visible(p, r), block_size, topk_blocks, block_scores + qi * ld_b,
                       pool + p * topk_blocks);
}

__global__ void k_select_topk(const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r, int64_t k,
                              const int32_t* pool, int64_t block_size, int64_t topk_blocks, int32_t* topk) {
  const int64_t qi = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (qi >= nq) return;
  const int64_t p = p0 + qi;
  select_topk_query(scores + qi * ld_s, n_visible(p, r), pool ? pool + p * topk_blocks : nullptr, block_size,
                    topk_blocks, k, topk + p * k);
}

// grid (rows, heads), one block each. Dynamic shared memory: [W + k] logits
// then weights, [hd] the output. Thread 0 runs the softmax serially.
__global__ void k_attention(const float* q, int64_t pos0, int64_t first, int64_t W, const float* local,
                            const float* entries, const int32_t* topk, int64_t k, const float* sink, int64_t H,
                            int64_t hd, int64_t rope_dim, const float* cos_tab, const float* sin_tab, float scale,
                            float* out) {
  extern __shared__ float sh[];
  __shared__ int64_t sh_nsel;
  const int64_t row = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t p = pos0 + row;
  const int64_t lo = window_lo(first, p, W);
  const int64_t n_loc = p - lo + 1;
  const int32_t* sel = topk ? topk + p * k : nullptr;
  if (threadIdx.x == 0) {
    int64_t ns = 0;
    if (sel)
      while (ns < k && sel[ns] >= 0) ++ns;
    sh_nsel = ns;
  }
  __syncthreads();
  const int64_t n_e = n_loc + sh_nsel;
  float* wts = sh;          // [W + k]
  float* o = sh + W + k;    // [hd]
  const float* qh = q + row * H * hd + h * hd;
  // Entry e: local entries lo .. p first, then the selected global entries in stored order.
  auto key_of = [&](int64_t e) -> const float* {
    return e < n_loc ? local + (lo + e) * hd : entries + static_cast<int64_t>(sel[e - n_loc]) * hd;
  };
  for (int64_t e = threadIdx.x; e < n_e; e += blockDim.x) wts[e] = dot(qh, key_of(e), hd) * scale;
  __syncthreads();
  if (threadIdx.x == 0) softmax_with_sink(wts, n_e, sink[h]);
  __syncthreads();
  for (int64_t c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t e = 0; e < n_e; ++e) acc += wts[e] * key_of(e)[c];
    o[c] = acc;
  }
  __syncthreads();
  const int64_t half = rope_dim / 2, off = rope_offset(hd, rope_dim);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float a = o[off + 2 * i], b = o[off + 2 * i + 1];
    rope_unrotate_pair(a, b, cos_tab[p * half + i], sin_tab[p * half + i]);
    o[off + 2 * i] = a;
    o[off + 2 * i + 1] = b;
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < hd; c += blockDim.x) out[row * H * hd + h * hd + c] = o[c];
}

__global__ void k_route(const float* logits, const float* bias, int64_t n, int64_t R, int64_t A, float rsf,
                        float* scores, int32_t* chosen, float* weights) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float* s = scores + i * R;
  for (int64_t e = 0; e < R; ++e) s[e] = router_score(logits[i * R + e]);
  route_select(s, bias, R, A, rsf, chosen + i * A, weights + i * A);
}

__global__ void k_swiglu(float* h1, const float* h3, int64_t count) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < count;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    h1[t] = silu(h1[t]) * h3[t];
}

__global__ void k_add_routed(float* acc, const float* y, const int32_t* chosen, const float* weights, int64_t expert,
                             int64_t A, int64_t n, int64_t d) {
  const int64_t i = blockIdx.x;
  if (i >= n) return;
  int64_t slot = -1;
  for (int64_t a = 0; a < A; ++a)
    if (chosen[i * A + a] == expert) slot = a;
  if (slot < 0) return;
  const float w = weights[i * A + slot];
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) acc[i * d + c] += w * y[i * d + c];
}

__global__ void k_add(float* acc, const float* y, int64_t count) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < count;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    acc[t] += y[t];
}

__global__ void k_scale(float* buf, int64_t count, float s) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < count;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    buf[t] *= s;
}

__global__ void k_f32_to_bf16(const float* in, int64_t ld_in, __nv_bfloat16* out, int64_t n, int64_t cols) {
  const int64_t total = n * cols;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[t] = __float2bfloat16_rn(in[(t / cols) * ld_in + t % cols]);
}

}  // namespace

// ---------------------------------------------------------------------------

void embed_rows(const int32_t* tokens, const float* embed, float* X, int64_t pos0, int64_t n, int64_t d) {
  if (n <= 0) return;
  k_embed_rows<<<static_cast<unsigned>(n), kRowThreads>>>(tokens, embed, X, pos0, n, d);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void rmsnorm_rows(const float* in, int64_t ld_in, const float* w, float* out, int64_t ld_out, int64_t n, int64_t cols,
                  float eps) {
  if (n <= 0) return;
  k_rmsnorm_rows<<<static_cast<unsigned>(n), kNormThreads>>>(in, ld_in, w, out, ld_out, cols, eps);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void rope_rows(float* buf, int64_t ld, int64_t n, int64_t n_heads, int64_t dim, int64_t rope_dim, int64_t pos0,
               int64_t pos_stride, const float* cos_tab, const float* sin_tab, bool inverse) {
  const int64_t total = n * n_heads * (rope_dim / 2);
  if (total <= 0) return;
  k_rope_rows<<<static_cast<unsigned>(blocks_for(total, kThreads)), kThreads>>>(
      buf, ld, n, n_heads, dim, rope_dim, pos0, pos_stride, cos_tab, sin_tab, inverse);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void compress_blocks(const float* cbuf, const float* zbuf, int64_t j0, int64_t nb, int64_t r, int64_t hd, float* lat) {
  if (nb <= 0) return;
  const dim3 grid(static_cast<unsigned>(nb), static_cast<unsigned>((hd + kRowThreads - 1) / kRowThreads));
  k_compress_blocks<<<grid, kRowThreads>>>(cbuf, zbuf, j0, nb, r, hd, lat);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void index_scores(const float* iq, const float* iw, int64_t nq, int64_t p0, const float* keys, int64_t r, int64_t HI,
                  int64_t dI, float* scores, int64_t ld_s) {
  if (nq <= 0) return;
  require(nq <= 65535, "index_scores: at most 65535 queries per call");
  const int64_t max_vis = n_visible(p0 + nq - 1, r);
  require(max_vis <= ld_s, "index_scores: score row too short");
  if (max_vis <= 0) return;
  const dim3 grid(static_cast<unsigned>((max_vis + kRowThreads - 1) / kRowThreads), static_cast<unsigned>(nq));
  k_index_scores<<<grid, kRowThreads>>>(iq, iw, p0, keys, r, HI, dI, scores, ld_s);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void candidate_pool(const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r, int64_t block_size,
                    int64_t topk_blocks, float* block_scores, int64_t ld_b, int32_t* pool) {
  if (nq <= 0) return;
  require(pool_n_blocks(n_visible(p0 + nq - 1, r), block_size) <= ld_b, "candidate_pool: block score row too short");
  const int64_t grid = (nq + kRowThreads - 1) / kRowThreads;
  k_candidate_pool<<<static_cast<unsigned>(grid), kRowThreads>>>(scores, ld_s, nq, p0, r, block_size, topk_blocks,
                                                                 block_scores, ld_b, pool);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void select_topk(const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r, int64_t k, const int32_t* pool,
                 int64_t block_size, int64_t topk_blocks, int32_t* topk) {
  if (nq <= 0) return;
  const int64_t grid = (nq + kRowThreads - 1) / kRowThreads;
  k_select_topk<<<static_cast<unsigned>(grid), kRowThreads>>>(scores, ld_s, nq, p0, r, k, pool, block_size,
                                                              topk_blocks, topk);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void attention(const float* q, int64_t n, int64_t pos0, int64_t first, int64_t W, const float* local,
               const float* entries, const int32_t* topk, int64_t k, const float* sink, int64_t H, int64_t hd,
               int64_t rope_dim, const float* cos_tab, const float* sin_tab, float scale, float* out) {
  if (n <= 0) return;
  require(H <= 65535, "attention: at most 65535 heads");
  const int64_t k_eff = topk ? k : 0;
  const size_t smem = static_cast<size_t>(W + k_eff + hd) * sizeof(float);
  require(smem <= 48 * 1024, "attention: W + index_topk + head_dim floats must fit in 48 KiB of shared memory");
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(H));
  k_attention<<<grid, kRowThreads, smem>>>(q, pos0, first, W, local, entries, topk, k_eff, sink, H, hd, rope_dim,
                                           cos_tab, sin_tab, scale, out);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void route(const float* logits, const float* bias, int64_t n, int64_t R, int64_t A, float routed_scaling_factor,
           float* scores, int32_t* chosen, float* weights) {
  if (n <= 0) return;
  const int64_t grid = (n + kRowThreads - 1) / kRowThreads;
  k_route<<<static_cast<unsigned>(grid), kRowThreads>>>(logits, bias, n, R, A, routed_scaling_factor, scores, chosen,
                                                        weights);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void swiglu_inplace(float* h1, const float* h3, int64_t count) {
  if (count <= 0) return;
  k_swiglu<<<static_cast<unsigned>(blocks_for(count, kThreads)), kThreads>>>(h1, h3, count);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void add_routed(float* acc, const float* y, const int32_t* chosen, const float* weights, int64_t expert, int64_t A,
                int64_t n, int64_t d) {
  if (n <= 0) return;
  k_add_routed<<<static_cast<unsigned>(n), kRowThreads>>>(acc, y, chosen, weights, expert, A, n, d);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void add_inplace(float* acc, const float* y, int64_t count) {
  if (count <= 0) return;
  k_add<<<static_cast<unsigned>(blocks_for(count, kThreads)), kThreads>>>(acc, y, count);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void scale_inplace(float* buf, int64_t count, float s) {
  if (count <= 0) return;
  k_scale<<<static_cast<unsigned>(blocks_for(count, kThreads)), kThreads>>>(buf, count, s);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

void f32_to_bf16(const float* in, int64_t ld_in, void* out, int64_t n, int64_t cols) {
  const int64_t total = n * cols;
  if (total <= 0) return;
  k_f32_to_bf16<<<static_cast<unsigned>(blocks_for(total, kThreads)), kThreads>>>(
      in, ld_in, static_cast<__nv_bfloat16*>(out), n, cols);
  CED_CUDA_CHECK(cudaGetLastError());  // launch errors; faults surface at the next sync
}

}  // namespace ced::cuda
