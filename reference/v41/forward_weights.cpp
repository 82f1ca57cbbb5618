// docs/v41.md §8.2: reading the release's tensors for the forward (names, dtypes and layouts of
// README "Weights: the release's file layout"; the dequantizations of docs/v41.md §3.4, §3.5).
#include "reference/v41/forward_weights.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/error.hpp"
#include "models/v41/numerics.hpp"

namespace ced::v41 {
namespace {

const SafetensorsTensor& need(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensor* t = f.find(name);
  if (!t) throw InputError(fmt::format("v41 weights: {}: missing", name));
  return *t;
}

void need_shape(const SafetensorsTensor& t, const std::vector<int64_t>& shape) {
  if (t.shape != shape)
    throw InputError(fmt::format("v41 weights: {}: shape [{}], the layout has [{}]", t.name, fmt::join(t.shape, ", "),
                                 fmt::join(shape, ", ")));
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// A linear weight [out, in]: F8_E4M3 with an F8_E8M0 scale per 32x32 tile, or I8 (packed e2m1) with
// an F8_E8M0 scale per 32 along K, or plain BF16 / F32.
V41Linear linear_weight(const SafetensorsFile& f, const std::string& prefix, int64_t out, int64_t in) {
  const SafetensorsTensor& w = need(f, prefix + ".weight");
  V41Linear l;
  l.out = out;
  l.in = in;
  std::vector<float> v(static_cast<size_t>(out * in));
  if (w.dtype == "F8_E4M3") {
    need_shape(w, {out, in});
    const SafetensorsTensor& s = need(f, prefix + ".scale");
    if (s.dtype != "F8_E8M0") throw InputError(fmt::format("v41 weights: {}: {}, the layout has F8_E8M0", s.name, s.dtype));
    need_shape(s, {(out + 31) / 32, (in + 31) / 32});
    dequant_fp8_weight(w.bytes, s.bytes, out, in, v);
    l.w = widen(v);
    l.kind = V41Linear::Kind::Fp8Tiles;
    for (uint8_t b : s.bytes) l.scale.push_back(f32_from_e8m0(b));
  } else if (w.dtype == "I8") {
    need_shape(w, {out, in / 2});
    const SafetensorsTensor& s = need(f, prefix + ".scale");
    if (s.dtype != "F8_E8M0") throw InputError(fmt::format("v41 weights: {}: {}, the layout has F8_E8M0", s.name, s.dtype));
    need_shape(s, {out, in / 32});
    dequant_fp4_weight(w.bytes, s.bytes, out, in, v);
    l.w = widen(v);
    l.kind = V41Linear::Kind::Fp4Rows;
    for (uint8_t b : s.bytes) l.scale.push_back(f32_from_e8m0(b));
  } else if (w.dtype == "BF16" || w.dtype == "F32") {
    need_shape(w, {out, in});
    l.w = safetensors_values(w);
  } else {
    throw InputError(fmt::format("v41 weights: {}: dtype {} is not a linear weight's", w.name, w.dtype));
  }
  return l;
}

V41ExpertWeights expert(const SafetensorsFile& f, const std::string& p, int64_t dim, int64_t inter) {
  return {linear_weight(f, p + ".w1", inter, dim), linear_weight(f, p + ".w2", dim, inter),
          linear_weight(f, p + ".w3", inter, dim)};
}

}  // namespace

std::vector<double> load_v41_tensor(const SafetensorsFile& f, const std::string& name,
                                    const std::vector<int64_t>& shape) {
  const SafetensorsTensor& t = need(f, name);
  if (t.dtype != "BF16" && t.dtype != "F32")
    throw InputError(fmt::format("v41 weights: {}: dtype {}, the layout has BF16 or F32", name, t.dtype));
  need_shape(t, shape);
  return safetensors_values(t);
}

V41LayerWeights load_v41_layer_weights(const V41Config& c, const LayerPlan& lp, const SafetensorsFile& f) {
  const std::string L = fmt::format("layers.{}.", lp.layer);
  const int64_t hc = c.hc_mult, nm = (2 + hc) * hc, D = c.dim;
  V41LayerWeights w;
  w.attn_norm = load_v41_tensor(f, L + "attn_norm.weight", {D});
  w.ffn_norm = load_v41_tensor(f, L + "ffn_norm.weight", {D});
  w.hc_attn_fn = load_v41_tensor(f, L + "hc_attn_fn", {nm, hc * D});
  w.hc_ffn_fn = load_v41_tensor(f, L + "hc_ffn_fn", {nm, hc * D});
  w.hc_attn_base = load_v41_tensor(f, L + "hc_attn_base", {nm});
  w.hc_ffn_base = load_v41_tensor(f, L + "hc_ffn_base", {nm});
  w.hc_attn_scale = load_v41_tensor(f, L + "hc_attn_scale", {3});
  w.hc_ffn_scale = load_v41_tensor(f, L + "hc_ffn_scale", {3});

  const std::string A = L + "attn.";
  const int64_t H = c.n_heads, hd = c.head_dim;
  w.attn_sink = load_v41_tensor(f, A + "attn_sink", {H});
  w.wq_a = linear_weight(f, A + "wq_a", c.q_lora_rank, D);
  w.q_norm = load_v41_tensor(f, A + "q_norm.weight", {c.q_lora_rank});
  w.wq_b = linear_weight(f, A + "wq_b", H * hd, c.q_lora_rank);
  w.wkv = linear_weight(f, A + "wkv", hd, D);
  w.kv_norm = load_v41_tensor(f, A + "kv_norm.weight", {hd});
  w.wo_a = linear_weight(f, A + "wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups);
  w.wo_a.kind = V41Linear::Kind::Plain;  // the release's conversion dequantizes it to bf16 at load
  w.wo_b = linear_weight(f, A + "wo_b", D, c.o_groups * c.o_lora_rank);
  if (lp.owns_compressor) {
    w.compressor_wkv = linear_weight(f, A + "compressor.wkv", hd, D);
    w.compressor_norm = load_v41_tensor(f, A + "compressor.norm.weight", {hd});
  }
  if (lp.owns_wgate) w.compressor_wgate = linear_weight(f, A + "compressor.wgate", hd, D);
  if (lp.owns_indexer) {
    w.indexer_wq_b = linear_weight(f, A + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    w.indexer_weights_proj = linear_weight(f, A + "indexer.weights_proj", c.index_n_heads, D);
  }
  if (lp.owns_index_k) {
    w.indexer_wk = linear_weight(f, A + "indexer.wk", c.index_head_dim, hd);
    w.indexer_k_norm = load_v41_tensor(f, A + "indexer.k_norm.weight", {c.index_head_dim});
  }

  const std::string F = L + "ffn.";
  const int64_t E = c.n_routed_experts, I = c.moe_inter_dim;
  w.gate = linear_weight(f, F + "gate", E, D);
  w.gate_bias = load_v41_tensor(f, F + "gate.bias", {E});
  for (int64_t e = 0; e < E; ++e) w.experts.push_back(expert(f, fmt::format("{}experts.{}", F, e), D, I));
  w.shared = expert(f, F + "shared_experts", D, I);

  if (lp.engram) {
    const std::string G = L + "engram.";
    size_t k = 0;
    while (c.engram_layer_ids[k] != lp.layer) ++k;
    const int64_t rows = c.engram_num_embeddings[k], ed = c.engram_head_dim;
    const int64_t cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
    const SafetensorsTensor& t = need(f, G + "embed.weight");
    const SafetensorsTensor& s = need(f, G + "embed.scale");
    if (t.dtype != "F8_E4M3" || s.dtype != "F8_E8M0")
      throw InputError(fmt::format("v41 weights: {}: {} with a {} scale, the layout has F8_E4M3 with F8_E8M0", t.name,
                                   t.dtype, s.dtype));
    need_shape(t, {rows, ed});
    need_shape(s, {rows, ed / 32});
    // One e8m0 scale per 32 of a row: the code's value times 2^(b - 127), then bf16 (exact).
    w.engram_rows = rows;
    w.engram_table.resize(static_cast<size_t>(rows * ed));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < ed; ++j)
        w.engram_table[static_cast<size_t>(r * ed + j)] =
            round_bf16(f32_from_e4m3(t.bytes[static_cast<size_t>(r * ed + j)]) *
                       f32_from_e8m0(s.bytes[static_cast<size_t>(r * (ed / 32) + j / 32)]));
    w.engram_wkv = linear_weight(f, G + "wkv", (hc + 1) * D, cols * ed);
    w.engram_q = load_v41_tensor(f, G + "q_weight", {hc, D});
    w.engram_k = load_v41_tensor(f, G + "k_weight", {hc, D});
  }
  return w;
}

}  // namespace ced::v41
