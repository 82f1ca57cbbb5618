#pragma once
// The v41 gate (docs/v41.md §12.4): our reference against a run file of the official code, layer by
// layer with teacher forcing (each layer fed the official's input streams, pre_mix and published
// caches, each sublayer also fed the official's sublayer input, so one flip stays in its layer) and end
// to end; every tensor kind judged against a budget whose reason is one of the measured causes of
// §9.4. A planted bug (V41Fault) fails at its layer.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "compare/op_bounds.hpp"
#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward.hpp"
#include "models/v41/run_file.hpp"

namespace ced::v41 {

// How far one tensor of ours is from the official's: in value, in bf16 and fp32 spacings of the
// official value (ulps), bitwise (as fp32), and for index lists in rows.
struct V41TensorAgreement {
  std::string pass;      // "teacher forced" | "end to end"
  int64_t layer = -1;    // -1: not a layer's (rotary tables, hash ids, the head)
  std::string kind;      // the budget's name: "attn_out (forced x)", "topk_idxs (forced x)", ...
  int64_t n = 0, equal = 0;
  double max_abs = 0, max_ref = 0, max_ulp16 = 0, max_ulp32 = 0;
  bool row_scaled = false;     // max_ulp16 in spacings of max(|element|, its row's RMS)
  std::string where;     // the element of the largest difference
  bool rows_compared = false;  // an index list: n and equal count rows
  // Elements whose difference is not a number: a NaN on either side, or an infinity the other side
  // lacks. Never excused by a budget (a finite bound admits no NaN); `nonfinite_at` is the first.
  int64_t nonfinite = 0;
  std::string nonfinite_at;
  // A kind judged by bounds derived from the computation (docs/sound-bounds.md) rather than a budget:
  // the bound model's name, and how both sides' values sit in the admissible intervals computed from the
  // official's own input to the op. Any value outside fails; `max_bound_use` is the largest fraction of
  // an interval's half-width a value uses (and where), `straddled` the elements at which more than one
  // value of the output format is admissible (a rounding boundary inside the interval).
  std::string bound_model;
  int64_t outside = 0;
  std::string outside_at;
  double max_bound_use = 0;
  std::string bound_use_at;
  int64_t straddled = 0;
  std::vector<std::string> notes;  // rows that differ, shape mismatches
  std::string failure;   // "" within its budget, else why not (the budget and its reason)

  double bitwise() const { return n ? static_cast<double>(equal) / static_cast<double>(n) : 1.0; }
};

struct V41Agreement {
  std::vector<V41TensorAgreement> rows;  // in the order compared: layer by layer, then the head
  // The first row that broke its budget, nullptr when none did.
  const V41TensorAgreement* first_failure() const;
};

// Compares the model (its config and weights must be the run file's: the caller checks the digest)
// with the official run file, both passes. The model's regime is the file's. The head (final_normed and
// the logits, forced) and the router are judged by bounds under `bounds` in the bf16 and release regimes;
// use_bounds false judges every kind by its measured budget (the gate before the bounds, for comparison).
// The bounds of the attention's ops and the MoE are computed only at the rows where the two sides differ as
// bits (where they agree, ours is the official's result: admissible by definition); every_row computes them
// at every row, so the official's values are judged everywhere (what a soundness sweep measures).
V41Agreement v41_agreement(const V41Model& model, const V41RunFile& official, const bounds::BoundModel& bounds = {},
                           bool use_bounds = true, bool every_row = false);

// One layer of the side under test, teacher forced (docs/v41.md §12.4): what our reference computes in
// v41_agreement, or what a port's engine returned (python/ced/v41/gate.py). An empty tensor is one the side
// did not show: v41_agreement_forced does not judge it.
struct V41ForcedLayer {
  std::vector<int64_t> hash_ids;   // its Engram's hash ids from the prompt (Engram layers)
  V41LayerCapture block;           // the block on the official's input streams and pre_mix: in, attn_x, the hc
                                   // mixes, ffn_x, out, ffn_pre (and the hash ids it read)
  V41LayerCapture attention;       // the attention alone on the official's attn_x, after the official's layers
                                   // below: attn_q, attn_kv, attn_idx, attn_o, latent, compress_kv, index_k,
                                   // topk_idxs, candidates
  std::vector<double> attn_out;    // its output [N, dim]
  std::vector<double> attn_o;      // sparse_attn alone on the official's attn_q, attn_kv, attn_idx [N, H, head_dim]
  std::vector<double> attn_out_of_o;  // the output projection alone on the official's attn_o [N, dim]
  V41LayerCapture moe;             // the MoE alone on the official's ffn_x: experts, expert_weights
  std::vector<double> ffn_out;     // its output [N, dim]
};

// The teacher-forced pass of v41_agreement with another side under test: `layer(l, before)` returns its layer
// l fed the official's inputs, `before` the official's publications of the layers below (what model.py's
// shared state holds there). Every kind judged as v41_agreement judges it, by the same bounds, with our
// reference `model` computing them (and the final collapse of the side's last block); a tensor the side
// did not show is not judged. Rows of the "teacher forced" pass only.
V41Agreement v41_agreement_forced(const V41Model& model, const V41RunFile& official,
                                  const std::function<V41ForcedLayer(int64_t, const V41SharedAttention&)>& layer,
                                  const bounds::BoundModel& bounds = {}, bool every_row = false);

// One judgement of our side by derived bounds, as the gate made it: what a driver that plants perturbations
// on our side and judges them again reads (v41_bounds_power, docs/sound-bounds.md §10).
struct V41BoundsRecord {
  int64_t layer = -1;
  std::string kind;
  int64_t row_len = 0;                           // as compared: dim, head_dim, ... (0: the row is the tensor's)
  std::vector<double> ours;                      // a value kind: what our side reported
  std::vector<bounds::BoundedValue> admissible;  // and the intervals it was judged against
  // A selection kind (topk_idxs, candidates, experts): our rows [rows, k] (entries offset by `offset`, -1
  // none), each row's score intervals [rows, n], and the gate's verdict on one row of a selection.
  int64_t rows = 0, k = 0, offset = 0;
  std::vector<int64_t> chosen;
  std::vector<bounds::Interval> scores;
  std::function<bounds::TopkJudgement(std::span<const int64_t> selection, int64_t row)> judge_row;
  bool selection() const { return static_cast<bool>(judge_row); }
};

// The gate's teacher-forced pass alone (under `bounds`, in the bf16 and release regimes), every judgement
// by derived bounds recorded in `trace` in the gate's order: each value kind with our values and their
// intervals, each selection with our rows and the judge of one row.
V41Agreement v41_teacher_forced_traced(const V41Model& model, const V41RunFile& official, const bounds::BoundModel& bounds,
                                       std::vector<V41BoundsRecord>& trace);

// Fills a row's bound fields: each of `ours` and `official` against its admissible interval (the
// official's judged first; `at` places the element).
void v41_compare_bounds(V41TensorAgreement& row, std::span<const double> ours, std::span<const double> official,
                        std::span<const bounds::BoundedValue> admissible, const std::string& bound_model,
                        const std::string& at);
// The same where each side's intervals are its own (route weights under each side's own selection).
void v41_compare_bounds(V41TensorAgreement& row, std::span<const double> ours, std::span<const double> official,
                        std::span<const bounds::BoundedValue> admissible_ours,
                        std::span<const bounds::BoundedValue> admissible_official, const std::string& bound_model,
                        const std::string& at);

// The checkpoint a golden file ran, made again: the built-in its config names, `ced export`'s random
// weights of its weight seed, and the boosts its provenance records ("TENSOR=K,..."); InputError when
// the file has no weight seed or the weights digest is not the file's (another generator, another
// checkpoint).
V41Checkpoint v41_golden_checkpoint(const V41RunFile& f);

// The router of one layer judged by derived bounds on the official's MoE input ffn_x [N, dim]
// (docs/sound-bounds.md §9): each side's selection [N, K] (ascending ids) admissible under the score
// intervals, each side's weights (when `weights` is given) inside their intervals under its own selection.
// Adds to the rows (a decode pass gathers its steps in one row) and judges them; false, with nothing
// added, for a router the derivation does not cover (the caller judges by budgets then).
bool v41_judge_router(const V41Model& model, int64_t layer, std::span<const double> ffn_x, int64_t N,
                      std::span<const int64_t> ours_experts, std::span<const double> ours_weights,
                      std::span<const int64_t> official_experts, std::span<const double> official_weights,
                      const bounds::BoundModel& bounds, const std::string& at, V41TensorAgreement& experts,
                      V41TensorAgreement* weights);
// The head on a final collapse [N, dim] (an engine that shows only the head's logits): the final norm's
// admissible bf16 values chained into the projection's (§5, §6), both sides' logits [N, vocab] judged.
void v41_judge_head_collapsed(const V41Model& model, std::span<const double> collapsed, int64_t N,
                              std::span<const double> ours_logits, std::span<const double> official_logits,
                              const bounds::BoundModel& bounds, const std::string& at, V41TensorAgreement& row);

// Judges a compared row against its kind's budget (the pass and kind name it): sets `failure`, "" within it.
// The budgets and their reasons are the gate's; a port's gate (python/ced/v41) judges with the same ones.
void v41_judge(V41TensorAgreement& row);
// Why a kind may differ by what its budget allows ("reported, not judged" for a kind without a budget).
std::string v41_budget_reason(const std::string& kind);
// Every kind that has a budget, in the gate's order.
std::vector<std::string> v41_budget_kinds();

// The table a person reads: one line per row (pass, layer, kind, values, bitwise, max |d|, ulps,
// budget verdict), then the notes.
std::string v41_agreement_table(const V41Agreement& a);

// The comparison of one tensor, for other drivers (the compare script's v41_official_compare).
// row_len > 0: bf16 ulps in spacings of max(|official element|, the RMS of its row of row_len values).
void v41_compare_values(V41TensorAgreement& row, std::span<const double> ours, std::span<const double> official,
                        const std::string& at, int64_t row_len = 0);
// One index list per row ([N, k] both): rows equal as sets and in order; each differing row noted with
// the positions only one side has and our score of each (scores [N, T], may be empty; offset: what the
// indices carry above the score's column, N for the published selections).
void v41_compare_rows(V41TensorAgreement& row, std::span<const int64_t> ours, std::span<const int64_t> official,
                      int64_t N, std::span<const double> scores, int64_t offset);

}  // namespace ced::v41
