// The judge of two v41 run files (docs/v41.md §12.7, §12.8; `ced diff A.h5 B.h5`, ced.compare): A (under test)
// against B (the reference), every op judged by the sound gate's bounds (docs/sound-bounds.md) where A's inputs
// to it are B's bit for bit, so each verdict holds for every correct implementation whatever happened upstream:
// where the inputs differ, a difference of the output says nothing about the op, and the op is listed as not
// judged. The block's mixes and streams are judged against each side's own captures, so at every layer.
#include "checks/v41/diff.hpp"

#include <fmt/format.h>
#include <fmt/printf.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>

#include "model/error.hpp"
#include "checks/v41/agreement.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/numerics.hpp"
#include "models/v41/run_file.hpp"

namespace ced::v41 {

namespace {

// One tensor compared at the positions both files hold.
struct RowDiff {
  std::string where;  // "layer 3 attn_x", "logits"
  int64_t compared = 0, differing = 0, first_position = -1;
  double max_abs = 0;
};

// a and b hold rows from positions fa and fb of N; the rows from max(fa, fb) compared, values per row from the size.
RowDiff compare_rows(const std::string& where, const std::vector<double>& a, int64_t fa, const std::vector<double>& b,
                     int64_t fb, int64_t N) {
  RowDiff d{where};
  const int64_t ra = N - fa, rb = N - fb;
  if (ra <= 0 || rb <= 0 || a.size() % static_cast<size_t>(ra) || b.size() % static_cast<size_t>(rb) ||
      a.size() / static_cast<size_t>(ra) != b.size() / static_cast<size_t>(rb)) {
    d.differing = d.compared = 1;  // other widths: a difference of shape
    d.first_position = std::max(fa, fb);
    return d;
  }
  const size_t width = a.size() / static_cast<size_t>(ra);
  for (int64_t p = std::max(fa, fb); p < N; ++p)
    for (size_t j = 0; j < width; ++j) {
      const double x = a[static_cast<size_t>(p - fa) * width + j], y = b[static_cast<size_t>(p - fb) * width + j];
      ++d.compared;
      if (std::bit_cast<uint64_t>(x) == std::bit_cast<uint64_t>(y)) continue;
      if (d.differing++ == 0) d.first_position = p;
      d.max_abs = std::max(d.max_abs, std::isnan(x - y) ? std::numeric_limits<double>::infinity() : std::abs(x - y));
    }
  return d;
}

// `ced diff` where a file is a CED or resumed prefill: each tensor at the positions both files hold, bit for bit.
// The op-by-op judge needs every row of every layer (its windows, compressors and selections span the prompt), so
// these files are compared as the family claims them: an exact replay holds the full prefill's last position and
// decode steps, a resume that rebuilds every row holds every row, a bounded replay differs where its cone was cut.
V41DiffReport diff_rows(const V41DiffOptions& o, const v41::V41RunFile& a, const v41::V41RunFile& b) {
  std::string out;
  const int64_t N = b.result.N;
  out += fmt::sprintf("ced diff %s (%s) vs %s (%s): v41 %s, %s regime, N = %lld; a CED or resumed run file is compared bit for "
              "bit at the positions both hold (the op-by-op judge of docs/sound-bounds.md needs full-mode files)\n",
              o.a.c_str(), v41::v41_request_summary(a.request).c_str(), o.b.c_str(),
              v41::v41_request_summary(b.request).c_str(), b.config.name.c_str(), v41::v41_regime_name(b.regime),
              (long long)N);
  std::vector<RowDiff> diffs;
  int64_t skipped = 0;
  for (size_t l = 0; l < a.result.layers.size(); ++l) {
    const v41::V41LayerCapture &x = a.result.layers[l], &y = b.result.layers[l];
    const std::vector<v41::V41CaptureTensor> tx = v41::v41_capture_tensors(x), ty = v41::v41_capture_tensors(y);
    for (const v41::V41CaptureTensor& t : tx) {
      const auto u = std::find_if(ty.begin(), ty.end(), [&](const v41::V41CaptureTensor& v) { return v.name == t.name; });
      if (u == ty.end()) continue;
      const std::string where = fmt::format("layer {} {}", l, t.name);
      if (t.per_row && (!t.row_numbers || x.first_row == y.first_row)) {
        diffs.push_back(compare_rows(where, t.values, x.first_row, u->values, y.first_row, N));
      } else if (x.first_row == y.first_row && t.values.size() == u->values.size()) {
        diffs.push_back(compare_rows(where, t.values, N - 1, u->values, N - 1, N));  // one block, whole
      } else {
        ++skipped;  // compressed groups or row numbers of other row ranges: not comparable position by position
      }
    }
  }
  diffs.push_back(compare_rows("final collapsed", a.result.final_collapsed, a.result.first_row, b.result.final_collapsed,
                               b.result.first_row, N));
  diffs.push_back(compare_rows("logits", a.result.logits, a.result.first_row, b.result.logits, b.result.first_row, N));
  int64_t bitwise = 0;
  const RowDiff* first = nullptr;
  for (const RowDiff& d : diffs) {
    bitwise += d.differing == 0;
    if (d.differing > 0 && !first) first = &d;
    if (o.verbose)
      out += fmt::sprintf("%-28s %10lld compared %10lld differ%s\n", d.where.c_str(), (long long)d.compared,
                  (long long)d.differing,
                  d.differing ? fmt::format(" (first at position {}, max |a - b| {:.3g})", d.first_position, d.max_abs).c_str()
                              : "");
  }
  out += fmt::sprintf("%zu tensors compared, %lld bitwise; %lld not comparable by position (compressed groups or selections "
              "of other row ranges)\n",
              diffs.size(), (long long)bitwise, (long long)skipped);
  const size_t V = static_cast<size_t>(b.config.vocab_size);
  const RowDiff last = compare_rows("last logits", std::vector<double>(a.result.logits.end() - static_cast<std::ptrdiff_t>(V), a.result.logits.end()),
                                    N - 1, std::vector<double>(b.result.logits.end() - static_cast<std::ptrdiff_t>(V), b.result.logits.end()), N - 1, N);
  out += fmt::sprintf("last position's logits: %s\n", last.differing == 0 ? "bitwise"
                                              : fmt::format("{} of {} values differ (max |a - b| {:.3g})", last.differing,
                                                            last.compared, last.max_abs).c_str());
  // The decode steps after both prefills, where both files hold the same steps.
  bool decode_equal = true;
  if (a.decode && b.decode && a.decode->tokens == b.decode->tokens) {
    int64_t differing = 0;
    for (size_t k = 0; k < a.decode->steps.size(); ++k)
      differing += !v41::same_bits(a.decode->steps[k].logits, b.decode->steps[k].logits);
    decode_equal = differing == 0;
    out += fmt::sprintf("decode steps' logits: %s\n", differing ? fmt::format("{} of {} steps differ", differing,
                                                                       a.decode->steps.size()).c_str()
                                                          : "bitwise");
  }
  if (first)
    out += fmt::sprintf("first difference: %s at position %lld (%lld of %lld values, max |a - b| %.3g)\n", first->where.c_str(),
                (long long)first->first_position, (long long)first->differing, (long long)first->compared,
                first->max_abs);
  // The family claims the last position (and the decode after it) of an exact replay, not the tail's earlier
  // rows, whose cones reach before the tail (docs/v41.md §13.3).
  const bool claim = last.differing == 0 && decode_equal;
  if (!first) out += fmt::sprintf("BITWISE\n");
  else if (claim) out += fmt::sprintf("PASS (the last position is the full prefill's, bit for bit; earlier rows differ where their cones were cut)\n");
  else out += fmt::sprintf("DIFFERS at the last position%s\n", decode_equal ? "" : " or in a decode step");
  return {claim, out};
}

}  // namespace

V41DiffReport v41_diff(const V41DiffOptions& o) {
  std::string out;
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
  if (a.request.mode != "full" || b.request.mode != "full") return diff_rows(o, a, b);
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
  out += fmt::sprintf("ced diff %s (under test) vs %s (reference): v41 %s, %s regime, N = %lld; each op judged by derived "
              "bounds where its inputs are the reference's bit for bit (docs/sound-bounds.md)\n",
              o.a.c_str(), o.b.c_str(), b.config.name.c_str(), v41::v41_regime_name(b.regime), (long long)N);
  int64_t bitwise = 0;
  for (const auto& r : rows) bitwise += r.n > 0 && r.equal == r.n;
  out += fmt::sprintf("%zu tensors judged, %lld bitwise; %lld ops not judged (their inputs differ)\n", rows.size(),
              (long long)bitwise, (long long)held_back);
  if (o.verbose) {
    out += v41::v41_agreement_table(shown);
    for (const std::string& s : not_judged) out += fmt::sprintf("not judged: %s\n", s.c_str());
  }
  if (bad)
    out += fmt::sprintf("first failure: layer %lld %s: %s\n", (long long)bad->layer, bad->kind.c_str(), bad->failure.c_str());
  else if (!not_judged.empty())
    out += fmt::sprintf("first op not judged: %s\n", not_judged.front().c_str());
  if (bad || not_judged.empty()) out += fmt::sprintf("%s\n", bad ? "FAIL" : "PASS");
  else out += fmt::sprintf("PASS (%lld ops not judged: their inputs differ; -v lists them)\n", (long long)held_back);
  return {bad == nullptr, out};
}

}  // namespace ced::v41
