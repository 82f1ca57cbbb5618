// docs/v41.md §8.5, §8.6: the window indices, sparse_attn, the ratio-r pooling of the compressor and
// the candidate blocks (model.py get_window_topk_idxs, Compressor.forward, select_candidate_blocks;
// the kernel's sparse_attn).
#include <algorithm>
#include <cmath>
#include <limits>

#include "models/v41/forward_ops.hpp"

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

void sparse_attn(const Arith& a, std::span<const double> q, int64_t N, int64_t H, int64_t d,
                 std::span<const double> kv, std::span<const double> sink, std::span<const int32_t> idxs,
                 int64_t k, double softmax_scale, std::span<double> out) {
  const double scale = a.c(softmax_scale), ninf = -std::numeric_limits<double>::infinity();
#pragma omp parallel for schedule(static) if (N * H * k * d > kParallelWork)
  for (int64_t t = 0; t < N; ++t) {
    std::vector<double> s(kAttnBlock), acc(static_cast<size_t>(d));
    for (int64_t h = 0; h < H; ++h) {
      const double* qv = q.data() + (t * H + h) * d;
      std::fill(acc.begin(), acc.end(), 0.0);
      double mx = a.c(-1e30), sum = 0.0;
      for (int64_t b = 0; b < k; b += kAttnBlock) {
        const int64_t nb = std::min(kAttnBlock, k - b);
        double bmax = ninf;
        for (int64_t j = 0; j < nb; ++j) {
          const int32_t p = idxs[static_cast<size_t>(t * k + b + j)];
          double dot = ninf;
          if (p >= 0) {
            const double* kr = kv.data() + static_cast<int64_t>(p) * d;
            dot = 0.0;
            for (int64_t c = 0; c < d; ++c) dot = a.add(dot, a.mul(qv[c], kr[c]));
          }
          s[static_cast<size_t>(j)] = a.mul(dot, scale);
          bmax = std::max(bmax, s[static_cast<size_t>(j)]);
        }
        const double prev = mx;
        mx = std::max(prev, bmax);
        const double rescale = a.exp(a.sub(prev, mx));
        double psum = 0.0;
        for (int64_t j = 0; j < nb; ++j) {
          s[static_cast<size_t>(j)] = a.exp(a.sub(s[static_cast<size_t>(j)], mx));
          psum = a.add(psum, s[static_cast<size_t>(j)]);
        }
        sum = a.add(a.mul(sum, rescale), psum);
        for (int64_t c = 0; c < d; ++c) {
          double pv = 0.0;
          for (int64_t j = 0; j < nb; ++j) {
            const int32_t p = idxs[static_cast<size_t>(t * k + b + j)];
            if (p < 0) continue;  // a zeroed row: p · 0 adds nothing
            pv = a.add(pv, a.mul(a.bf(s[static_cast<size_t>(j)]), kv[static_cast<size_t>(p * d + c)]));
          }
          acc[static_cast<size_t>(c)] = a.add(a.mul(acc[static_cast<size_t>(c)], rescale), pv);
        }
      }
      sum = a.add(sum, a.exp(a.sub(sink[static_cast<size_t>(h)], mx)));
      double* o = out.data() + (t * H + h) * d;
      for (int64_t c = 0; c < d; ++c) o[c] = a.bf(a.div(acc[static_cast<size_t>(c)], sum));
    }
  }
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
                      bool as_fp32, std::span<uint8_t> mask) {
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
  const auto top = torch_topk(bs, std::min(topk_blocks, nb), true, as_fp32);
  std::vector<uint8_t> keep(static_cast<size_t>(nb), 0);
  for (int64_t b : top) keep[static_cast<size_t>(b)] = bs[static_cast<size_t>(b)] > -inf ? 1 : 0;
  for (int64_t j = 0; j < T; ++j) mask[static_cast<size_t>(j)] = keep[static_cast<size_t>(j / block_size)];
}

}  // namespace ced::v41::fwd
