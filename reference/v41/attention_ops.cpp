// docs/v41.md §8.5, §8.6: the window indices, sparse_attn, the ratio-r pooling of the compressor and
// the candidate blocks (model.py get_window_topk_idxs, Compressor.forward, select_candidate_blocks;
// the kernel's sparse_attn).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "reference/v41/forward_ops.hpp"
#include "reference/v41/lanes.hpp"

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

std::vector<int32_t> probe_window_idxs(int64_t N, int64_t W, int64_t first, int64_t floor) {
  const int64_t lo = std::max(first, floor);
  std::vector<int32_t> idx(static_cast<size_t>(N * W));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < W; ++j) {
      const int64_t q = first + i - W + 1 + j;
      idx[static_cast<size_t>(i * W + j)] = q < 0 ? -1 : q < lo ? kProbeKey : static_cast<int32_t>(q - first);
    }
  return idx;
}

namespace {

// sparse_attn's kernels (lanes.hpp): the scores of a block's keys with a lane per head, and P·V with
// a lane per channel.

// dots[j, lane] = Σ_c qt[c, lane] · rows[j][c] for the n keys (a multiple of kScoreKeys), in c
// order: one vector of kLanes heads (qt: [d, lanes], the heads' queries transposed) against
// kScoreKeys keys at a time (as many sums in flight as keep both arithmetic ports busy), each key's
// row read once for all those heads.
constexpr int64_t kScoreKeys = 8;
template <typename T>
[[gnu::always_inline]] inline void head_scores(const T* qt, const T* const* rows, int64_t n, int64_t d, T* dots) {
  constexpr int64_t L = kLanes<T>;
  for (int64_t j0 = 0; j0 < n; j0 += kScoreKeys) {
    Vec<T> acc[kScoreKeys] = {};
    const T* const* r = rows + j0;
    for (int64_t c = 0; c < d; ++c) {
      Vec<T> qv;
      std::memcpy(&qv, qt + c * L, sizeof qv);
#pragma GCC unroll 8
      for (int64_t j = 0; j < kScoreKeys; ++j) acc[j] = acc[j] + qv * r[j][c];
    }
    std::memcpy(dots + j0 * L, acc, sizeof acc);
  }
}

// For each of Heads heads h: acc_h[c] = acc_h[c] · rescale_h + Σ_j p_h[j] · rows[j][c] over the n
// rows, in j order (p_h = p + h · kAttnBlock, acc_h = acc + h · d). kPvVecs vectors of channels at
// a time for all Heads heads, so that a row's vectors are read once for them (d a multiple: the
// caller pads).
constexpr int64_t kPvVecs = 4;
template <typename T, int64_t Heads>
[[gnu::always_inline]] inline void block_pv(const T* p, const T* const* rows, int64_t n, int64_t d, const T* rescale,
                                            T* acc) {
  for (int64_t c = 0; c < d; c += kPvVecs * kLanes<T>) {
    Vec<T> pv[Heads][kPvVecs] = {};
    for (int64_t j = 0; j < n; ++j)
#pragma GCC unroll 4
      for (int64_t v = 0; v < kPvVecs; ++v) {
        Vec<T> x;
        std::memcpy(&x, rows[j] + c + v * kLanes<T>, sizeof x);
#pragma GCC unroll 2
        for (int64_t h = 0; h < Heads; ++h) pv[h][v] = pv[h][v] + p[h * kAttnBlock + j] * x;
      }
#pragma GCC unroll 2
    for (int64_t h = 0; h < Heads; ++h)
#pragma GCC unroll 4
      for (int64_t v = 0; v < kPvVecs; ++v) {
        T* at = acc + h * d + c + v * kLanes<T>;
        Vec<T> a;
        std::memcpy(&a, at, sizeof a);
        a = a * rescale[h] + pv[h][v];
        std::memcpy(at, &a, sizeof a);
      }
  }
}

V41_KERNEL void head_scores_t(const float* qt, const float* const* rows, int64_t n, int64_t d, float* dots) {
  head_scores(qt, rows, n, d, dots);
}
V41_KERNEL void head_scores_t(const double* qt, const double* const* rows, int64_t n, int64_t d, double* dots) {
  head_scores(qt, rows, n, d, dots);
}
// P·V for heads [0, H): two at a time, the last alone when H is odd.
template <typename T>
[[gnu::always_inline]] inline void heads_pv(const T* p, const T* const* rows, int64_t n, int64_t H, int64_t d,
                                            const T* rescale, T* acc) {
  int64_t h = 0;
  for (; h + 2 <= H; h += 2) block_pv<T, 2>(p + h * kAttnBlock, rows, n, d, rescale + h, acc + h * d);
  if (h < H) block_pv<T, 1>(p + h * kAttnBlock, rows, n, d, rescale + h, acc + h * d);
}
V41_KERNEL void heads_pv_t(const float* p, const float* const* rows, int64_t n, int64_t H, int64_t d,
                           const float* rescale, float* acc) {
  heads_pv(p, rows, n, H, d, rescale, acc);
}
V41_KERNEL void heads_pv_t(const double* p, const double* const* rows, int64_t n, int64_t H, int64_t d,
                           const double* rescale, double* acc) {
  heads_pv(p, rows, n, H, d, rescale, acc);
}

// The index scores of one query (index_scores), a lane per key j: out[j] = Σ_h bf(relu(bf(dots[h, j]))
// · w[h]) in h order, then bf; bf is bf_of (Arith::bf) when `rounded`, else nothing. relu keeps
// std::max(x, 0)'s NaN and -0 (x < 0 ? 0 : x). Keys past the last whole vector take the same ops
// one at a time.
template <typename T>
[[gnu::always_inline]] inline void index_scores_row(const double* dots, int64_t n, int64_t heads, const double* w,
                                                    bool rounded, double* out) {
  constexpr int64_t L = kLanes<T>;
  auto bf = [rounded](Vec<T>& v) {
    if (rounded) bf_lanes<T>(v);
  };
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    Vec<T> s = {};
    for (int64_t h = 0; h < heads; ++h) {
      Vec<T> d;
      load_lanes<T>(d, dots + h * n + j);
      bf(d);
      d = d < T(0) ? Vec<T>{} : d;
      d = d * static_cast<T>(w[h]);
      bf(d);
      s = s + d;
    }
    bf(s);
    store_lanes<T>(out + j, s);
  }
  auto bf1 = [rounded](T v) { return rounded ? bf_of<T>(v) : v; };
  for (; j < n; ++j) {
    T s = 0;
    for (int64_t h = 0; h < heads; ++h) {
      T d = bf1(static_cast<T>(dots[h * n + j]));
      d = d < T(0) ? T(0) : d;
      s = s + bf1(d * static_cast<T>(w[h]));
    }
    out[j] = bf1(s);
  }
}
V41_KERNEL void index_scores_f32(const double* dots, int64_t n, int64_t heads, const double* w, bool rounded,
                                 double* out) {
  index_scores_row<float>(dots, n, heads, w, rounded, out);
}
V41_KERNEL void index_scores_f64(const double* dots, int64_t n, int64_t heads, const double* w, bool rounded,
                                 double* out) {
  index_scores_row<double>(dots, n, heads, w, rounded, out);
}

// sparse_attn in T (fp32 under bf16, double under f64). The heads of a query walk its index list
// together, block by block: a block's valid keys (index >= 0) are listed once, their scores taken
// for all heads (kLanes heads to a vector, the heads padded with zero queries), then each head keeps
// its own running max, sum and accumulator, updated in block order; P·V reads the keys' rows for two
// heads at a time. A key of index -1 has no score (its probability is exp(-inf) = 0 in the sum) and
// no row in P·V; the list is padded to a multiple of kScoreKeys with its last row, whose extra
// scores are never read.
template <typename T>
void sparse_attn_as(const Arith& a, std::span<const double> q, int64_t N, int64_t H, int64_t d,
                    std::span<const double> kv, std::span<const double> sink, std::span<const int32_t> idxs,
                    int64_t k, double softmax_scale, std::span<double> out) {
  constexpr int64_t L = kLanes<T>;
  // The softmax's scalar steps in T: every value an fp32 value under bf16, so fp32 arithmetic and the
  // fp32 exp are Arith's ops; doubles under f64, where Arith rounds nothing.
  const T tscale = static_cast<T>(a.c(softmax_scale)), tinf = -std::numeric_limits<T>::infinity();
  constexpr int64_t pass = kPvVecs * L;
  const int64_t dp = (d + pass - 1) / pass * pass;  // P·V's rows padded with zero channels
  const int64_t hv = (H + L - 1) / L;               // vectors of heads
  const int64_t rows = static_cast<int64_t>(kv.size()) / d;
  std::vector<T> kvr(static_cast<size_t>(rows * dp), T(0));  // [rows, dp]
  for (int64_t r = 0; r < rows; ++r) std::copy_n(kv.begin() + r * d, d, kvr.begin() + r * dp);
#pragma omp parallel if (N * H * k * d > kParallelWork)
  {
    std::vector<T> qt(static_cast<size_t>(hv * d * L)), acc(static_cast<size_t>(H * dp)), rescale(static_cast<size_t>(H));
    std::vector<T> dots(static_cast<size_t>(hv * kAttnBlock * L)), pb(static_cast<size_t>(H * kAttnBlock));
    std::vector<T> mx(static_cast<size_t>(H)), sum(static_cast<size_t>(H)), s(kAttnBlock);
    std::vector<const T*> live(kAttnBlock);  // the rows of the block's valid keys, in j order, padded
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      // qt: [hv, d, lanes], head h at lane h % lanes of vector h / lanes.
      std::fill(qt.begin(), qt.end(), T(0));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < d; ++c)
          qt[static_cast<size_t>(((h / L) * d + c) * L + h % L)] = static_cast<T>(q[static_cast<size_t>((t * H + h) * d + c)]);
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(mx.begin(), mx.end(), static_cast<T>(a.c(-1e30)));
      std::fill(sum.begin(), sum.end(), T(0));
      for (int64_t b = 0; b < k; b += kAttnBlock) {
        const int64_t nb = std::min(kAttnBlock, k - b);
        const int32_t* ix = idxs.data() + t * k + b;
        int64_t n = 0;
        for (int64_t j = 0; j < nb; ++j)
          if (ix[j] >= 0) live[static_cast<size_t>(n++)] = kvr.data() + ix[j] * dp;
        const int64_t n_pad = (n + kScoreKeys - 1) / kScoreKeys * kScoreKeys;
        for (int64_t j = n; j < n_pad; ++j) live[static_cast<size_t>(j)] = live[static_cast<size_t>(n - 1)];
        for (int64_t v = 0; v < hv; ++v)
          head_scores_t(qt.data() + v * d * L, live.data(), n_pad, d, dots.data() + v * kAttnBlock * L);
        for (int64_t h = 0; h < H; ++h) {
          const T* dh = dots.data() + (h / L) * kAttnBlock * L + h % L;  // key i at dh[i · lanes]
          T bmax = tinf;
          for (int64_t j = 0, i = 0; j < nb; ++j) {
            const T dj = ix[j] >= 0 ? dh[(i++) * L] : tinf;
            s[static_cast<size_t>(j)] = dj * tscale;
            bmax = std::max(bmax, s[static_cast<size_t>(j)]);
          }
          T& m = mx[static_cast<size_t>(h)];
          const T prev = m;
          m = std::max(prev, bmax);
          const T r = std::exp(prev - m);
          T psum = 0;
          T* ph = pb.data() + h * kAttnBlock;
          for (int64_t j = 0, i = 0; j < nb; ++j) {
            s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - m);
            psum = psum + s[static_cast<size_t>(j)];
            if (ix[j] >= 0) ph[i++] = bf_of<T>(s[static_cast<size_t>(j)]);
          }
          sum[static_cast<size_t>(h)] = sum[static_cast<size_t>(h)] * r + psum;
          rescale[static_cast<size_t>(h)] = r;
        }
        heads_pv_t(pb.data(), live.data(), n, H, dp, rescale.data(), acc.data());
      }
      for (int64_t h = 0; h < H; ++h) {
        const size_t hs = static_cast<size_t>(h);
        const double total = a.add(sum[hs], a.exp(a.sub(sink[hs], static_cast<double>(mx[hs]))));
        double* o = out.data() + (t * H + h) * d;
        for (int64_t c = 0; c < d; ++c)
          o[c] = a.bf(a.div(static_cast<double>(acc[static_cast<size_t>(h * dp + c)]), total));
      }
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

void index_scores(const LayerCtx& L, const double* dots, int64_t n, const double* w, double* out) {
  // Under f64 Arith::bf rounds nothing, so only the emulating regimes' bf16 scores are rounded.
  const bool rounded = L.a.emulate && L.options.index_scores == V41IndexScores::bf16;
  if (L.fault == V41Fault::index_relu_dropped) {  // the planted port bug: the same sums with no relu
    auto bf1 = [&](double v) { return rounded ? L.a.bf(v) : v; };
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t h = 0; h < L.c.index_n_heads; ++h) s = L.a.add(s, bf1(L.a.mul(bf1(dots[h * n + j]), w[h])));
      out[j] = bf1(s);
    }
    return;
  }
  (L.a.emulate ? index_scores_f32 : index_scores_f64)(dots, n, L.c.index_n_heads, w, rounded, out);
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
