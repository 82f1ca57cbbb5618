// The docs/spec.md §2 weights uploaded to the device (device_weights.hpp).
#include "optimized/lab/device_weights.hpp"

#include "optimized/lab/device_runtime.hpp"
#include "optimized/lab/kernels.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

bool is_matrix(const TensorSpec& t) { return t.shape.size() == 2 && t.kind != TensorKind::Embed; }

double weight_bytes(const std::vector<TensorSpec>& specs, CudaPrecision prec) {
  double b = 0;
  for (const auto& t : specs)
    b += static_cast<double>(t.numel()) * ((is_matrix(t) && prec == CudaPrecision::BF16) ? 2.0 : 4.0);
  return b;
}

DevWeights upload_weights(const Config& c, const Plan& plan, uint64_t seed, CudaPrecision prec) {
  DevWeights w;
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (auto& lw : w.layers) {
    lw.wo_a.resize(static_cast<size_t>(c.o_groups));
    lw.experts.resize(static_cast<size_t>(c.n_routed_experts));
    lw.shared.resize(static_cast<size_t>(c.n_shared_experts));
  }
  for (const TensorSpec& t : weight_specs(c, plan)) {
    const std::vector<double> v = generate_tensor(t, seed);
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
    auto vec = [&](DeviceBuffer<float>& dst) {
      dst.allocate(t.numel());
      dst.upload(f.data(), t.numel());
    };
    auto mat = [&](DevMat& dst) {
      dst.rows = t.shape[0];
      dst.cols = t.shape[1];
      if (prec == CudaPrecision::F32) {
        vec(dst.f32);
      } else {
        DeviceBuffer<float> tmp(t.numel());
        tmp.upload(f.data(), t.numel());
        dst.bf16.allocate(t.numel());
        f32_to_bf16(tmp.get(), dst.cols, dst.bf16.get(), dst.rows, dst.cols);
        rt::synchronize();
      }
    };
    DevLayer* lw = t.layer >= 0 ? &w.layers[size_t(t.layer)] : nullptr;
    const size_t ix = t.index >= 0 ? size_t(t.index) : 0;
    switch (t.kind) {
      case TensorKind::Embed: vec(w.embed); break;
      case TensorKind::AttnNorm: vec(lw->attn_norm); break;
      case TensorKind::FfnNorm: vec(lw->ffn_norm); break;
      case TensorKind::WqA: mat(lw->wq_a); break;
      case TensorKind::QNorm: vec(lw->q_norm); break;
      case TensorKind::WqB: mat(lw->wq_b); break;
      case TensorKind::Wkv: mat(lw->wkv); break;
      case TensorKind::KvNorm: vec(lw->kv_norm); break;
      case TensorKind::AttnSink: vec(lw->attn_sink); break;
      case TensorKind::CompWkv: mat(lw->comp_wkv); break;
      case TensorKind::CompWgate: mat(lw->comp_wgate); break;
      case TensorKind::CompNorm: vec(lw->comp_norm); break;
      case TensorKind::IdxWk: mat(lw->idx_wk); break;
      case TensorKind::IdxKnorm: vec(lw->idx_knorm); break;
      case TensorKind::IdxWq: mat(lw->idx_wq); break;
      case TensorKind::IdxWweights: mat(lw->idx_wweights); break;
      case TensorKind::WoA: mat(lw->wo_a[ix]); break;
      case TensorKind::WoB: mat(lw->wo_b); break;
      case TensorKind::Router: mat(lw->router); break;
      case TensorKind::RouterBias: vec(lw->router_bias); break;
      case TensorKind::ExpertW1: mat(lw->experts[ix].w1); break;
      case TensorKind::ExpertW3: mat(lw->experts[ix].w3); break;
      case TensorKind::ExpertW2: mat(lw->experts[ix].w2); break;
      case TensorKind::SharedW1: mat(lw->shared[ix].w1); break;
      case TensorKind::SharedW3: mat(lw->shared[ix].w3); break;
      case TensorKind::SharedW2: mat(lw->shared[ix].w2); break;
      case TensorKind::FinalNorm: vec(w.final_norm); break;
      case TensorKind::LmHead: mat(w.lm_head); break;
    }
  }
  return w;
}

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
