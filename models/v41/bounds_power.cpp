// docs/sound-bounds.md §10: the power of the derived bounds, as a table a user reads: for each kind the
// gate judges by bounds, the smallest planted perturbation it catches on a golden file: one value or one
// weight element scaled by 1 + 2^-k, k raised from 1 until a perturbation passes. A test-only driver:
//   v41_bounds_power golden/v41/wide-fp8-n33.h5 golden/v41/tiny-fp8-n17.h5 > docs/results/v41-bounds-power.md
// Exit 0, 2 on bad input.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <vector>

#include "compare/op_bounds.hpp"
#include "model/error.hpp"
#include "models/v41/agreement.hpp"
#include "models/v41/router_bounds.hpp"

namespace {

using namespace ced;
using namespace ced::v41;

double fp32(double x) { return static_cast<double>(static_cast<float>(x)); }
double bf16(double x) { return bounds::rounded_nearest(fp32(x), fp32(x), 8).lo; }

bool fails(std::span<const double> values, std::span<const bounds::BoundedValue> admissible) {
  return bounds::judge_within(values, admissible).outside > 0;
}

// The largest k in [1, 40] such that every perturbation of size 2^-1 ... 2^-k is caught: 0 when 2^-1 is not.
int smallest_caught(const std::function<bool(double)>& caught_at) {
  int k = 0;
  while (k < 40 && caught_at(std::ldexp(1.0, -(k + 1)))) ++k;
  return k;
}

std::string cell(int k) { return k == 0 ? "not caught at 2^-1" : k == 40 ? "2^-40 (the search's end)" : fmt::format("2^-{}", k); }

void table(const std::filesystem::path& p) {
  const V41RunFile f = read_v41_run_file(p);
  const V41Checkpoint ck = v41_golden_checkpoint(f);
  const V41Model m(ck.config, ck.weights, f.regime);
  const V41Config& c = m.config();
  const int64_t N = f.result.N, D = c.dim, V = c.vocab_size, last = N - 1;
  const bounds::BoundModel model;
  const auto logit_bounds = bounds::linear_bounds(f.result.final_normed, N, D, m.head_weight(), V, model, 24);
  const auto norm_bounds = bounds::rmsnorm_bounds(f.result.final_collapsed, D, m.final_norm_weight(), c.norm_eps, model, 8);
  const std::string name = p.filename().string();
  // The last position's top logit, and the head weight of its row that contributes most to it.
  const auto row = std::span<const double>(f.result.logits).subspan(static_cast<size_t>(last * V), static_cast<size_t>(V));
  const auto j = static_cast<int64_t>(std::max_element(row.begin(), row.end()) - row.begin());
  int64_t i = 0;
  const auto x = [&](int64_t t, int64_t d) { return f.result.final_normed[static_cast<size_t>(t * D + d)]; };
  const auto w = [&](int64_t d) { return m.head_weight()[static_cast<size_t>(j * D + d)]; };
  for (int64_t d = 1; d < D; ++d)
    if (std::fabs(x(last, d) * w(d)) > std::fabs(x(last, i) * w(i))) i = d;
  auto print = [&](const char* kind, const std::string& what, int k) {
    fmt::print("| {} | {} | {} | {} |\n", name, kind, what, cell(k));
  };
  print("logits (forced normed)", fmt::format("the top logit of the last position (vocab {})", j),
        smallest_caught([&](double e) {
          std::vector<double> v = f.result.logits;
          v[static_cast<size_t>(last * V + j)] = fp32(v[static_cast<size_t>(last * V + j)] * (1 + e));
          return fails(v, logit_bounds);
        }));
  print("logits (forced normed)", fmt::format("the head weight [{}, {}] its largest term's", j, i),
        smallest_caught([&](double e) {
          std::vector<double> v = f.result.logits;
          for (int64_t t = 0; t < N; ++t) v[static_cast<size_t>(t * V + j)] = fp32(v[static_cast<size_t>(t * V + j)] + x(t, i) * w(i) * e);
          return fails(v, logit_bounds);
        }));
  print("final_normed (forced collapsed)", fmt::format("element {} of the last position", i), smallest_caught([&](double e) {
          std::vector<double> v = f.result.final_normed;
          v[static_cast<size_t>(last * D + i)] = bf16(v[static_cast<size_t>(last * D + i)] * (1 + e));
          return fails(v, norm_bounds);
        }));
  print("final_normed (forced collapsed)", fmt::format("the norm weight {} (every position)", i), smallest_caught([&](double e) {
          std::vector<double> v(norm_bounds.size());
          for (size_t q = 0; q < v.size(); ++q)
            v[q] = bf16(norm_bounds[q].value * (static_cast<int64_t>(q) % D == i ? 1 + e : 1.0));
          return fails(v, norm_bounds);
        }));
  // The route weights of the first layer's last position.
  const auto& lc = f.result.layers.front();
  const auto rb = v41_router_bounds(c, lc.ffn_x, N, m.gate_weight(0), m.gate_bias(0), model);
  if (rb && !lc.expert_weights.empty()) {
    const int64_t K = c.n_activated_experts;
    const std::vector<int64_t> sel(lc.experts.begin() + last * K, lc.experts.begin() + (last + 1) * K);
    const auto iv = v41_route_weight_bounds(c, *rb, last, sel, model);
    print("expert_weights (forced x)", "the last position's first route weight, layer 0", smallest_caught([&](double e) {
            return !iv.front().contains(fp32(lc.expert_weights[static_cast<size_t>(last * K)] * (1 + e)));
          }));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: v41_bounds_power FILE.h5...\n");
    return 2;
  }
  try {
    fmt::print("| golden file | kind | one element scaled by 1 + 2^-k | smallest caught |\n|---|---|---|---|\n");
    for (int a = 1; a < argc; ++a) table(argv[a]);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "v41_bounds_power: {}\n", e.what());
    return 2;
  }
}
