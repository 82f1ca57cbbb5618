// docs/v41.md §9.1: the MoE (model.py Gate, Expert, MoE): the sqrt-softplus gate with its bias and
// 1e-20 renormalisation, clamped SwiGLU on routed and shared experts, the fp32 sum in ascending
// expert order, then the shared expert, then one bf16 rounding.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "reference/v41/forward_ops.hpp"

namespace ced::v41::fwd {

void gate_weights(const Arith& a, std::span<const double> logits, std::span<const double> bias, int64_t topk,
                  double gate_temp, bool norm_topk_prob, double route_scale, const std::string& score_func,
                  std::span<int64_t> experts, std::span<double> weights, V41TopkTies ties) {
  const int64_t E = static_cast<int64_t>(logits.size());
  std::vector<double> s(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) s[static_cast<size_t>(e)] = a.div(logits[static_cast<size_t>(e)], a.c(gate_temp));
  if (score_func == "sqrtsoftplus") {
    for (double& v : s) v = a.sqrt(a.softplus(v));
  } else if (score_func == "sigmoid") {
    for (double& v : s) v = a.sigmoid(v);
  } else {  // softmax
    double mx = s[0], sum = 0.0;
    for (double v : s) mx = std::max(mx, v);
    for (double& v : s) sum = a.add(sum, v = a.exp(a.sub(v, mx)));
    for (double& v : s) v = a.div(v, sum);
  }
  for (int64_t e = 0; e < E; ++e)
    biased[static_cast<size_t>(e)] = a.add(s[static_cast<size_t>(e)], bias[static_cast<size_t>(e)]);
  const auto top = ties == V41TopkTies::torch ? torch_topk(biased, topk, true, a.emulate)
                                               : select_topk(biased, topk, a.emulate, ties);
  double sum = 0.0;
  for (int64_t j = 0; j < topk; ++j) {
    experts[static_cast<size_t>(j)] = top[static_cast<size_t>(j)];
    weights[static_cast<size_t>(j)] = s[static_cast<size_t>(top[static_cast<size_t>(j)])];
    sum = a.add(sum, weights[static_cast<size_t>(j)]);
  }
  if (norm_topk_prob && topk > 1) {
    const double d = a.add(sum, a.c(1e-20));  // a literal, not norm_eps
    for (int64_t j = 0; j < topk; ++j) weights[static_cast<size_t>(j)] = a.div(weights[static_cast<size_t>(j)], d);
  }
  for (int64_t j = 0; j < topk; ++j)
    weights[static_cast<size_t>(j)] = a.mul(weights[static_cast<size_t>(j)], a.c(route_scale));
}

void swiglu(const Arith& a, std::span<const double> g, std::span<const double> u, double limit, const double* weight,
            std::span<double> h) {
  for (size_t i = 0; i < h.size(); ++i) {
    double gi = g[i], ui = u[i];
    if (limit > 0) {
      ui = std::clamp(ui, -limit, limit);
      gi = std::min(gi, limit);
    }
    h[i] = a.mul(a.silu(gi), ui);
    if (weight) h[i] = a.mul(*weight, h[i]);
  }
}

namespace {

// One expert on rows x [M, dim] (bf16), each row with its route weight (or none): [M, dim] bf16.
std::vector<double> expert_forward(const LayerCtx& L, const V41ExpertWeights& w, std::span<const double> x, int64_t M,
                                   const std::vector<double>* route) {
  const int64_t I = w.w1.out, D = w.w1.in;
  std::vector<double> g(static_cast<size_t>(M * I)), u(g.size()), h(g.size()), y(static_cast<size_t>(M * D));
  linear_w(L.a, x, M, w.w1, g, true);
  linear_w(L.a, x, M, w.w3, u, true);
  const double limit = route == nullptr && L.fault == V41Fault::unclamped_shared_expert ? 0.0 : L.c.swiglu_limit;
  for (int64_t m = 0; m < M; ++m) {
    const auto row = [&](std::vector<double>& v) {
      return std::span<double>(v).subspan(static_cast<size_t>(m * I), static_cast<size_t>(I));
    };
    swiglu(L.a, row(g), row(u), limit, route ? &(*route)[static_cast<size_t>(m)] : nullptr, row(h));
  }
  for (double& v : h) v = L.a.bf(v);  // x.to(dtype) before w2
  linear_w(L.a, h, M, w.w2, y, true);
  return y;
}

}  // namespace

std::vector<double> moe_forward(const LayerCtx& L, std::span<const double> x, V41LayerCapture& cap) {
  const V41Config& c = L.c;
  const int64_t N = L.N, D = c.dim, E = c.n_routed_experts, K = c.n_activated_experts;
  std::vector<double> logits(static_cast<size_t>(N * E));
  linear(L.a, x, N, D, L.w.gate.w, E, logits, false);  // fp32: x.float() · weight.float()
  std::vector<int64_t> chosen(static_cast<size_t>(N * K));
  std::vector<double> wts(static_cast<size_t>(N * K));
  for (int64_t t = 0; t < N; ++t)
    gate_weights(L.a, std::span<const double>(logits).subspan(static_cast<size_t>(t * E), static_cast<size_t>(E)),
                 L.w.gate_bias, K, c.gate_temp, c.norm_topk_prob, c.route_scale, c.score_func,
                 std::span<int64_t>(chosen).subspan(static_cast<size_t>(t * K), static_cast<size_t>(K)),
                 std::span<double>(wts).subspan(static_cast<size_t>(t * K), static_cast<size_t>(K)),
                 L.fault == V41Fault::router_ties_lowest_index ? V41TopkTies::lowest_index : V41TopkTies::torch);
  cap.experts.resize(chosen.size());
  cap.expert_weights.resize(chosen.size());
  for (int64_t t = 0; t < N; ++t) {
    std::vector<std::pair<int64_t, double>> row;
    for (int64_t j = 0; j < K; ++j) row.emplace_back(chosen[static_cast<size_t>(t * K + j)], wts[static_cast<size_t>(t * K + j)]);
    std::sort(row.begin(), row.end());
    for (int64_t j = 0; j < K; ++j) {
      cap.experts[static_cast<size_t>(t * K + j)] = static_cast<int32_t>(row[static_cast<size_t>(j)].first);
      cap.expert_weights[static_cast<size_t>(t * K + j)] = row[static_cast<size_t>(j)].second;
    }
  }

  std::vector<double> y(static_cast<size_t>(N * D), 0.0);  // fp32 accumulator
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> rows;
    std::vector<double> route, xe;
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < K; ++j)
        if (chosen[static_cast<size_t>(t * K + j)] == e) {
          rows.push_back(t);
          route.push_back(wts[static_cast<size_t>(t * K + j)]);
          xe.insert(xe.end(), x.begin() + t * D, x.begin() + (t + 1) * D);
        }
    if (rows.empty()) continue;
    const auto ye = expert_forward(L, L.w.experts[static_cast<size_t>(e)], xe, static_cast<int64_t>(rows.size()), &route);
    for (size_t m = 0; m < rows.size(); ++m)
      for (int64_t d = 0; d < D; ++d) {
        double& acc = y[static_cast<size_t>(rows[m] * D + d)];
        acc = L.a.add(acc, ye[m * static_cast<size_t>(D) + static_cast<size_t>(d)]);
      }
  }
  const auto ys = expert_forward(L, L.w.shared, x, N, nullptr);
  for (size_t i = 0; i < y.size(); ++i) y[i] = L.a.bf(L.a.add(y[i], ys[i]));
  return y;
}

}  // namespace ced::v41::fwd
