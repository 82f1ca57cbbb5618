#pragma once
// Launchers of the CUDA kernels (kernels.inl; the kernels' bodies are in
// kernel_blocks.cuh). A plain C++ header: the engine (engine.cpp, compiled by
// the host compiler) calls these. Every pointer is a device pointer; every
// launcher checks the launch with CED_CUDA_CHECK. In the host emulation
// (flavour.hpp) the pointers are host pointers and the launchers run the same
// grid block by block on the CPU.
// "Abs" rows are indexed by absolute token position (persistent buffers);
// other rows by the index inside the evaluated range.
//
// Every kernel computes each output row (position, entry or head) from that
// row's inputs alone, in a fixed order, with a launch shape that does not
// depend on how many rows there are: results are bitwise the same whichever
// other rows are evaluated in the same call (batch invariance, docs/spec.md §3).
#include <cstdint>

#include "optimized/lab/flavour.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

// X[pos0+i, :] = embed[tokens[pos0+i], :] for i < n.
// tokens [Ntot] (abs), embed [V, d], X [Ntot, d] (abs).
void embed_rows(const int32_t* tokens, const float* embed, float* X, int64_t pos0, int64_t n, int64_t d);

// out[i, :] = (in[i, :] · (1 / sqrt(mean(in[i, :]^2) + eps))) ⊙ w for i < n; in == out allowed.
// The sum of squares is a fixed 256-way tree (f32), not a sequential sum.
// in [n, ld_in], w [cols], out [n, ld_out].
void rmsnorm_rows(const float* in, int64_t ld_in, const float* w, float* out, int64_t ld_out, int64_t n, int64_t cols,
                  float eps);

// RoPE (or its inverse) of the last rope_dim dims of each of n_heads
// consecutive slices of `dim` elements in each row. Row i has position
// pos0 + i·pos_stride. buf [n, ld]; cos_tab, sin_tab [positions, rope_dim/2].
void rope_rows(float* buf, int64_t ld, int64_t n, int64_t n_heads, int64_t dim, int64_t rope_dim, int64_t pos0,
               int64_t pos_stride, const float* cos_tab, const float* sin_tab, bool inverse);

// docs/spec.md §3.3 r ≥ 2: lat[b, c] = Σ_t softmax_t(z[(j0+b)·r + t, c]) · c[(j0+b)·r + t, c] for b < nb.
// cbuf, zbuf [Ntot, hd] (abs); lat [nb, hd].
void compress_blocks(const float* cbuf, const float* zbuf, int64_t j0, int64_t nb, int64_t r, int64_t hd, float* lat);

// docs/spec.md §3.4: scores[i, j] = I[p0+i, j] for i < nq and the visible j < n_visible(p0+i, r).
// iq [nq, HI·dI], iw [nq, HI] (rows of the chunk), keys [n_entries, dI], scores [nq, ld_s].
void index_scores(const float* iq, const float* iw, int64_t nq, int64_t p0, const float* keys, int64_t r, int64_t HI,
                  int64_t dI, float* scores, int64_t ld_s);

// docs/spec.md §3.4 candidate pool of queries p0 .. p0+nq−1: pool[p, :] (abs rows, [Ntot, ctb]).
// scores [nq, ld_s]; block_scores scratch [nq, ld_b] with ld_b >= pool_n_blocks.
void candidate_pool(const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r, int64_t block_size,
                    int64_t topk_blocks, float* block_scores, int64_t ld_b, int32_t* pool);

// docs/spec.md §3.4 selection of queries p0 .. p0+nq−1: topk[p, :] (abs rows, [Ntot, k]), −1 padded.
// pool (abs rows, [Ntot, topk_blocks]) or nullptr to select among all visible entries.
// topk_scores[p, :] (abs rows, [Ntot, k + 1]): the score of each chosen entry (NaN where −1), then of the
// best eligible entry left out (NaN when none), docs/spec.md §9.1.
void select_topk(const float* scores, int64_t ld_s, int64_t nq, int64_t p0, int64_t r, int64_t k, const int32_t* pool,
                 int64_t block_size, int64_t topk_blocks, int32_t* topk, float* topk_scores);

// docs/spec.md §3.5 attention of rows i < n (position pos0+i), all heads.
// q [n, H·hd] (roped); local [Ntot, hd] (abs, roped local entries of this layer);
// entries [n_entries, hd] (roped global entries of kv_src) and topk [Ntot, k]
// (abs, −1 padded), both nullptr for an SWA-only layer; sink [H];
// out [n, H·hd] (inverse-roped).
void attention(const float* q, int64_t n, int64_t pos0, int64_t first, int64_t W, const float* local,
               const float* entries, const int32_t* topk, int64_t k, const float* sink, int64_t H, int64_t hd,
               int64_t rope_dim, const float* cos_tab, const float* sin_tab, float scale, float* out);

// docs/spec.md §3.7 routing of n rows: logits [n, R] (router output), bias [R];
// scores scratch [n, R]; chosen [n, A] (rank order), weights [n, A].
void route(const float* logits, const float* bias, int64_t n, int64_t R, int64_t A, float routed_scaling_factor,
           float* scores, int32_t* chosen, float* weights);

// h1 = silu(h1) ⊙ h3, elementwise over `count` values.
void swiglu_inplace(float* h1, const float* h3, int64_t count);

// acc[i, :] += weights[i, a] · y[i, :] for the slot a with chosen[i, a] == e (if any).
// acc, y [n, d]; chosen, weights [n, A].
void add_routed(float* acc, const float* y, const int32_t* chosen, const float* weights, int64_t expert, int64_t A,
                int64_t n, int64_t d);

// acc += y, elementwise.
void add_inplace(float* acc, const float* y, int64_t count);
// buf *= s, elementwise.
void scale_inplace(float* buf, int64_t count, float s);

// out [n, cols] (bf16 bits, round to nearest even) = in [n, ld_in] (f32).
void f32_to_bf16(const float* in, int64_t ld_in, uint16_t* out, int64_t n, int64_t cols);

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
