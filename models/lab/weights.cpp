// docs/spec.md §2.
#include "models/lab/weights.hpp"

#include <fmt/format.h>

#include <cmath>

namespace ced {

std::vector<int32_t> make_tokens(uint64_t token_seed, int64_t vocab_size, int64_t count) {
  const uint64_t base = fnv1a64("tokens") ^ splitmix64(token_seed);
  std::vector<int32_t> t(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    t[size_t(i)] = static_cast<int32_t>(splitmix64(base + static_cast<uint64_t>(i)) % static_cast<uint64_t>(vocab_size));
  return t;
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<TensorSpec> weight_specs(const Config& c, const Plan& p) {
  std::vector<TensorSpec> out;
  auto proj = [](int64_t in) { return std::sqrt(3.0 / static_cast<double>(in)); };
  auto add = [&](std::string name, std::vector<int64_t> shape, double center, double scale, TensorKind kind,
                 int64_t layer = -1, int64_t index = -1, std::string gen_name = {}) {
    TensorSpec t;
    t.gen_name = gen_name.empty() ? name : gen_name;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.center = center;
    t.scale = scale;
    t.kind = kind;
    t.layer = layer;
    t.index = index;
    out.push_back(std::move(t));
  };
  auto matrix = [&](std::string name, int64_t in, int64_t o, TensorKind kind, int64_t layer = -1, int64_t index = -1,
                    std::string gen_name = {}) {
    add(std::move(name), {in, o}, 0.0, proj(in), kind, layer, index, std::move(gen_name));
  };
  const int64_t d = c.d_model, hd = c.head_dim, q = c.q_lora_rank;
  add("embed", {c.vocab_size, d}, 0.0, std::sqrt(3.0), TensorKind::Embed);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto& lp = p[l];
    const std::string L = fmt::format("layers.{}.", l);
    add(L + "attn_norm", {d}, 1.0, 0.1, TensorKind::AttnNorm, l);
    add(L + "ffn_norm", {d}, 1.0, 0.1, TensorKind::FfnNorm, l);
    matrix(L + "wq_a", d, q, TensorKind::WqA, l);
    add(L + "q_norm", {q}, 1.0, 0.1, TensorKind::QNorm, l);
    matrix(L + "wq_b", q, c.n_heads * hd, TensorKind::WqB, l);
    matrix(L + "wkv", d, hd, TensorKind::Wkv, l);
    add(L + "kv_norm", {hd}, 1.0, 0.1, TensorKind::KvNorm, l);
    add(L + "attn_sink", {c.n_heads}, 0.0, 1.0, TensorKind::AttnSink, l);
    if (lp.role == Role::Full) {
      const std::string G = fmt::format("layers.{}.", lp.comp_weight_layer);
      matrix(L + "comp_wkv", d, hd, TensorKind::CompWkv, l, -1, G + "comp_wkv");
      if (lp.ratio >= 2) matrix(L + "comp_wgate", d, hd, TensorKind::CompWgate, l, -1, G + "comp_wgate");
      add(L + "comp_norm", {hd}, 1.0, 0.1, TensorKind::CompNorm, l, -1, G + "comp_norm");
      matrix(L + "idx_wk", hd, c.index_head_dim, TensorKind::IdxWk, l, -1, G + "idx_wk");
      add(L + "idx_knorm", {c.index_head_dim}, 1.0, 0.1, TensorKind::IdxKnorm, l, -1, G + "idx_knorm");
    }
    if (lp.index_source) {
      matrix(L + "idx_wq", q, c.index_n_heads * c.index_head_dim, TensorKind::IdxWq, l);
      matrix(L + "idx_wweights", d, c.index_n_heads, TensorKind::IdxWweights, l);
    }
    const int64_t per_group = (c.n_heads / c.o_groups) * hd;
    for (int64_t g = 0; g < c.o_groups; ++g)
      matrix(fmt::format("{}wo_a.{}", L, g), per_group, c.o_lora_rank, TensorKind::WoA, l, g);
    matrix(L + "wo_b", c.o_groups * c.o_lora_rank, d, TensorKind::WoB, l);
    if (c.n_routed_experts > 0) {
      matrix(L + "router", d, c.n_routed_experts, TensorKind::Router, l);
      add(L + "router_bias", {c.n_routed_experts}, 0.0, 0.1, TensorKind::RouterBias, l);
    }
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const std::string X = fmt::format("{}expert.{}.", L, e);
      matrix(X + "w1", d, c.moe_dim, TensorKind::ExpertW1, l, e);
      matrix(X + "w3", d, c.moe_dim, TensorKind::ExpertW3, l, e);
      matrix(X + "w2", c.moe_dim, d, TensorKind::ExpertW2, l, e);
    }
    for (int64_t s = 0; s < c.n_shared_experts; ++s) {
      const std::string X = fmt::format("{}shared.{}.", L, s);
      matrix(X + "w1", d, c.moe_dim, TensorKind::SharedW1, l, s);
      matrix(X + "w3", d, c.moe_dim, TensorKind::SharedW3, l, s);
      matrix(X + "w2", c.moe_dim, d, TensorKind::SharedW2, l, s);
    }
  }
  add("final_norm", {d}, 1.0, 0.1, TensorKind::FinalNorm);
  matrix("lm_head", d, c.vocab_size, TensorKind::LmHead);
  return out;
}

std::vector<double> generate_tensor(const TensorSpec& t, uint64_t weight_seed) {
  const uint64_t key = tensor_key(weight_seed, t.gen_name);
  const int64_t n = t.numel();
  std::vector<double> v(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = weight_element(key, static_cast<uint64_t>(i), t.center, t.scale);
  return v;
}

namespace {

template <class T>
Mat<T> to_mat(const TensorSpec& t, const std::vector<double>& v) {
  Mat<T> m(t.shape[0], t.shape[1]);
  for (int64_t i = 0; i < t.numel(); ++i) m.data()[i] = static_cast<T>(v[size_t(i)]);
  return m;
}

template <class T>
Vec<T> to_vec(const TensorSpec& t, const std::vector<double>& v) {
  Vec<T> m(t.shape[0]);
  for (int64_t i = 0; i < t.numel(); ++i) m.data()[i] = static_cast<T>(v[size_t(i)]);
  return m;
}

}  // namespace

template <class T>
Weights<T> generate_weights(const Config& c, const Plan& p, uint64_t weight_seed) {
  Weights<T> w;
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (auto& lw : w.layers) {
    lw.wo_a.resize(static_cast<size_t>(c.o_groups));
    lw.experts.resize(static_cast<size_t>(c.n_routed_experts));
    lw.shared.resize(static_cast<size_t>(c.n_shared_experts));
  }
  for (const TensorSpec& t : weight_specs(c, p)) {
    const auto v = generate_tensor(t, weight_seed);
    LayerWeights<T>* lw = t.layer >= 0 ? &w.layers[size_t(t.layer)] : nullptr;
    const size_t ix = t.index >= 0 ? size_t(t.index) : 0;
    switch (t.kind) {
      case TensorKind::Embed: w.embed = to_mat<T>(t, v); break;
      case TensorKind::AttnNorm: lw->attn_norm = to_vec<T>(t, v); break;
      case TensorKind::FfnNorm: lw->ffn_norm = to_vec<T>(t, v); break;
      case TensorKind::WqA: lw->wq_a = to_mat<T>(t, v); break;
      case TensorKind::QNorm: lw->q_norm = to_vec<T>(t, v); break;
      case TensorKind::WqB: lw->wq_b = to_mat<T>(t, v); break;
      case TensorKind::Wkv: lw->wkv = to_mat<T>(t, v); break;
      case TensorKind::KvNorm: lw->kv_norm = to_vec<T>(t, v); break;
      case TensorKind::AttnSink: lw->attn_sink = to_vec<T>(t, v); break;
      case TensorKind::CompWkv: lw->comp_wkv = to_mat<T>(t, v); break;
      case TensorKind::CompWgate: lw->comp_wgate = to_mat<T>(t, v); break;
      case TensorKind::CompNorm: lw->comp_norm = to_vec<T>(t, v); break;
      case TensorKind::IdxWk: lw->idx_wk = to_mat<T>(t, v); break;
      case TensorKind::IdxKnorm: lw->idx_knorm = to_vec<T>(t, v); break;
      case TensorKind::IdxWq: lw->idx_wq = to_mat<T>(t, v); break;
      case TensorKind::IdxWweights: lw->idx_wweights = to_mat<T>(t, v); break;
      case TensorKind::WoA: lw->wo_a[ix] = to_mat<T>(t, v); break;
      case TensorKind::WoB: lw->wo_b = to_mat<T>(t, v); break;
      case TensorKind::Router: lw->router = to_mat<T>(t, v); break;
      case TensorKind::RouterBias: lw->router_bias = to_vec<T>(t, v); break;
      case TensorKind::ExpertW1: lw->experts[ix].w1 = to_mat<T>(t, v); break;
      case TensorKind::ExpertW3: lw->experts[ix].w3 = to_mat<T>(t, v); break;
      case TensorKind::ExpertW2: lw->experts[ix].w2 = to_mat<T>(t, v); break;
      case TensorKind::SharedW1: lw->shared[ix].w1 = to_mat<T>(t, v); break;
      case TensorKind::SharedW3: lw->shared[ix].w3 = to_mat<T>(t, v); break;
      case TensorKind::SharedW2: lw->shared[ix].w2 = to_mat<T>(t, v); break;
      case TensorKind::FinalNorm: w.final_norm = to_vec<T>(t, v); break;
      case TensorKind::LmHead: w.lm_head = to_mat<T>(t, v); break;
    }
  }
  return w;
}

template Weights<float> generate_weights<float>(const Config&, const Plan&, uint64_t);
template Weights<double> generate_weights<double>(const Config&, const Plan&, uint64_t);

}  // namespace ced
