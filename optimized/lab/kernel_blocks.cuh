#pragma once
// The bodies of the CUDA kernels, one thread block at a time. Each kernel of
// kernels.cu is a thin __global__ wrapper around one of these functions; the
// host emulation (kernels_host.cpp) calls the same functions for every block
// of the same grid, so the indexing, the block-level phases and the per-row
// maths that run on the device are the ones the host tests run.
//
// A body is written over its block's threads: CED_FOR_THREADS(blk, t) runs
// the thread indices [t_begin, t_end) of the caller. On the device that is
// one index, the calling thread's own (threadIdx.x); on the host it is every
// thread of the block in turn. CED_SYNC() separates the block's phases:
// __syncthreads() on the device; nothing on the host, where a phase has
// finished for every thread before the next starts. A body never returns from
// inside a thread loop (a thread that has nothing to do `continue`s), so that
// both readings run the same phases.
#include <stdint.h>

#include "optimized/lab/device_math.cuh"

#if defined(__CUDACC__)
#define CED_BLOCK_FN __device__ inline
#define CED_SYNC() __syncthreads()
#else
#define CED_BLOCK_FN inline
#define CED_SYNC() ((void)0)
#endif

#define CED_FOR_THREADS(blk, t) for (int64_t t = (blk).t_begin; t < (blk).t_end; ++t)

namespace ced::cuda {

// One thread block's coordinates: blockIdx, gridDim, blockDim, and the
// threads this caller runs.
struct BlockCtx {
  int64_t bx = 0, by = 0;  // blockIdx.x, blockIdx.y
  int64_t gx = 1, gy = 1;  // gridDim.x, gridDim.y
  int64_t nt = 1;          // blockDim.x
  int64_t t_begin = 0, t_end = 1;
};

constexpr int kNormThreads = 256;  // power of two: the tree reduction of rmsnorm needs it
constexpr int kThreads = 256;
constexpr int kRowThreads = 128;

// Block i copies embed[tokens[pos0 + i]] to X[pos0 + i].
CED_BLOCK_FN void embed_rows_block(const BlockCtx& blk, const int32_t* tokens, const float* embed, float* X,
                                   int64_t pos0, int64_t n, int64_t d) {
  const int64_t i = blk.bx;
  if (i >= n) return;
  const int64_t p = pos0 + i;
  const float* src = embed + static_cast<int64_t>(tokens[p]) * d;
  float* dst = X + p * d;
  CED_FOR_THREADS(blk, t) {
    for (int64_t c = t; c < d; c += blk.nt) dst[c] = src[c];
  }
}

// One block per row; the sum of squares is a fixed-shape tree reduction over
// red [kNormThreads] (shared memory).
CED_BLOCK_FN void rmsnorm_rows_block(const BlockCtx& blk, float* red, const float* in, int64_t ld_in, const float* w,
                                     float* out, int64_t ld_out, int64_t cols, float eps) {
  const int64_t row = blk.bx;
  const float* x = in + row * ld_in;
  float* y = out + row * ld_out;
  CED_FOR_THREADS(blk, t) {
    float s = 0.0f;
    for (int64_t c = t; c < cols; c += kNormThreads) s += x[c] * x[c];
    red[t] = s;
  }
  CED_SYNC();
  for (int stride = kNormThreads / 2; stride > 0; stride >>= 1) {
    CED_FOR_THREADS(blk, t) {
      if (t < stride) red[t] += red[t + stride];
    }
    CED_SYNC();
  }
  const float inv = 1.0f / sqrtf(red[0] / static_cast<float>(cols) + eps);
  CED_FOR_THREADS(blk, t) {
    for (int64_t c = t; c < cols; c += kNormThreads) y[c] = (x[c] * inv) * w[c];
  }
}

// One thread per (row, head, rotated pair), grid-stride.
CED_BLOCK_FN void rope_rows_block(const BlockCtx& blk, float* buf, int64_t ld, int64_t n, int64_t n_heads, int64_t dim,
                                  int64_t rope_dim, int64_t pos0, int64_t pos_stride, const float* cos_tab,
                                  const float* sin_tab, bool inverse) {
  const int64_t half = rope_dim / 2;
  const int64_t total = n * n_heads * half;
  CED_FOR_THREADS(blk, tid) {
    for (int64_t t = blk.bx * blk.nt + tid; t < total; t += blk.gx * blk.nt) {
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
}

// grid (blocks, channel tiles): one thread per (block, channel).
CED_BLOCK_FN void compress_blocks_block(const BlockCtx& blk, const float* cbuf, const float* zbuf, int64_t j0,
                                        int64_t nb, int64_t r, int64_t hd, float* lat) {
  const int64_t b = blk.bx;
  CED_FOR_THREADS(blk, t) {
    const int64_t ch = blk.by * blk.nt + t;
    if (b >= nb || ch >= hd) continue;
    const int64_t t0 = (j0 + b) * r;
    lat[b * hd + ch] = compress_channel(cbuf + t0 * hd + ch, zbuf + t0 * hd + ch, hd, r);
  }
}

// grid (entry tiles, queries): one thread per (query, entry).
CED_BLOCK_FN void index_scores_block(const BlockCtx& blk, const float* iq, const float* iw, int64_t p0,
                                     const float* keys, int64_t r, int64_t HI, int64_t dI, float* scores,
                                     int64_t ld_s) {
  const int64_t qi = blk.by;
  CED_FOR_THREADS(blk, t) {
    const int64_t j = blk.bx * blk.nt + t;
    if (j >= n_visible(p0 + qi, r)) continue;
    scores[qi * ld_s + j] = index_score(iq + qi * HI * dI, iw + qi * HI, keys + j * dI, HI, dI);
  }
}

// One thread per query (serial repeated argmax, see device_math.cuh).
CED_BLOCK_FN void candidate_pool_block(const BlockCtx& blk, const float* scores, int64_t ld_s, int64_t nq, int64_t p0,
                                       int64_t r, int64_t block_size, int64_t topk_blocks, float* block_scores,
                                       int64_t ld_b, int32_t* pool) {
  CED_FOR_THREADS(blk, t) {
    const int64_t qi = blk.bx * blk.nt + t;
    if (qi >= nq) continue;
    const int64_t p = p0 + qi;
    candidate_pool_query(scores + qi * ld_s, n_visible(p, r), block_size, topk_blocks, block_scores + qi * ld_b,
                         pool + p * topk_blocks);
  }
}

CED_BLOCK_FN void select_topk_block(const BlockCtx& blk, const float* scores, int64_t ld_s, int64_t nq, int64_t p0,
                                    int64_t r, int64_t k, const int32_t* pool, int64_t block_size,
                                    int64_t topk_blocks, int32_t* topk, float* topk_scores) {
  CED_FOR_THREADS(blk, t) {
    const int64_t qi = blk.bx * blk.nt + t;
    if (qi >= nq) continue;
    const int64_t p = p0 + qi;
    select_topk_query(scores + qi * ld_s, n_visible(p, r), pool ? pool + p * topk_blocks : nullptr, block_size,
                      topk_blocks, k, topk + p * k, topk_scores + p * (k + 1));
  }
}

// grid (rows, heads), one block each. Shared memory: sh [W + k] logits then
// weights, followed by [hd] the output; nsel one int64. Thread 0 counts the
// selection and runs the softmax serially.
CED_BLOCK_FN void attention_block(const BlockCtx& blk, float* sh, int64_t* nsel, const float* q, int64_t pos0,
                                  int64_t first, int64_t W, const float* local, const float* entries,
                                  const int32_t* topk, int64_t k, const float* sink, int64_t H, int64_t hd,
                                  int64_t rope_dim, const float* cos_tab, const float* sin_tab, float scale,
                                  float* out) {
  const int64_t row = blk.bx;
  const int64_t h = blk.by;
  const int64_t p = pos0 + row;
  const int64_t lo = window_lo(first, p, W);
  const int64_t n_loc = p - lo + 1;
  const int32_t* sel = topk ? topk + p * k : nullptr;
  CED_FOR_THREADS(blk, t) {
    if (t != 0) continue;
    int64_t ns = 0;
    if (sel)
      while (ns < k && sel[ns] >= 0) ++ns;
    *nsel = ns;
  }
  CED_SYNC();
  const int64_t n_e = n_loc + *nsel;
  float* wts = sh;        // [W + k]
  float* o = sh + W + k;  // [hd]
  const float* qh = q + row * H * hd + h * hd;
  // Entry e: local entries lo .. p first, then the selected global entries in stored order.
  auto key_of = [&](int64_t e) -> const float* {
    return e < n_loc ? local + (lo + e) * hd : entries + static_cast<int64_t>(sel[e - n_loc]) * hd;
  };
  CED_FOR_THREADS(blk, t) {
    for (int64_t e = t; e < n_e; e += blk.nt) wts[e] = dot(qh, key_of(e), hd) * scale;
  }
  CED_SYNC();
  CED_FOR_THREADS(blk, t) {
    if (t == 0) softmax_with_sink(wts, n_e, sink[h]);
  }
  CED_SYNC();
  CED_FOR_THREADS(blk, t) {
    for (int64_t c = t; c < hd; c += blk.nt) {
      float acc = 0.0f;
      for (int64_t e = 0; e < n_e; ++e) acc += wts[e] * key_of(e)[c];
      o[c] = acc;
    }
  }
  CED_SYNC();
  const int64_t half = rope_dim / 2, off = rope_offset(hd, rope_dim);
  CED_FOR_THREADS(blk, t) {
    for (int64_t i = t; i < half; i += blk.nt) {
      float a = o[off + 2 * i], b = o[off + 2 * i + 1];
      rope_unrotate_pair(a, b, cos_tab[p * half + i], sin_tab[p * half + i]);
      o[off + 2 * i] = a;
      o[off + 2 * i + 1] = b;
    }
  }
  CED_SYNC();
  CED_FOR_THREADS(blk, t) {
    for (int64_t c = t; c < hd; c += blk.nt) out[row * H * hd + h * hd + c] = o[c];
  }
}

// One thread per position.
CED_BLOCK_FN void route_block(const BlockCtx& blk, const float* logits, const float* bias, int64_t n, int64_t R,
                              int64_t A, float rsf, float* scores, int32_t* chosen, float* weights) {
  CED_FOR_THREADS(blk, t) {
    const int64_t i = blk.bx * blk.nt + t;
    if (i >= n) continue;
    float* s = scores + i * R;
    for (int64_t e = 0; e < R; ++e) s[e] = router_score(logits[i * R + e]);
    route_select(s, bias, R, A, rsf, chosen + i * A, weights + i * A);
  }
}

CED_BLOCK_FN void swiglu_block(const BlockCtx& blk, float* h1, const float* h3, int64_t count) {
  CED_FOR_THREADS(blk, tid) {
    for (int64_t t = blk.bx * blk.nt + tid; t < count; t += blk.gx * blk.nt) h1[t] = silu(h1[t]) * h3[t];
  }
}

// One block per row; the row adds expert `expert`'s output if it chose it.
CED_BLOCK_FN void add_routed_block(const BlockCtx& blk, float* acc, const float* y, const int32_t* chosen,
                                   const float* weights, int64_t expert, int64_t A, int64_t n, int64_t d) {
  const int64_t i = blk.bx;
  if (i >= n) return;
  int64_t slot = -1;
  for (int64_t a = 0; a < A; ++a)
    if (chosen[i * A + a] == expert) slot = a;
  if (slot < 0) return;
  const float w = weights[i * A + slot];
  CED_FOR_THREADS(blk, t) {
    for (int64_t c = t; c < d; c += blk.nt) acc[i * d + c] += w * y[i * d + c];
  }
}

CED_BLOCK_FN void add_block(const BlockCtx& blk, float* acc, const float* y, int64_t count) {
  CED_FOR_THREADS(blk, tid) {
    for (int64_t t = blk.bx * blk.nt + tid; t < count; t += blk.gx * blk.nt) acc[t] += y[t];
  }
}

CED_BLOCK_FN void scale_block(const BlockCtx& blk, float* buf, int64_t count, float s) {
  CED_FOR_THREADS(blk, tid) {
    for (int64_t t = blk.bx * blk.nt + tid; t < count; t += blk.gx * blk.nt) buf[t] *= s;
  }
}

// out [n, cols] bf16 bits (round to nearest even) = in [n, ld_in] f32.
CED_BLOCK_FN void f32_to_bf16_block(const BlockCtx& blk, const float* in, int64_t ld_in, uint16_t* out, int64_t n,
                                    int64_t cols) {
  const int64_t total = n * cols;
  CED_FOR_THREADS(blk, tid) {
    for (int64_t t = blk.bx * blk.nt + tid; t < total; t += blk.gx * blk.nt)
      out[t] = bf16_bits_rn(in[(t / cols) * ld_in + t % cols]);
  }
}

}  // namespace ced::cuda
