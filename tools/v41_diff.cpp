// `ced diff A.h5 B.h5` on two v41 run files (docs/v41.md §12.7): A (under test) against B (the reference),
// every op judged by the sound gate's bounds (docs/sound-bounds.md) where A's inputs to it are B's bit for bit,
// so each verdict holds for every correct implementation whatever happened upstream: where the inputs differ,
// a difference of the output says nothing about the op, and the op is listed as not judged. The block's mixes
// and streams are judged against each side's own captures, so they are judged at every layer.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdio>

#include "model/error.hpp"
#include "checks/v41/agreement.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/numerics.hpp"
#include "models/v41/run_file.hpp"
#include "tools/v41_commands.hpp"

namespace ced::tools {

using v41::same_bits;

bool is_v41_run_file(const std::string& path) { return v41::is_untrusted_v41_run_file(path); }

int diff_v41(const V41DiffOptions& o) {
  const v41::V41RunFile a = v41::read_untrusted_v41_run_file(o.a), b = v41::read_untrusted_v41_run_file(o.b);
  if (a.config.name != b.config.name || a.weights_digest != b.weights_digest)
    throw InputError(fmt::format("ced diff: {} ran {} (weights {}), {} ran {} (weights {}): not the same model", o.a,
                                 a.config.name, a.weights_digest, o.b, b.config.name, b.weights_digest));
  if (a.regime != b.regime)
    throw InputError(fmt::format("ced diff: {} is of the {} regime, {} of the {} regime", o.a, v41::v41_regime_name(a.regime),
                                 o.b, v41::v41_regime_name(b.regime)));
  if (a.tokens != b.tokens) throw InputError(fmt::format("ced diff: {} and {} ran other prompts", o.a, o.b));
  if (a.result.layers.size() != b.result.layers.size())
    throw InputError(fmt::format("ced diff: {} and {} hold other layers", o.a, o.b));
  const v41::V41Checkpoint ck = o.checkpoint.empty() ? v41::v41_golden_checkpoint(b) : v41::read_v41_checkpoint(o.checkpoint);
  if (v41::v41_weights_digest(ck.weights) != b.weights_digest)
    throw InputError(fmt::format("ced diff: the checkpoint's weights are not the ones {} ran", o.b));
  const v41::V41Model m(ck.config, ck.weights, b.regime);
  const v41::V41Plan& plan = m.plan();
  int64_t held_back = 0;  // ops whose inputs differ: not judged
  std::vector<std::string> not_judged;
  auto keep = [&](bool inputs_equal, const std::string& what, int64_t l) {
    if (!inputs_equal && not_judged.size() < 200) not_judged.push_back(fmt::format("layer {} {}", l, what));
    held_back += !inputs_equal;
    return inputs_equal;
  };
  bool publications_equal = true;  // every layer below published the same compressed KV, keys, selection, pool
  const v41::V41Agreement agreement = v41::v41_agreement_forced(
      m, b,
      [&](int64_t l, const v41::V41SharedAttention&) {
        const v41::V41LayerCapture& x = a.result.layers[static_cast<size_t>(l)];
        const v41::V41LayerCapture& y = b.result.layers[static_cast<size_t>(l)];
        v41::V41ForcedLayer f;
        f.hash_ids.assign(x.hash_ids.begin(), x.hash_ids.end());
        f.block = x;
        // Engram's inputs differing, the judge leaves it (its block stays judged on A's own captures).
        keep(same_bits(x.engram_in, y.engram_in), "Engram (its input streams differ)", l);
        if (!keep(same_bits(x.in, y.in) && same_bits(x.pre_mix, y.pre_mix), "attn_x (its streams or pre_mix differ)", l))
          f.block.attn_x.clear();
        const bool x_equal = same_bits(x.attn_x, y.attn_x);
        if (keep(x_equal, "the attention's query, window KV and compressor (attn_x differs)", l)) {
          f.attention.attn_q = x.attn_q;
          f.attention.attn_kv = x.attn_kv;
          f.attention.latent = x.latent;
          f.attention.compress_kv = x.compress_kv;
          f.attention.index_k = x.index_k;
        }
        if (keep(x_equal && publications_equal, "the selection (attn_x or a publication below differs)", l)) {
          f.attention.topk_idxs = x.topk_idxs;
          f.attention.candidates = x.candidates;
          f.attention.attn_idx = x.attn_idx;
        }
        if (keep(same_bits(x.attn_q, y.attn_q) && same_bits(x.attn_kv, y.attn_kv) && x.attn_idx == y.attn_idx,
                 "sparse_attn (its query, rows or index lists differ)", l))
          f.attn_o = x.attn_o;
        if (keep(same_bits(x.attn_o, y.attn_o), "the output projection (attn_o differs)", l)) f.attn_out_of_o = x.attn_out;
        if (keep(same_bits(x.ffn_x, y.ffn_x), "the router and the MoE (ffn_x differs)", l)) {
          f.moe.experts = x.experts;
          f.moe.expert_weights = x.expert_weights;
          f.ffn_out = x.ffn_out;
        }
        const v41::LayerPlan& lp = plan[l];
        publications_equal = publications_equal && (!lp.owns_compressor || same_bits(x.compress_kv, y.compress_kv)) &&
                             (!lp.owns_index_k || same_bits(x.index_k, y.index_k)) &&
                             (!lp.owns_indexer || x.topk_idxs == y.topk_idxs) &&
                             (!lp.candidate_source || x.candidates == y.candidates);
        return f;
      },
      {}, false);
  std::vector<v41::V41TensorAgreement> rows = agreement.rows;
  // The head on B's final collapse, where A's is the same.
  const int64_t N = b.result.N;
  if (!a.result.logits.empty() && !b.result.logits.empty() && b.regime != v41::V41Regime::f64 &&
      keep(same_bits(a.result.final_collapsed, b.result.final_collapsed), "the head (final_collapsed differs)", -1)) {
    v41::V41TensorAgreement& r = rows.emplace_back();
    r.pass = "teacher forced";
    r.kind = "logits (forced collapsed)";
    v41::v41_judge_head_collapsed(m, b.result.final_collapsed, N, a.result.logits, b.result.logits, {}, "", r);
  }
  v41::V41Agreement shown;
  shown.rows = rows;
  const v41::V41TensorAgreement* bad = shown.first_failure();
  std::printf("ced diff %s (under test) vs %s (reference): v41 %s, %s regime, N = %lld; each op judged by derived "
              "bounds where its inputs are the reference's bit for bit (docs/sound-bounds.md)\n",
              o.a.c_str(), o.b.c_str(), b.config.name.c_str(), v41::v41_regime_name(b.regime), (long long)N);
  int64_t bitwise = 0;
  for (const auto& r : rows) bitwise += r.n > 0 && r.equal == r.n;
  std::printf("%zu tensors judged, %lld bitwise; %lld ops not judged (their inputs differ)\n", rows.size(),
              (long long)bitwise, (long long)held_back);
  if (o.verbose) {
    std::fputs(v41::v41_agreement_table(shown).c_str(), stdout);
    for (const std::string& s : not_judged) std::printf("not judged: %s\n", s.c_str());
  }
  if (bad)
    std::printf("first failure: layer %lld %s: %s\n", (long long)bad->layer, bad->kind.c_str(), bad->failure.c_str());
  else if (!not_judged.empty())
    std::printf("first op not judged: %s\n", not_judged.front().c_str());
  if (bad || not_judged.empty()) std::printf("%s\n", bad ? "FAIL" : "PASS");
  else std::printf("PASS (%lld ops not judged: their inputs differ; -v lists them)\n", (long long)held_back);
  return bad ? 1 : 0;
}

}  // namespace ced::tools
