#pragma once
// The router's admissible results (docs/sound-bounds.md §9): from the MoE's input (the official's ffn_x),
// every expert's gate score as an interval (the fp32 gate GEMM, sqrt-softplus, the bias), the selections
// those intervals admit, and for a given selection each route weight's interval (the renormalisation
// over the chosen experts and route_scale). What the gate judges "experts" and "expert_weights" by.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "compare/op_bounds.hpp"
#include "models/v41/config.hpp"

namespace ced::v41 {

struct V41RouterBounds {
  int64_t N = 0, E = 0, K = 0;
  std::vector<bounds::Interval> score;   // [N, E] sqrt-softplus of the gate logits: what the weights use
  std::vector<bounds::Interval> biased;  // [N, E] score + bias: what the top-k ranks
};

// std::nullopt for a router this derivation does not cover (a score function other than sqrtsoftplus):
// the gate judges it by its budget then. x [N, dim] bf16, gate_weight [E, dim], gate_bias [E].
std::optional<V41RouterBounds> v41_router_bounds(const V41Config& c, std::span<const double> x, int64_t N,
                                                 std::span<const double> gate_weight,
                                                 std::span<const double> gate_bias, const bounds::BoundModel& model);

// The interval of each route weight of row t for the selection `experts` (K ids) from `b`'s scores.
std::vector<bounds::Interval> v41_route_weight_bounds(const V41Config& c, const V41RouterBounds& b, int64_t t,
                                                      std::span<const int64_t> experts, const bounds::BoundModel& model);

}  // namespace ced::v41
