#pragma once
// docs/spec.md §3, one function per step. Accumulation: every reduction runs in the
// scalar type T, sequentially in the index order stated, with no FMA
// contraction (-ffp-contract=off), so a result depends only on its own inputs:
// batch invariance and thread invariance follow (docs/spec.md §3, invariants).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <omp.h>

#include "models/lab/weights.hpp"
#include "reference/lab/gemm.hpp"

namespace ced::ref {

// matmul_rows opens an OpenMP parallel region only above this many
// multiply-adds (n·k·m): below it the threads cost more than they save. The
// thread and batch invariance tests must run sizes above it.
constexpr int64_t kParallelMultiplyAdds = int64_t(1) << 20;

// Loops of one operation per element (norms, rotations, residual sums) open
// an OpenMP region above this many elements; each element's arithmetic is
// the same whichever thread runs it.
constexpr int64_t kParallelElements = int64_t(1) << 16;

// Y[n, m] = X[n, k] W[k, m]. Each Y[i, j] = sum over k ascending of
// X[i, k] * W[k, j], accumulated in T from 0: the blocked product of
// reference/lab/gemm.hpp, whose every path gives these bits.
//
// thread_dependent (Fault::ThreadDependentReduction, a negative control of the
// thread and batch invariance tests): the row loop below, where threads other
// than 0 sum k descending. It changes bits only where the parallel region
// really opens.
template <class T>
void matmul_rows(const T* X, int64_t n, int64_t k, const T* W, int64_t m, T* Y, bool thread_dependent = false) {
  const bool parallel = n * k * m > kParallelMultiplyAdds;
  if (!thread_dependent) return gemm::gemm(X, n, k, W, m, Y, parallel);
  constexpr int64_t kTile = 4;  // rows sharing one pass over W
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i0 = 0; i0 < n; i0 += kTile) {
    const int64_t i1 = std::min(n, i0 + kTile);
    const bool descending = omp_get_thread_num() != 0;
    for (int64_t i = i0; i < i1; ++i) std::fill(Y + i * m, Y + (i + 1) * m, T(0));
    for (int64_t step = 0; step < k; ++step) {
      const int64_t kk = descending ? k - 1 - step : step;
      const T* w = W + kk * m;
      for (int64_t i = i0; i < i1; ++i) {
        const T a = X[i * k + kk];
        T* y = Y + i * m;
        for (int64_t j = 0; j < m; ++j) y[j] += a * w[j];
      }
    }
  }
}

template <class T>
Mat<T> matmul(const Mat<T>& X, const Mat<T>& W, bool thread_dependent = false) {
  Mat<T> Y(X.rows(), W.cols());
  matmul_rows(X.data(), X.rows(), X.cols(), W.data(), W.cols(), Y.data(), thread_dependent);
  return Y;
}

// matmul_rows between blocks of larger matrices: Y [n, W.cols()] (row stride
// ldy) = X [n, W.rows()] (row stride ldx) W, read and written in place.
template <class T>
void matmul_block(const T* X, int64_t ldx, int64_t n, const Mat<T>& W, T* Y, int64_t ldy) {
  const int64_t k = W.rows(), m = W.cols();
  gemm::gemm(gemm::Operands<T>{X, ldx, W.data(), m, Y, ldy, n, k, m, false}, n * k * m > kParallelMultiplyAdds);
}

// Y += X, one addition per element.
template <class T>
void add_into(Mat<T>& Y, const Mat<T>& X) {
  const int64_t n = Y.size();
  T* __restrict y = Y.data();  // two matrices: no alias
  const T* __restrict x = X.data();
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// Sequential dot product, ascending index.
template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// dot(q, rows[e], n) for e = 0..count-1, each exactly the sequential sum
// above. Eight sums advance together, one i at a time, so the additions of
// different sums overlap (and may share a vector register) while each sum
// keeps its own order.
template <class T>
void dots(const T* q, const T* const* rows, int64_t count, int64_t n, T* out) {
  constexpr int64_t kWays = 8;
  int64_t e = 0;
  for (; e + kWays <= count; e += kWays) {
    T s[kWays] = {};
    const T* r[kWays];
    for (int64_t w = 0; w < kWays; ++w) r[w] = rows[e + w];
    for (int64_t i = 0; i < n; ++i) {
      const T x = q[i];
      for (int64_t w = 0; w < kWays; ++w) s[w] += x * r[w][i];
    }
    for (int64_t w = 0; w < kWays; ++w) out[e + w] = s[w];
  }
  for (; e < count; ++e) out[e] = dot(q, rows[e], n);
}

// docs/spec.md §3: RMSNorm(v) ⊙ w = (v_i * (1 / sqrt(mean(v²) + eps))) * w_i.
template <class T>
void rmsnorm(const T* v, const T* w, int64_t n, T eps, T* out) {
  T ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += v[i] * v[i];
  const T inv = T(1) / std::sqrt(ss / T(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (v[i] * inv) * w[i];
}

// rmsnorm() of every row. The sums of squares of eight rows advance
// together, one i at a time, so that eight additions are in flight instead
// of one; each sum keeps rmsnorm()'s order.
template <class T>
Mat<T> rmsnorm_rows(const Mat<T>& X, const Vec<T>& w, T eps) {
  constexpr int64_t kWays = 8;
  const int64_t rows = X.rows(), n = X.cols(), groups = (rows + kWays - 1) / kWays;
  Mat<T> Y(rows, n);
#pragma omp parallel for schedule(static) if (X.size() >= kParallelElements)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t r0 = g * kWays;
    if (r0 + kWays > rows) {
      for (int64_t r = r0; r < rows; ++r) rmsnorm(X.row(r).data(), w.data(), n, eps, Y.row(r).data());
      continue;
    }
    T ss[kWays] = {};
    const T* v[kWays];
    for (int64_t r = 0; r < kWays; ++r) v[r] = X.row(r0 + r).data();
    for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 8
      for (int64_t r = 0; r < kWays; ++r) ss[r] += v[r][i] * v[r][i];
    for (int64_t r = 0; r < kWays; ++r) {
      const T inv = T(1) / std::sqrt(ss[r] / T(n) + eps);
      T* __restrict out = Y.row(r0 + r).data();  // a fresh matrix: no alias, so the loop vectorises
      const T* __restrict in = v[r];
      const T* __restrict wt = w.data();
      for (int64_t i = 0; i < n; ++i) out[i] = (in[i] * inv) * wt[i];
    }
  }
  return Y;
}

// docs/spec.md §3: RoPE rotates the pairs (v[o+2i], v[o+2i+1]) of the last rope_dim
// dims by θ = pos · theta^(-2i/rope_dim); sign = -1 is the inverse. The angle,
// its cosine and sine are computed in double for every scalar type, then
// rounded to T; the rotation itself runs in T.
//
// rope_heads rotates n_heads consecutive vectors of `dim` at the same
// position: the cosines and sines are computed once for all of them, the same
// values rope() computes for each.
template <class T>
void rope_heads(T* v, int64_t n_heads, int64_t dim, int64_t rope_dim, double theta, int64_t pos, int sign = +1) {
  constexpr int64_t kPairs = 64;  // rope_dim / 2 up to this on the stack
  T cs[2 * kPairs];
  const int64_t pairs = rope_dim / 2, o = dim - rope_dim;
  for (int64_t i0 = 0; i0 < pairs; i0 += kPairs) {
    const int64_t i1 = std::min(pairs, i0 + kPairs);
    for (int64_t i = i0; i < i1; ++i) {
      const double inv_freq = std::pow(theta, -2.0 * double(i) / double(rope_dim));
      const double ang = double(sign) * double(pos) * inv_freq;
      cs[2 * (i - i0)] = T(std::cos(ang));
      cs[2 * (i - i0) + 1] = T(std::sin(ang));
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      T* x = v + h * dim + o;
      for (int64_t i = i0; i < i1; ++i) {
        const T c = cs[2 * (i - i0)], s = cs[2 * (i - i0) + 1];
        const T a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
      }
    }
  }
}

template <class T>
void rope(T* v, int64_t dim, int64_t rope_dim, double theta, int64_t pos, int sign = +1) {
  rope_heads(v, 1, dim, rope_dim, theta, pos, sign);
}

// Scores compare as real numbers; a NaN (only under the poison probe) ranks
// below everything so the order stays total.
template <class T>
T rank_key(T s) {
  return std::isnan(s) ? -std::numeric_limits<T>::infinity() : s;
}

// docs/spec.md §3.4: higher score first; equal scores -> larger id first.
// `reversed_ties` is the tie-break-reversed fault.
template <class T>
bool ranks_before(T sa, int64_t a, T sb, int64_t b, bool reversed_ties = false) {
  const T ka = rank_key(sa), kb = rank_key(sb);
  if (ka != kb) return ka > kb;
  return reversed_ties ? a < b : a > b;
}

// A top-k with the scores behind it (docs/spec.md §9.1, for §8.3's near-ties):
// the chosen ids in rank order, the score of each, and the score of the best
// candidate left out (NaN when every candidate was chosen).
template <class T>
struct ScoredTopk {
  std::vector<int64_t> ids;
  std::vector<T> scores;
  T left_out = std::numeric_limits<T>::quiet_NaN();
};

// The k best of (ids, scores) in rank order, and the best one after them. The
// ids are distinct, so the rank order is total: any correct selection and sort
// gives the same ids in the same order.
template <class T>
ScoredTopk<T> topk_scored(const std::vector<int64_t>& ids, const std::vector<T>& scores, int64_t k,
                          bool reversed_ties = false) {
  std::vector<int64_t> order(ids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  const auto take = std::min<int64_t>(k, int64_t(order.size()));
  const auto sorted = std::min<int64_t>(take + 1, int64_t(order.size()));
  const auto before = [&](int64_t x, int64_t y) {
    return ranks_before(scores[size_t(x)], ids[size_t(x)], scores[size_t(y)], ids[size_t(y)], reversed_ties);
  };
  // The order is total, so the place `take` holds after nth_element, and the
  // first `take` once sorted, are the ones a full sort gives.
  if (sorted > take) std::nth_element(order.begin(), order.begin() + take, order.end(), before);
  std::sort(order.begin(), order.begin() + take, before);
  ScoredTopk<T> out;
  out.ids.resize(static_cast<size_t>(take));
  out.scores.resize(static_cast<size_t>(take));
  for (int64_t i = 0; i < take; ++i) {
    out.ids[size_t(i)] = ids[size_t(order[size_t(i)])];
    out.scores[size_t(i)] = scores[size_t(order[size_t(i)])];
  }
  if (sorted > take) out.left_out = scores[size_t(order[size_t(take)])];
  return out;
}

// The k best of (ids, scores) in rank order.
template <class T>
std::vector<int64_t> topk(const std::vector<int64_t>& ids, const std::vector<T>& scores, int64_t k,
                          bool reversed_ties = false) {
  ScoredTopk<T> chosen = topk_scored(ids, scores, k, reversed_ties);
  return std::move(chosen.ids);
}

// docs/spec.md §3.3 visibility: entry j (ratio r) is visible to query p iff
// (j+1)r - 1 <= p, so the visible entries are 0 .. floor((p+1)/r) - 1.
inline int64_t n_visible(int64_t p, int64_t r) { return (p + 1) / r; }

// docs/spec.md §3.4 candidate pool: the block holding the newest visible entry first,
// then the best other blocks by block score (max of its visible entries),
// ties -> larger block id; at most `k_blocks` blocks.
template <class T>
std::vector<int64_t> candidate_pool(const std::vector<T>& entry_scores, int64_t n_vis, int64_t block_size,
                                    int64_t k_blocks, bool pin_newest = true, bool reversed_ties = false) {
  if (n_vis == 0) return {};
  const int64_t nb = (n_vis + block_size - 1) / block_size;
  std::vector<int64_t> ids;
  std::vector<T> scores;
  const int64_t newest = nb - 1;
  for (int64_t b = 0; b < nb; ++b) {
    if (pin_newest && b == newest) continue;
    T best = rank_key(entry_scores[size_t(b * block_size)]);
    for (int64_t j = b * block_size + 1; j < std::min(n_vis, (b + 1) * block_size); ++j)
      best = std::max(best, rank_key(entry_scores[size_t(j)]));
    ids.push_back(b);
    scores.push_back(best);
  }
  std::vector<int64_t> pool;
  if (pin_newest) pool.push_back(newest);
  const auto rest = topk(ids, scores, k_blocks - int64_t(pool.size()), reversed_ties);
  pool.insert(pool.end(), rest.begin(), rest.end());
  return pool;
}

// docs/spec.md §3.4 index score I = Σ_h w_h · ReLU(iq_h · ik), h ascending.
template <class T>
T index_score(const T* iq, const T* w, const T* ik, int64_t n_heads, int64_t head_dim) {
  T s = 0;
  for (int64_t h = 0; h < n_heads; ++h) {
    const T d = dot(iq + h * head_dim, ik, head_dim);
    s += w[h] * (d > T(0) ? d : T(0));
  }
  return s;
}

// docs/spec.md §3.5 softmax with a sink logit that joins the denominator and has no
// value. logits are overwritten by the weights. Sums run in entry order.
template <class T>
void softmax_with_sink(T* logits, int64_t n, T sink, bool use_sink = true) {
  T m = use_sink ? sink : -std::numeric_limits<T>::infinity();
  for (int64_t e = 0; e < n; ++e) m = std::max(m, logits[e]);
  T denom = use_sink ? std::exp(sink - m) : T(0);
  for (int64_t e = 0; e < n; ++e) {
    logits[e] = std::exp(logits[e] - m);
    denom += logits[e];
  }
  for (int64_t e = 0; e < n; ++e) logits[e] = logits[e] / denom;
}

template <class T>
void softmax_with_sink(std::vector<T>& logits, T sink, bool use_sink = true) {
  softmax_with_sink(logits.data(), int64_t(logits.size()), sink, use_sink);
}

// docs/spec.md §3.3 r >= 2: per channel, softmax over the block's tokens of z, then
// Σ_t a_t c_t (t ascending).
template <class T>
void compress_block(const T* c, const T* z, int64_t r, int64_t dim, T* out) {
  for (int64_t ch = 0; ch < dim; ++ch) {
    T m = z[ch];
    for (int64_t t = 1; t < r; ++t) m = std::max(m, z[t * dim + ch]);
    T denom = 0;
    for (int64_t t = 0; t < r; ++t) denom += std::exp(z[t * dim + ch] - m);
    T acc = 0;
    for (int64_t t = 0; t < r; ++t) acc += (std::exp(z[t * dim + ch] - m) / denom) * c[t * dim + ch];
    out[ch] = acc;
  }
}

// docs/spec.md §3.7 router score s_e = sqrt(softplus(x)), softplus computed stably.
template <class T>
T router_score(T x) {
  const T sp = std::max(x, T(0)) + std::log1p(std::exp(-std::abs(x)));
  return std::sqrt(sp);
}

// docs/spec.md §3.7: the n_active largest s_e + bias_e, ties -> lower e; returned in
// ascending expert order (the order their outputs are summed in).
template <class T>
std::vector<int64_t> route(const T* s, const T* bias, int64_t n_experts, int64_t n_active) {
  std::vector<int64_t> order(static_cast<size_t>(n_experts));
  for (int64_t e = 0; e < n_experts; ++e) order[size_t(e)] = e;
  std::partial_sort(order.begin(), order.begin() + n_active, order.end(), [&](int64_t a, int64_t b) {
    const T ka = rank_key(s[a] + bias[a]), kb = rank_key(s[b] + bias[b]);
    if (ka != kb) return ka > kb;
    return a < b;
  });
  order.resize(size_t(n_active));
  std::sort(order.begin(), order.end());
  return order;
}

template <class T>
T silu(T x) {
  return x / (T(1) + std::exp(-x));
}

}  // namespace ced::ref
