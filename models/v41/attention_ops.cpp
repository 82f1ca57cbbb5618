// docs/v41.md §8.5, §8.6: the window indices, sparse_attn, the ratio-r pooling of the compressor and
// the candidate blocks (model.py get_window_topk_idxs, Compressor.forward, select_candidate_blocks;
// the kernel's sparse_attn).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "models/v41/forward_ops.hpp"
#include "models/v41/lanes.hpp"

namespace ced::v41::fwd {

constexpr int64_t kAttnBlock = 64;  // sparse_attn walks its index list 64 at a time

std::vector<int32_t> window_topk_idxs(int64_t N, int64_t W) {
  const int64_t k = std::min(N, W);
  std::vector<int32_t> idx(static_cast<size_t>(N * k));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = std::max<int64_t>(i - W + 1, 0) + j;
      idx[static_cast<size_t>(i * k + j)] = p > i ? -1 : static_cast<int32_t>(p);
    }
  return idx;
}

namespace {

// sparse_attn's kernels (lanes.hpp): the scores of a block of kAttnBlock keys with a lane per key,
// and P·V with a lane per channel.

// dot[j] = Σ_c q[c] · kt[c, j] for the block's keys (kt: [d, kAttnBlock], the block transposed), in
// c order; eight vectors of keys at a time (as many sums in flight as fit AVX2's registers).
template <typename T>
[[gnu::always_inline]] inline void block_scores(const T* q, const T* kt, int64_t d, T* dot) {
  constexpr int64_t nv = std::min<int64_t>(8, kAttnBlock / kLanes<T>), group = nv * kLanes<T>;
  for (int64_t j0 = 0; j0 < kAttnBlock; j0 += group) {
    Vec<T> acc[nv] = {};
    for (int64_t c = 0; c < d; ++c)
#pragma GCC unroll 8
      for (int64_t v = 0; v < nv; ++v) {
        Vec<T> k;
        std::memcpy(&k, kt + c * kAttnBlock + j0 + v * kLanes<T>, sizeof k);
        acc[v] = acc[v] + q[c] * k;
      }
    std::memcpy(dot + j0, acc, sizeof acc);
  }
}

// acc[c] = acc[c] · rescale + Σ_j p[j] · rows[j][c] over the n rows, in j order. kPvVecs vectors
// of channels at a time, so that as many sums are in flight (d a multiple: the caller pads).
constexpr int64_t kPvVecs = 4;
template <typename T>
[[gnu::always_inline]] inline void block_pv(const T* p, const T* const* rows, int64_t n, int64_t d, T rescale,
                                            T* acc) {
  for (int64_t c = 0; c < d; c += kPvVecs * kLanes<T>) {
    Vec<T> pv[kPvVecs] = {};
    for (int64_t j = 0; j < n; ++j)
#pragma GCC unroll 4
      for (int64_t v = 0; v < kPvVecs; ++v) {
        Vec<T> x;
        std::memcpy(&x, rows[j] + c + v * kLanes<T>, sizeof x);
        pv[v] = pv[v] + p[j] * x;
      }
#pragma GCC unroll 4
    for (int64_t v = 0; v < kPvVecs; ++v) {
      Vec<T> a;
      std::memcpy(&a, acc + c + v * kLanes<T>, sizeof a);
      a = a * rescale + pv[v];
      std::memcpy(acc + c + v * kLanes<T>, &a, sizeof a);
    }
  }
}

// kt[c, j] = kvt[c, ix[j]] for the block's n keys (ix: row indices, a valid row in place of none).
template <typename T>
[[gnu::always_inline]] inline void gather_block(const T* kvt, int64_t rows, const int32_t* ix, int64_t n, int64_t d,
                                                T* kt) {
  for (int64_t c = 0; c < d; ++c)
    for (int64_t j = 0; j < n; ++j) kt[c * kAttnBlock + j] = kvt[c * rows + ix[j]];
}

V41_KERNEL void gather_block_t(const float* kvt, int64_t rows, const int32_t* ix, int64_t n, int64_t d, float* kt) {
  gather_block(kvt, rows, ix, n, d, kt);
}
V41_KERNEL void gather_block_t(const double* kvt, int64_t rows, const int32_t* ix, int64_t n, int64_t d, double* kt) {
  gather_block(kvt, rows, ix, n, d, kt);
}
V41_KERNEL void block_scores_t(const float* q, const float* kt, int64_t d, float* dot) {
  block_scores(q, kt, d, dot);
}
V41_KERNEL void block_scores_t(const double* q, const double* kt, int64_t d, double* dot) {
  block_scores(q, kt, d, dot);
}
V41_KERNEL void block_pv_t(const float* p, const float* const* rows, int64_t n, int64_t d, float rescale, float* acc) {
  block_pv(p, rows, n, d, rescale, acc);
}
V41_KERNEL void block_pv_t(const double* p, const double* const* rows, int64_t n, int64_t d, double rescale,
                           double* acc) {
  block_pv(p, rows, n, d, rescale, acc);
}

// kt[c, j] = kvt[c, ix[j]] for a block's n keys (rows > 0). A window's block is consecutive rows, so
// each channel's keys are one copy; other lists are gathered, with row 0 in place of none.
template <typename T>
void gather_keys(const std::vector<T>& kvt, int64_t rows, const int32_t* ix, int64_t n, int64_t d,
                 std::vector<int32_t>& rix, std::vector<T>& kt) {
  int64_t first = 0;
  while (first < n && ix[first] < 0) ++first;
  const int64_t base = first < n ? ix[first] - first : -1;
  bool consecutive = base >= 0 && base + n <= rows;
  for (int64_t j = first; j < n && consecutive; ++j) consecutive = ix[j] < 0 || ix[j] == base + j;
  if (consecutive) {
    for (int64_t c = 0; c < d; ++c)
      std::copy_n(kvt.begin() + c * rows + base, n, kt.begin() + c * kAttnBlock);
    return;
  }
  for (int64_t j = 0; j < n; ++j) rix[static_cast<size_t>(j)] = std::max(ix[j], 0);
  gather_block_t(kvt.data(), rows, rix.data(), n, d, kt.data());
}

// sparse_attn in T (fp32 under bf16, double under f64). The heads of a query walk its index list
// together, block by block, so that a block's keys are gathered (from kv transposed) once for all
// heads; each head keeps its own running max, sum and accumulator, updated in block order. A
// score lane of no key (index -1, or past the list's end) is computed on whatever the lane holds
// and never read.
template <typename T>
void sparse_attn_as(const Arith& a, std::span<const double> q, int64_t N, int64_t H, int64_t d,
                    std::span<const double> kv, std::span<const double> sink, std::span<const int32_t> idxs,
                    int64_t k, double softmax_scale, std::span<double> out) {
  const double scale = a.c(softmax_scale), ninf = -std::numeric_limits<double>::infinity();
  constexpr int64_t pass = kPvVecs * kLanes<T>;
  const int64_t dp = (d + pass - 1) / pass * pass;  // P·V's rows padded with zero channels
  const int64_t rows = static_cast<int64_t>(kv.size()) / d;
  std::vector<T> kvr(static_cast<size_t>(rows * dp), T(0));  // [rows, dp]
  std::vector<T> kvt(static_cast<size_t>(d * rows));         // [d, rows]
  for (int64_t r = 0; r < rows; ++r) std::copy_n(kv.begin() + r * d, d, kvr.begin() + r * dp);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c)
      kvt[static_cast<size_t>(c * rows + r)] = static_cast<T>(kv[static_cast<size_t>(r * d + c)]);
#pragma omp parallel for schedule(static) if (N * H * k * d > kParallelWork)
  for (int64_t t = 0; t < N; ++t) {
    std::vector<T> qt(q.begin() + t * H * d, q.begin() + (t + 1) * H * d), kt(static_cast<size_t>(d * kAttnBlock));
    std::vector<T> acc(static_cast<size_t>(H * dp), T(0)), dot(kAttnBlock), pb(kAttnBlock);
    std::vector<double> mx(static_cast<size_t>(H), a.c(-1e30)), sum(static_cast<size_t>(H), 0.0), s(kAttnBlock);
    std::vector<const T*> live(kAttnBlock);  // the rows of the block's valid keys, in j order
    std::vector<int32_t> rix(kAttnBlock);
    for (int64_t b = 0; b < k; b += kAttnBlock) {
      const int64_t nb = std::min(kAttnBlock, k - b);
      const int32_t* ix = idxs.data() + t * k + b;
      if (rows > 0) gather_keys(kvt, rows, ix, nb, d, rix, kt);
      for (int64_t h = 0; h < H; ++h) {
        block_scores_t(qt.data() + h * d, kt.data(), d, dot.data());
        double bmax = ninf;
        for (int64_t j = 0; j < nb; ++j) {
          const double dj = ix[j] >= 0 ? static_cast<double>(dot[static_cast<size_t>(j)]) : ninf;
          s[static_cast<size_t>(j)] = a.mul(dj, scale);
          bmax = std::max(bmax, s[static_cast<size_t>(j)]);
        }
        double& m = mx[static_cast<size_t>(h)];
        const double prev = m;
        m = std::max(prev, bmax);
        const double rescale = a.exp(a.sub(prev, m));
        double psum = 0.0;
        int64_t n = 0;
        for (int64_t j = 0; j < nb; ++j) {
          s[static_cast<size_t>(j)] = a.exp(a.sub(s[static_cast<size_t>(j)], m));
          psum = a.add(psum, s[static_cast<size_t>(j)]);
          if (ix[j] < 0) continue;  // a zeroed row: p · 0 adds nothing
          pb[static_cast<size_t>(n)] = static_cast<T>(a.bf(s[static_cast<size_t>(j)]));
          live[static_cast<size_t>(n++)] = kvr.data() + ix[j] * dp;
        }
        sum[static_cast<size_t>(h)] = a.add(a.mul(sum[static_cast<size_t>(h)], rescale), psum);
        block_pv_t(pb.data(), live.data(), n, dp, static_cast<T>(rescale), acc.data() + h * dp);
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      const size_t hs = static_cast<size_t>(h);
      const double total = a.add(sum[hs], a.exp(a.sub(sink[hs], mx[hs])));
      double* o = out.data() + (t * H + h) * d;
      for (int64_t c = 0; c < d; ++c)
        o[c] = a.bf(a.div(static_cast<double>(acc[static_cast<size_t>(h * dp + c)]), total));
    }
  }
}

}  // namespace

void sparse_attn(const Arith& a, std::span<const double> q, int64_t N, int64_t H, int64_t d,
                 std::span<const double> kv, std::span<const double> sink, std::span<const int32_t> idxs,
                 int64_t k, double softmax_scale, std::span<double> out) {
  if (a.emulate) return sparse_attn_as<float>(a, q, N, H, d, kv, sink, idxs, k, softmax_scale, out);
  sparse_attn_as<double>(a, q, N, H, d, kv, sink, idxs, k, softmax_scale, out);
}

std::vector<double> compress_pool(const Arith& a, std::span<const double> kv, std::span<const double> score,
                                  int64_t N, int64_t d, int64_t ratio) {
  const int64_t G = N / ratio;
  std::vector<double> out(static_cast<size_t>(G * d)), w(static_cast<size_t>(ratio));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < d; ++c) {
      auto at = [&](std::span<const double> v, int64_t r) { return v[static_cast<size_t>((g * ratio + r) * d + c)]; };
      double mx = at(score, 0);
      for (int64_t r = 1; r < ratio; ++r) mx = std::max(mx, at(score, r));
      double sum = 0.0;
      for (int64_t r = 0; r < ratio; ++r) {
        w[static_cast<size_t>(r)] = a.exp(a.sub(at(score, r), mx));
        sum = a.add(sum, w[static_cast<size_t>(r)]);
      }
      double acc = 0.0;
      for (int64_t r = 0; r < ratio; ++r) acc = a.add(acc, a.mul(at(kv, r), a.div(w[static_cast<size_t>(r)], sum)));
      out[static_cast<size_t>(g * d + c)] = a.bf(acc);
    }
  return out;
}

void candidate_blocks(std::span<const double> score, int64_t visible, int64_t topk_blocks, int64_t block_size,
                      bool as_fp32, std::span<uint8_t> mask, V41TopkTies ties) {
  const int64_t T = static_cast<int64_t>(score.size());
  const int64_t nb = (T + block_size - 1) / block_size;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> bs(static_cast<size_t>(nb), -inf);
  for (int64_t j = 0; j < T; ++j) {
    double& b = bs[static_cast<size_t>(j / block_size)];
    b = std::max(b, score[static_cast<size_t>(j)]);
  }
  // (visible - 1) // block_size with python's floor division: visible 0 pins nothing (block -1).
  if (visible > 0) bs[static_cast<size_t>((visible - 1) / block_size)] = inf;
  // Only the set of blocks matters, and select_topk's set is torch_topk's with torch ties.
  const auto top = select_topk(bs, std::min(topk_blocks, nb), as_fp32, ties);
  std::vector<uint8_t> keep(static_cast<size_t>(nb), 0);
  for (int64_t b : top) keep[static_cast<size_t>(b)] = bs[static_cast<size_t>(b)] > -inf ? 1 : 0;
  for (int64_t j = 0; j < T; ++j) mask[static_cast<size_t>(j)] = keep[static_cast<size_t>(j / block_size)];
}

}  // namespace ced::v41::fwd
