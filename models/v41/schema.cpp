// docs/v41.md §11.1: the release's tensors for a config, read off the official module tree
// (inference/model.py's Transformer, Block, Attention, Compressor, Indexer, MoE, Engram) with the
// dtypes the release's files store.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"

namespace ced::v41 {
namespace {

constexpr int64_t kBlock = 32;  // weight_block_size [32, 32]; one FP4 / Engram-row scale per 32

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct SchemaBuilder {
  std::vector<V41TensorSpec> out;

  void plain(std::string name, V41Format f, std::vector<int64_t> shape) {
    out.push_back({std::move(name), f == V41Format::F32 ? "F32" : "BF16", std::move(shape), f, "", ""});
  }
  // A quantized weight and its scale. owner: the module ("layers.0.attn.wq_a").
  void quantized(const std::string& owner, V41Format f, int64_t rows, int64_t cols) {
    const std::string w = owner + ".weight", s = owner + ".scale";
    switch (f) {
      case V41Format::Fp8Tiles:
        out.push_back({w, "F8_E4M3", {rows, cols}, f, s, ""});
        out.push_back({s, "F8_E8M0", {ceil_div(rows, kBlock), ceil_div(cols, kBlock)}, V41Format::Scale, "", w});
        break;
      case V41Format::Fp8Rows:
        out.push_back({w, "F8_E4M3", {rows, cols}, f, s, ""});
        out.push_back({s, "F8_E8M0", {rows, cols / kBlock}, V41Format::Scale, "", w});
        break;
      case V41Format::Fp4K32:  // cols: the logical K; two codes per byte
        out.push_back({w, "I8", {rows, cols / 2}, f, s, ""});
        out.push_back({s, "F8_E8M0", {rows, cols / kBlock}, V41Format::Scale, "", w});
        break;
      default:
        throw std::logic_error("quantized() with a plain format");
    }
  }
  void fp8(const std::string& owner, int64_t out_features, int64_t in_features) {
    quantized(owner, V41Format::Fp8Tiles, out_features, in_features);
  }
  void norm(const std::string& owner, int64_t d) { plain(owner + ".weight", V41Format::Bf16, {d}); }
  void bf16_linear(const std::string& owner, int64_t out_features, int64_t in_features) {
    plain(owner + ".weight", V41Format::Bf16, {out_features, in_features});
  }
};

// What the schema models; the refusal names the config (docs/v41.md §11.1).
void require_release_format(const V41Config& c) {
  auto refuse = [&](const std::string& why) { throw InputError(fmt::format("v41 checkpoint: {}: {}", c.name, why)); };
  if (c.dtype != "fp8" || c.expert_dtype != std::optional<std::string>("fp4"))
    refuse(fmt::format("dtype {} with expert_dtype {}: only the release's layout (fp8 with fp4 experts) is modelled",
                       c.dtype, c.expert_dtype.value_or("null")));
  if (c.vision_n_layers > 0) refuse("vision_n_layers > 0: the vision tensors (vision.*, aligner.*) are not modelled");
}

// One block: a backbone layer (lp its plan) or a DSpark stage (lp null: SWA-only, no compressor,
// indexer or Engram, no VL routing bias). L: "layers.3." or "mtp.0.".
void block(SchemaBuilder& b, const V41Config& c, const std::string& L, const LayerPlan* lp, int64_t experts) {
  const int64_t D = c.dim, hc = c.hc_mult, mix = (2 + hc) * hc;
  // Block: the two norms and the hyper-connection mixes (fp32).
  b.norm(L + "attn_norm", D);
  b.norm(L + "ffn_norm", D);
  for (const char* sub : {"attn", "ffn"}) {
    b.plain(fmt::format("{}hc_{}_fn", L, sub), V41Format::F32, {mix, hc * D});
    b.plain(fmt::format("{}hc_{}_base", L, sub), V41Format::F32, {mix});
    b.plain(fmt::format("{}hc_{}_scale", L, sub), V41Format::F32, {3});
  }
  // Attention: low-rank q, one shared KV head, the grouped output (wo_a is fp8 in the file and
  // dequantized to bf16 at load).
  const std::string A = L + "attn.";
  b.plain(A + "attn_sink", V41Format::F32, {c.n_heads});
  b.fp8(A + "wq_a", c.q_lora_rank, D);
  b.norm(A + "q_norm", c.q_lora_rank);
  b.fp8(A + "wq_b", c.n_heads * c.head_dim, c.q_lora_rank);
  b.fp8(A + "wkv", c.head_dim, D);
  b.norm(A + "kv_norm", c.head_dim);
  b.fp8(A + "wo_a", c.o_groups * c.o_lora_rank, c.n_heads * c.head_dim / c.o_groups);
  b.fp8(A + "wo_b", D, c.o_groups * c.o_lora_rank);
  if (lp && lp->owns_compressor) {
    b.bf16_linear(A + "compressor.wkv", c.head_dim, D);  // promoted to fp32 at load when ratio > 1
    if (lp->owns_wgate) b.bf16_linear(A + "compressor.wgate", c.head_dim, D);
    b.norm(A + "compressor.norm", c.head_dim);
  }
  if (lp && lp->owns_indexer) {
    b.fp8(A + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    b.bf16_linear(A + "indexer.weights_proj", c.index_n_heads, D);
  }
  if (lp && lp->owns_index_k) {
    b.bf16_linear(A + "indexer.wk", c.index_head_dim, c.head_dim);
    b.norm(A + "indexer.k_norm", c.index_head_dim);
  }
  // MoE: the gate (its VL routing bias on every layer, as the release ships it), routed experts
  // in fp4, the shared expert in fp8.
  const std::string F = L + "ffn.";
  b.bf16_linear(F + "gate", experts, D);
  b.plain(F + "gate.bias", V41Format::F32, {experts});
  if (lp) b.plain(F + "gate.bias_vl", V41Format::F32, {experts});
  for (int64_t e = 0; e < experts; ++e) {
    const std::string E = fmt::format("{}experts.{}.", F, e);
    b.quantized(E + "w1", V41Format::Fp4K32, c.moe_inter_dim, D);
    b.quantized(E + "w2", V41Format::Fp4K32, D, c.moe_inter_dim);
    b.quantized(E + "w3", V41Format::Fp4K32, c.moe_inter_dim, D);
  }
  b.fp8(F + "shared_experts.w1", c.moe_inter_dim, D);
  b.fp8(F + "shared_experts.w2", D, c.moe_inter_dim);
  b.fp8(F + "shared_experts.w3", c.moe_inter_dim, D);
  // Engram: the hash table (fp8 rows), the key/value projection, the per-copy gate weights.
  if (lp && lp->engram) {
    const auto it = std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), lp->layer);
    const int64_t rows = c.engram_num_embeddings[size_t(it - c.engram_layer_ids.begin())];
    const int64_t cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
    b.quantized(L + "engram.embed", V41Format::Fp8Rows, rows, c.engram_head_dim);
    b.fp8(L + "engram.wkv", D * (hc + 1), cols * c.engram_head_dim);
    b.plain(L + "engram.q_weight", V41Format::Bf16, {hc, D});
    b.plain(L + "engram.k_weight", V41Format::Bf16, {hc, D});
  }
}

}  // namespace

const char* v41_format_name(V41Format f) {
  switch (f) {
    case V41Format::Fp8Tiles: return "fp8 (32x32 tiles)";
    case V41Format::Fp8Rows: return "fp8 (per 32 of a row)";
    case V41Format::Fp4K32: return "fp4 (per 32 along K)";
    case V41Format::Bf16: return "bf16";
    case V41Format::F32: return "f32";
    case V41Format::Scale: return "e8m0 scale";
  }
  return "?";
}

std::vector<V41TensorSpec> v41_schema(const V41Config& c, const V41Plan& p) {
  require_release_format(c);
  SchemaBuilder b;
  const int64_t D = c.dim;
  b.plain("embed.weight", V41Format::Bf16, {c.vocab_size, D});
  b.norm("norm", D);
  b.plain("head.weight", V41Format::Bf16, {c.vocab_size, D});  // fp32 in model.py, bf16 in the file
  for (const LayerPlan& lp : p.layers) block(b, c, fmt::format("layers.{}.", lp.layer), &lp, c.n_routed_experts);
  // DSpark stages (model.py's DSparkBlock under mtp.*): a block with a window-only attention and its
  // own expert count; stage 0 adds main_proj / main_norm, the last stage the norm and the Markov and
  // confidence heads (fp32 or bf16 in model.py, BF16 in the file). Their embed and head are the
  // backbone's, stored once.
  if (c.dspark_block_size > 0)
    for (int64_t k = 0; k < c.n_mtp_layers; ++k) {
      const std::string M = fmt::format("mtp.{}.", k);
      block(b, c, M, nullptr, c.dspark_n_routed_experts > 0 ? c.dspark_n_routed_experts : c.n_routed_experts);
      if (k == 0) {
        b.fp8(M + "main_proj", D, D * int64_t(c.dspark_target_layer_ids.size()));
        b.norm(M + "main_norm", D);
      }
      if (k == c.n_mtp_layers - 1) {
        b.norm(M + "norm", D);
        b.bf16_linear(M + "markov_head.embed", c.vocab_size, c.dspark_markov_rank);
        b.bf16_linear(M + "markov_head.head", c.vocab_size, c.dspark_markov_rank);
        b.bf16_linear(M + "confidence_head.proj", 1, D + c.dspark_markov_rank);
      }
    }
  std::sort(b.out.begin(), b.out.end(), [](const auto& x, const auto& y) { return x.name < y.name; });
  return b.out;
}

std::string v41_tensor_mismatch(const std::vector<V41TensorSpec>& schema, const V41TensorSpec& spec,
                                const SafetensorsTensor& t) {
  if (t.dtype != spec.dtype) return fmt::format("dtype {}, the layout has {}", t.dtype, spec.dtype);
  if (t.shape == spec.shape) return "";
  if (spec.format == V41Format::Scale) {
    const auto w = std::lower_bound(schema.begin(), schema.end(), spec.scale_of,
                                    [](const V41TensorSpec& s, const std::string& n) { return s.name < n; });
    const char* blocks = w->format == V41Format::Fp8Tiles ? "one scale per 32x32 tile"
                         : w->format == V41Format::Fp8Rows ? "one scale per 32 of a row"
                                                           : "one scale per 32 along K";
    return fmt::format("shape [{}] is not {} of {} [{}] (that is [{}])", fmt::join(t.shape, ", "), blocks, w->name,
                       fmt::join(w->shape, ", "), fmt::join(spec.shape, ", "));
  }
  return fmt::format("shape [{}], the layout has [{}]", fmt::join(t.shape, ", "), fmt::join(spec.shape, ", "));
}

void check_v41_weights(const V41Checkpoint& ckpt, const std::string& origin) {
  const auto schema = v41_schema(ckpt.config);
  auto fail = [&](const std::string& tensor, const std::string& why) {
    throw InputError(fmt::format("v41 checkpoint: {}: {}: {}", origin, tensor, why));
  };
  std::vector<const SafetensorsTensor*> have;
  for (const auto& t : ckpt.weights.tensors) have.push_back(&t);
  std::sort(have.begin(), have.end(), [](auto* x, auto* y) { return x->name < y->name; });
  // A merge of two sorted lists: the first name present on one side only is the refusal.
  size_t i = 0, j = 0;
  while (i < schema.size() || j < have.size()) {
    if (j == have.size() || (i < schema.size() && schema[i].name < have[j]->name))
      fail(schema[i].name, "missing (the config's layout has it)");
    if (i == schema.size() || have[j]->name < schema[i].name)
      fail(have[j]->name, "not a tensor of the config's layout");
    if (j + 1 < have.size() && have[j + 1]->name == have[j]->name) fail(have[j]->name, "appears twice");
    const std::string why = v41_tensor_mismatch(schema, schema[i], *have[j]);
    if (!why.empty()) fail(schema[i].name, why);
    if (int64_t(have[j]->bytes.size()) != have[j]->numel() * safetensors_dtype_size(have[j]->dtype))
      fail(schema[i].name, fmt::format("holds {} bytes, its dtype and shape need {}", have[j]->bytes.size(),
                                       have[j]->numel() * safetensors_dtype_size(have[j]->dtype)));
    ++i, ++j;
  }
}

}  // namespace ced::v41
