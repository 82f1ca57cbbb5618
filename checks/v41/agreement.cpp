// docs/v41.md §12.3: the v41 gate; see agreement.hpp.
#include "checks/v41/agreement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <tuple>
#include <sstream>

#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward_ops.hpp"
#include "models/v41/numerics.hpp"
#include "models/v41/router_bounds.hpp"
#include "checks/v41/sublayer_bounds.hpp"

namespace ced::v41 {
namespace {

// What a tensor kind may differ by, and why (the causes of docs/v41.md §9.4: 1, torch's blocked fp32
// GEMMs; 2, torch's vectorised fp32 sums; a quantizer turning a one-ulp flip into one step of its
// format). max_ulp16 bounds a bf16 tensor in bf16 spacings of the official value, max_ulp32 an fp32
// tensor in fp32 spacings; min_bitwise the fraction of elements (rows, for index lists) equal as fp32.
// max_ulp16 is in spacings of the larger of the element and its row's RMS (the caller says the row
// length: dim, head_dim): an activation element is a sum (a projection's output, post·y + Σ comb·R),
// and a one-ulp difference of a term survives a cancellation to a small result as thousands of its ulps.
// max_abs bounds an fp32 tensor of values in [0, 2] (the mixes) where max_ulp32 does not apply.
constexpr double kAny = std::numeric_limits<double>::infinity();

struct Budget {
  const char* kind;
  double max_ulp16, max_ulp32, min_bitwise;
  const char* reason;
  double max_abs = kAny;
};
const Budget kBudgets[] = {
    {"rope", 0, 0, 1, "precompute_freqs_cis is elementwise fp32: no sum to reorder"},
    {"hash_ids", 0, 0, 1, "integer arithmetic"},
    {"in", 1, kAny, 0.95, "the Engram's gate is a sum over dim in torch's vectorised order (cause 2)"},
    {"attn_x", 1, kAny, 0.95, "RMSNorm's mean(x²) is torch's vectorised sum (cause 2)"},
    {"attn_q (forced x)", 1, kAny, 0.95, "q_norm's vectorised sum (cause 2) before wq_b and RoPE"},
    {"attn_o (forced x)", 16, kAny, 0.5,
     "a window-KV element one e4m3 step off (attn_kv's reason) moves each output attending it by up to its weight "
     "times 1/16 of that value (16 bf16 ulps; 9 measured on wide bf16 N = 33), else sparse_attn's fp32 sums "
     "(cause 2)"},
    {"attn_kv (forced x)", kAny, kAny, 0.999,
     "kv_norm's vectorised sum flips a bf16 ulp (cause 2), which the window's FP8 QDQ makes one e4m3 step"},
    {"attn_idx (forced x)", 0, 0, 1, "index lists: the same inputs select the same positions"},
    {"attn_idx (forced selection)", 0, 0, 1, "the window's positions and the official's own selection: integers"},
    {"attn_out (forced x)", 4, kAny, 0.5,
     "sparse_attn's fp32 sums over head_dim and the softmax denominator in torch's order (cause 2) flip single bf16 "
     "ulps of its output, which wo_a and wo_b sum: up to 4 measured on wide (head_dim 512)"},
    {"latent (forced x)", 1, kAny, 0.95, "the compressor's norm and pooling sums (cause 2)"},
    {"compress_kv (forced x)", kAny, kAny, 0.995, "a one-ulp latent flip (cause 2) made one FP4 step by its QDQ"},
    {"index_k (forced x)", kAny, kAny, 0.995, "a one-ulp flip (cause 2) made one FP4 step by its QDQ"},
    {"topk_idxs (forced x)", 0, 0, 1, "the same index scores select the same positions, order included"},
    {"candidates (forced x)", 0, 0, 1, "the same scores keep the same blocks"},
    {"next pre_mix", 0, 0, 1, "the next block collapses with this block's FFN pre: the same tensor"},
    {"decode next pre_mix", 0, 0, 1, "the next block collapses with this block's FFN pre: the same tensor"},
    {"ffn_out (forced x)", 1, kAny, 0.95, "the gate's fp32 GEMM (cause 1) and the experts' bf16 sums"},
    {"experts (forced x)", 0, 0, 1, "gate scores one fp32 ulp apart rank the experts alike"},
    {"expert_weights (forced x)", kAny, 4, 0, "the gate's fp32 GEMM over dim in MKL's blocked order (cause 1)"},
    {"out", 4, kAny, 0.5,
     "the sublayers' flips (cause 2, up to 2 ulps of their output) times post (up to 2), and post and comb from the "
     "fp32 hc GEMM (cause 1)"},
    {"ffn_pre", kAny, kAny, 0,
     "the hc mixes' fp32 GEMM over hc·dim in MKL's blocked order (cause 1, with cancellation), scaled into a sigmoid: "
     "up to 5.6e-4 measured on wide",
     2e-3},
    {"final_collapsed", 4, kAny, 0.5, "as out: the last block's flips and the collapse with ffn_pre (cause 1)"},
    {"final_normed (forced collapsed)", 1, kAny, 0.95, "the final RMSNorm's vectorised sum (cause 2)"},
    {"logits (forced collapsed)", 1, kAny, 0,
     "the fp32 head GEMM over dim in MKL's blocked order (cause 1), in spacings of the row's RMS (logits cancel)"},
    {"logits (end to end)", kAny, kAny, 0,
     "judged relative to the largest official logit: one-ulp flips grow layer by layer (§9.4)"},
    // Decode steps (docs/v41.md §12.4), each layer fed the official's step inputs over caches seeded from the official's
    // prefill and extended by ours: the prefill's causes, on one row.
    {"decode seed window", kAny, kAny, 0.999, "as attn_kv: a kv_norm flip (cause 2) made one e4m3 step by the QDQ"},
    {"decode seed kv_state", kAny, 4, 0.5, "the compressor's fp32 wkv GEMM over dim in MKL's blocked order (cause 1)"},
    {"decode seed score_state", kAny, 4, 0.5, "the compressor's fp32 wgate GEMM (cause 1)"},
    {"decode hash_ids", 0, 0, 1, "integer arithmetic"},
    {"decode attn_idx (forced x)", 0, 0, 1, "the ring's slots and the selection: integers"},
    {"decode topk_idxs (forced x)", 0, 0, 1, "the same index scores select the same positions, order included"},
    {"decode candidates (forced x)", 0, 0, 1, "the same scores keep the same blocks"},
    {"decode latent (forced x)", 1, kAny, 0.95, "the compressor's norm and pooling sums (cause 2)"},
    {"decode attn_out (forced x)", 4, kAny, 0.5,
     "as the prefill's attn_out: sparse_attn's fp32 sums (cause 2), over cache rows ours past the prefill"},
    {"decode ffn_out (forced x)", 1, kAny, 0.95, "the gate's fp32 GEMM (cause 1) and the experts' bf16 sums"},
    {"decode experts (forced x)", 0, 0, 1, "gate scores one fp32 ulp apart rank the experts alike"},
    {"decode out", 4, kAny, 0.5, "as the prefill's out: the sublayers' flips times post, and the hc GEMM (cause 1)"},
    {"decode ffn_pre", kAny, kAny, 0, "as the prefill's ffn_pre: the hc mixes' fp32 GEMM (cause 1) into a sigmoid", 2e-3},
    {"decode final_collapsed", 4, kAny, 0.5, "as the prefill's final_collapsed"},
    {"decode logits (forced collapsed)", 1, kAny, 0, "as the prefill's: the fp32 head GEMM (cause 1), row-scaled"},
    {"decode logits (end to end)", kAny, kAny, 0, "judged as the prefill's end to end logits"},
};

const Budget& budget_of(const std::string& kind) {
  for (const Budget& b : kBudgets)
    if (kind == b.kind) return b;
  static const Budget report_only{"", kAny, kAny, 0, "reported, not judged"};
  return report_only;
}

// |d| in units of the spacing of a format with `bits` significant bits at the official value (normal
// spacing; below the smallest normal, the subnormal step).
double ulps(double d, double ref, int bits) {
  int e = 0;
  std::frexp(std::max(std::fabs(ref), 0x1p-126), &e);
  return d / std::ldexp(1.0, e - bits);
}

}  // namespace

void v41_judge(V41TensorAgreement& r) {
  const Budget& b = budget_of(r.kind);
  // Before any budget, the end-to-end logits' included: a comparison with a NaN is false, so a NaN
  // would pass every `>` below (and an infinity on the official side would make 35 % of it infinite).
  if (r.n == 0 && r.notes.empty()) {  // 0 of 0 is no agreement: a row is judged only over what it compared
    r.failure = "nothing compared (0 values on both sides)";
    return;
  }
  if (r.nonfinite > 0) {
    r.failure = fmt::format("{} of {} values differ by a NaN or an infinity, the first at {}", r.nonfinite, r.n,
                            r.nonfinite_at);
    return;
  }
  if (!r.bound_model.empty()) {  // derived bounds, not a budget: any value outside its interval fails
    if (r.n == 0 && !r.notes.empty()) r.failure = r.notes.front();  // nothing compared: a shape mismatch
    else if (r.outside > 0 && r.rows_compared)
      r.failure = fmt::format("{} of {} selections (both sides) no score inside its interval admits ({}), the first at {}",
                              r.outside, 2 * r.n, r.bound_model, r.outside_at);
    else if (r.outside > 0)
      r.failure = fmt::format("{} of {} values (both sides) outside their admissible interval ({}), the first at {}",
                              r.outside, 2 * r.n, r.bound_model, r.outside_at);
    return;
  }
  if (r.kind == "logits (end to end)" || r.kind == "decode logits (end to end)") {
    // A random model amplifies every flip layer by layer (§9.4; the official code against itself on
    // another thread count: 3-12 % of the logits' scale): measured up to 21 % (tiny, N = 40), with every
    // layer within its budget when teacher forced. 35 % leaves that margin; the layers are the judge.
    if (!(r.max_abs <= 0.35 * r.max_ref))
      r.failure = fmt::format("max |d| {:.3g} is more than 35 % of max |official| {:.3g}", r.max_abs, r.max_ref);
    return;
  }
  if (!r.notes.empty() && r.n == 0) r.failure = r.notes.front();
  else if (r.max_ulp16 > b.max_ulp16)
    r.failure = fmt::format("{:.3g} bf16 ulps > {} ({})", r.max_ulp16, b.max_ulp16, b.reason);
  else if (r.max_abs > b.max_abs)
    r.failure = fmt::format("max |d| {:.3g} > {} ({})", r.max_abs, b.max_abs, b.reason);
  else if (r.max_ulp32 > b.max_ulp32)
    r.failure = fmt::format("{:.4g} fp32 ulps > {} ({})", r.max_ulp32, b.max_ulp32, b.reason);
  else if (r.bitwise() < b.min_bitwise)
    r.failure = fmt::format("{:.4f} {} equal < {} ({})", r.bitwise(), r.rows_compared ? "of rows" : "bitwise",
                            b.min_bitwise, b.reason);
}

std::string v41_budget_reason(const std::string& kind) { return budget_of(kind).reason; }

std::vector<std::string> v41_budget_kinds() {
  std::vector<std::string> kinds;
  for (const Budget& b : kBudgets) kinds.emplace_back(b.kind);
  return kinds;
}

namespace {

struct Gate {
  const V41Model& model;
  const V41RunFile& off;
  V41EngramHashing hashing;  // the checkpoint's (v41_checkpoint_hashing)
  V41Agreement out;
  std::string pass;
  // The bound model of the kinds judged by derived bounds; nullptr in the f64 regime, whose budgets judge.
  const bounds::BoundModel* bounds = nullptr;

  std::string step;  // ", step S" in the decode passes, whose rows gather every step's comparison
  std::vector<V41BoundsRecord>* trace = nullptr;  // every judgement by bounds, for v41_teacher_forced_traced
  // Bounds at every row, not only where the two sides differ (rows_to_bound): a trace, and a soundness sweep
  // that judges the official's values everywhere.
  bool every_row = false;
  // The side under test is a port's engine (v41_agreement_forced), not our reference: a tensor it did not
  // show (empty) is not judged.
  bool engine = false;
  bool unseen(size_t ours) const { return engine && ours == 0; }

  // The rows of `rows` (each of `row_len` values) at which ours and the official's differ as bits: the rows
  // whose bounds can change a verdict. Where the two agree bitwise, ours is the result of the official's
  // implementation, admissible by definition, so the bound is not computed there (spread() stands the
  // official's value in as a point interval); every row where the shapes differ or every_row is set.
  std::vector<int64_t> rows_to_bound(std::span<const double> ours, std::span<const double> official, int64_t rows) const {
    std::vector<int64_t> r;
    const bool all = every_row || trace || rows <= 0 || ours.size() != official.size() ||
                     official.size() % static_cast<size_t>(rows) != 0;
    const size_t len = rows > 0 ? official.size() / static_cast<size_t>(rows) : 0;
    for (int64_t t = 0; t < rows; ++t)
      if (all || !same_bits(ours.subspan(static_cast<size_t>(t) * len, len), official.subspan(static_cast<size_t>(t) * len, len)))
        r.push_back(t);
    return r;
  }
  // The rows `rows` of x (rows of `len` values), gathered.
  // x as it is where it does not hold every row (the bounds then refuse its size, as without gathering).
  template <class T>
  static std::vector<T> gather(std::span<const T> x, std::span<const int64_t> rows, int64_t len) {
    if (x.size() % static_cast<size_t>(len) != 0 ||
        std::any_of(rows.begin(), rows.end(), [&](int64_t r) { return static_cast<size_t>((r + 1) * len) > x.size(); }))
      return {x.begin(), x.end()};
    std::vector<T> g(rows.size() * static_cast<size_t>(len));
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy_n(x.begin() + rows[i] * len, len, g.begin() + static_cast<ptrdiff_t>(i * static_cast<size_t>(len)));
    return g;
  }
  // The official's value as the only admissible one: where ours is that value bit for bit.
  static bounds::BoundedValue point(double v) { return {v, {v, v}, v}; }
  // A quantizer's place named in the rows bounded ("row 3" of the gathered rows) renamed by the row it is.
  static void renumber(V41Straddles& st, std::span<const int64_t> rows) {
    const std::regex row("row ([0-9]+)");
    std::smatch m;
    if (!std::regex_search(st.first, m, row)) return;
    const size_t i = std::stoul(m[1].str());
    if (i < rows.size()) st.first = m.prefix().str() + fmt::format("row {}", rows[i]) + m.suffix().str();
  }
  // Bounds computed at `rows` spread over every row of the official's tensor, the official's value as a point
  // interval at the others (where both sides are that value). Empty when the bounds are (the op not covered).
  static std::vector<bounds::BoundedValue> spread(std::vector<bounds::BoundedValue> chosen, std::span<const int64_t> rows,
                                                  std::span<const double> official, int64_t len) {
    if (official.size() % static_cast<size_t>(len) != 0 || rows.size() * static_cast<size_t>(len) == official.size() ||
        (!rows.empty() && static_cast<size_t>((rows.back() + 1) * len) > official.size()))
      return chosen;  // every row, or a tensor of another shape (which its row fails)
    std::vector<bounds::BoundedValue> b(official.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = point(official[i]);
    if (rows.empty()) return b;
    if (chosen.size() != rows.size() * static_cast<size_t>(len)) return chosen;  // not covered: empty
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy_n(chosen.begin() + static_cast<ptrdiff_t>(i * static_cast<size_t>(len)), len, b.begin() + rows[i] * len);
    return b;
  }

  V41TensorAgreement& row(int64_t layer, const std::string& kind) { return out.rows[index_of(layer, kind)]; }
  size_t index_of(int64_t layer, const std::string& kind) {
    for (size_t i = 0; i < out.rows.size(); ++i)
      if (out.rows[i].pass == pass && out.rows[i].layer == layer && out.rows[i].kind == kind) return i;
    out.rows.push_back({});
    V41TensorAgreement& r = out.rows.back();
    r.pass = pass;
    r.layer = layer;
    r.kind = kind;
    return out.rows.size() - 1;
  }
  // row_len > 0: an activation, its bf16 ulps in spacings of max(|element|, its row's RMS) (Budget).
  void values(int64_t layer, const std::string& kind, std::span<const double> ours, std::span<const double> official,
              int64_t row_len = 0) {
    if (official.empty() || unseen(ours.size())) return;  // not captured, or not shown
    V41TensorAgreement& r = row(layer, kind);
    v41_compare_values(r, ours, official, (layer >= 0 ? fmt::format("layer {}", layer) : "") + step, row_len);
    v41_judge(r);
  }
  // A kind judged by derived bounds: `admissible` computed from the official's own input to the op.
  // admissible_ours: our results' own intervals where they follow another selection than the official's.
  void bounded(int64_t layer, const std::string& kind, std::span<const double> ours, std::span<const double> official,
               std::span<const bounds::BoundedValue> admissible, int64_t row_len,
               const V41Straddles& straddles = {}, std::span<const bounds::BoundedValue> admissible_ours = {}) {
    if (official.empty() || unseen(ours.size())) return;
    V41TensorAgreement& r = row(layer, kind);
    const std::string placed = (layer >= 0 ? fmt::format("layer {}", layer) : "") + step;
    const std::string at = placed.starts_with(' ') ? placed.substr(1) : placed;
    v41_compare_values(r, ours, official, at, row_len);
    v41_compare_bounds(r, ours, official, admissible_ours.empty() ? admissible : admissible_ours, admissible,
                       bounds->name(), at);
    if (trace) {
      V41BoundsRecord& rec = trace->emplace_back();
      rec.layer = layer;
      rec.kind = kind;
      rec.row_len = row_len;
      rec.ours.assign(ours.begin(), ours.end());
      const auto a = admissible_ours.empty() ? admissible : admissible_ours;
      rec.admissible.assign(a.begin(), a.end());
    }
    // Why a difference may be allowed: the first quantizer whose input interval reached two results.
    if (straddles.values > 0 || straddles.scales > 0)
      r.notes.push_back(fmt::format("{} {}: {} quantized values and {} block scales admissible both ways; first: {}",
                                    kind, at, straddles.values, straddles.scales, straddles.first));
    v41_judge(r);
  }
  // The attention's two last ops, each on the official's own input to it (docs/sound-bounds.md §12, §13.1):
  // sparse_attn on its query, rows and index lists, the output projection on sparse_attn's output. Where
  // the file lacks them (the lean golden files) or the regime is f64, the sublayer on attn_x by budgets.
  // The side's sparse_attn output and attn_out on the official's attn_x (attn_o_x, attn_out_x), its sparse_attn
  // alone on the official's q, kv and index lists (attn_o) and its output projection alone on the official's
  // sparse_attn output (attn_out): an engine that shows neither of the last two is judged on the whole
  // attention by its budget.
  void attention_ops(int64_t l, const V41LayerCapture& o, int64_t N, std::span<const double> attn_o_x,
                     std::span<const double> attn_out_x, std::span<const double> attn_o, std::span<const double> attn_out) {
    const V41Config& c = model.config();
    if (!bounds || o.attn_o.empty() || (attn_o.empty() && attn_out.empty())) {
      values(l, "attn_o (forced x)", attn_o_x, o.attn_o, c.head_dim);
      values(l, "attn_out (forced x)", attn_out_x, o.attn_out, c.dim);
      return;
    }
    if (!o.attn_q.empty() && !o.attn_kv.empty() && !o.attn_idx.empty() && !unseen(attn_o.size())) {
      // Bounded per query and head where the two differ.
      const std::span<const double> ours = attn_o;
      const std::vector<int64_t> heads = rows_to_bound(ours, o.attn_o, N * c.n_heads);
      std::vector<uint8_t> needed(static_cast<size_t>(N * c.n_heads), 0);
      for (int64_t th : heads) needed[static_cast<size_t>(th)] = 1;
      std::vector<bounds::BoundedValue> b =
          v41_attention_core_bounds(model, l, o.attn_q, o.attn_kv, o.attn_idx, N, *bounds, needed);
      if (b.size() == o.attn_o.size())
        for (size_t i = 0; i < b.size(); ++i)
          if (!needed[i / static_cast<size_t>(c.head_dim)]) b[i] = point(o.attn_o[i]);
      bounded(l, "attn_o (forced q, kv, idx)", ours, o.attn_o, b, c.head_dim);
    }
    if (unseen(attn_out.size())) return;
    V41Straddles st;
    const std::span<const double> ours = attn_out;
    const std::vector<int64_t> rows = rows_to_bound(ours, o.attn_out, N);
    const int64_t in_len = c.n_heads * c.head_dim;
    const auto admissible = spread(v41_attention_output_bounds(model, l, gather<double>(o.attn_o, rows, in_len),
                                                               static_cast<int64_t>(rows.size()), *bounds, &st, 0, rows),
                                   rows, o.attn_out, c.dim);
    renumber(st, rows);
    bounded(l, "attn_out (forced o)", ours, o.attn_out, admissible, c.dim, st);
  }
  // An index source's selection and, on the candidate source, its pool, judged against the index scores'
  // intervals from the official's attn_x and the keys it read (docs/sound-bounds.md §13.4): each side's rows
  // admissible, near-ties named. Exact lists in f64, or where the file lacks the keys.
  void index_selection(int64_t l, const LayerPlan& lp, const V41LayerCapture& o, const V41SharedAttention& before,
                       const V41LayerCapture& mine, int64_t N) {
    const V41Config& c = model.config();
    const std::vector<double>& keys = lp.owns_index_k ? o.index_k : before.index_k;
    const int64_t T = lp.ratio > 0 ? N / lp.ratio : 0;
    const bool masked = !lp.candidate_source && lp.cand_src >= 0;
    if (!bounds || o.topk_idxs.empty() || T == 0 || keys.size() < static_cast<size_t>(T * c.index_head_dim) ||
        (masked && before.candidates.size() != static_cast<size_t>(N * T))) {
      lists(l, "topk_idxs (forced x)", mine.topk_idxs, o.topk_idxs, mine.index_score, N);
      if (lp.candidate_source) lists(l, "candidates (forced x)", mine.candidates, o.candidates, {}, 0);
      return;
    }
    V41Straddles st;
    const std::span<const uint8_t> pool = masked ? std::span<const uint8_t>(before.candidates) : std::span<const uint8_t>();
    const std::vector<bounds::Interval> score = v41_index_score_bounds(model, l, o.attn_x, N, keys, pool, *bounds, &st);
    // Each side's selection against the scores of the keys it read: an index source scores with its own
    // keys, and ours may differ from the official's by a legitimate rounding (judged as index_k).
    const bool own_keys = lp.owns_index_k && mine.index_k.size() == keys.size() && mine.index_k != keys;
    const std::vector<bounds::Interval> score_ours =
        own_keys ? v41_index_score_bounds(model, l, o.attn_x, N, mine.index_k, pool, *bounds) : score;
    const int64_t k = std::min(c.index_topk, T);
    selection(l, "topk_idxs (forced x)", N, T,
              [score, score_ours, T, k, N, ratio = lp.ratio](const std::vector<int32_t>& sel, int64_t t, bool official_side) {
      return judge_row(std::span<const bounds::Interval>(official_side ? score : score_ours)
                           .subspan(static_cast<size_t>(t * T), static_cast<size_t>(T)),
                       std::span<const int32_t>(sel).subspan(static_cast<size_t>(t * k), static_cast<size_t>(k)), N,
                       (t + 1) / ratio);
    }, mine.topk_idxs, o.topk_idxs, k, st, score_ours, N);
    if (!lp.candidate_source || o.candidates.empty() || unseen(mine.candidates.size())) return;
    // The pool: per query the blocks' largest scores, the block holding its last visible group pinned above all.
    const int64_t B = c.candidate_block_size, nb = (T + B - 1) / B, kb = std::min(c.candidate_topk_blocks, nb);
    auto blocks_of = [&](const std::vector<bounds::Interval>& sc) {
      std::vector<bounds::Interval> blocks(static_cast<size_t>(N * nb), bounds::Interval{-INFINITY, -INFINITY});
      for (int64_t t = 0; t < N; ++t) {
        bounds::Interval* row = blocks.data() + t * nb;
        for (int64_t j = 0; j < T; ++j) {
          const bounds::Interval v = sc[static_cast<size_t>(t * T + j)];
          row[j / B] = {std::max(row[j / B].lo, v.lo), std::max(row[j / B].hi, v.hi)};
        }
        if (const int64_t visible = (t + 1) / lp.ratio; visible > 0) row[(visible - 1) / B] = {INFINITY, INFINITY};
      }
      return blocks;
    };
    const std::vector<bounds::Interval> blocks = blocks_of(score), blocks_ours = own_keys ? blocks_of(score_ours) : blocks;
    // A mask [N, T] as the kept blocks of each row, -1 where a block is kept in part only (no pool's).
    auto kept = [&](const std::vector<uint8_t>& mask) {
      std::vector<int32_t> out(static_cast<size_t>(N * kb), -1);
      for (int64_t t = 0; t < N && mask.size() == static_cast<size_t>(N * T); ++t) {
        int64_t n = 0;
        for (int64_t b = 0; b < nb; ++b) {
          int64_t on = 0, len = std::min(B, T - b * B);
          for (int64_t j = b * B; j < b * B + len; ++j) on += mask[static_cast<size_t>(t * T + j)] != 0;
          if (on == 0) continue;
          if (on != len || n == kb) {  // part of a block, or more blocks than the pool holds
            out[static_cast<size_t>(t * kb)] = -2;
            break;
          }
          out[static_cast<size_t>(t * kb + n++)] = static_cast<int32_t>(b);
        }
      }
      return out;
    };
    selection(l, "candidates (forced x)", N, nb,
              [blocks, blocks_ours, nb, kb](const std::vector<int32_t>& sel, int64_t t, bool official_side) {
      return judge_row(std::span<const bounds::Interval>(official_side ? blocks : blocks_ours)
                           .subspan(static_cast<size_t>(t * nb), static_cast<size_t>(nb)),
                       std::span<const int32_t>(sel).subspan(static_cast<size_t>(t * kb), static_cast<size_t>(kb)), 0);
    }, kept(mine.candidates), kept(o.candidates), kb, {}, blocks_ours, 0);
  }
  // A row of a published selection (k entries: index + offset, or -1 for "none") judged by judge_topk over
  // the positions of finite score; a "none" or a chosen position of score -inf is admissible only when every
  // finite one is chosen, and only below `visible`: a position the query cannot see yet must read -1, as the
  // release writes it. -2 marks a row that is no selection at all. Positions are reported as given.
  static bounds::TopkJudgement judge_row(std::span<const bounds::Interval> score, std::span<const int32_t> row,
                                         int64_t offset, int64_t visible = INT64_MAX) {
    const int64_t n = static_cast<int64_t>(score.size());
    std::vector<int64_t> finite, at(static_cast<size_t>(n), -1), chosen;
    for (int64_t p = 0; p < n; ++p)
      if (score[static_cast<size_t>(p)].hi > -INFINITY) at[static_cast<size_t>(p)] = static_cast<int64_t>(finite.size()), finite.push_back(p);
    std::vector<uint8_t> used(static_cast<size_t>(n), 0);
    int64_t none = -1;  // a chosen "none" or -inf position, if any
    for (int32_t e : row) {
      const int64_t p = e - offset;
      if (e == -1) { none = n; continue; }
      if (e < -1 || p < 0 || p >= n || p >= visible || used[static_cast<size_t>(p)]) return {};  // unseen or twice
      used[static_cast<size_t>(p)] = 1;
      if (at[static_cast<size_t>(p)] < 0) none = p; else chosen.push_back(at[static_cast<size_t>(p)]);
    }
    if (none >= 0 && chosen.size() < finite.size()) {  // a finite score left out for a -inf one
      for (int64_t p : finite)
        if (!used[static_cast<size_t>(p)]) return {false, false, none + offset, p + offset};
    }
    std::vector<bounds::Interval> fs(finite.size());
    for (size_t i = 0; i < finite.size(); ++i) fs[i] = score[static_cast<size_t>(finite[i])];
    if (chosen.size() > finite.size()) return {};
    bounds::TopkJudgement j = none >= 0 ? bounds::TopkJudgement{true} : bounds::judge_topk(fs, chosen);
    if (j.in >= 0) j.in = finite[static_cast<size_t>(j.in)] + offset;
    if (j.out >= 0) j.out = finite[static_cast<size_t>(j.out)] + offset;
    return j;
  }
  // The judge owns what it reads (a traced gate keeps it). scores [N, n] and offset: for the trace.
  template <typename Judge>
  void selection(int64_t l, const std::string& kind, int64_t N, int64_t n, Judge judge, const std::vector<int32_t>& ours,
                 const std::vector<int32_t>& official, int64_t k, const V41Straddles& st,
                 std::span<const bounds::Interval> scores, int64_t offset) {
    if (unseen(ours.size())) return;
    V41TensorAgreement& r = row(l, kind);
    const std::string at = fmt::format("layer {}{}", l, step);
    const std::vector<int64_t> a(ours.begin(), ours.end()), b(official.begin(), official.end());
    v41_compare_rows(r, a, b, N, {}, 0);
    r.bound_model = bounds->name();
    if (official.size() == static_cast<size_t>(N * k) && ours.size() == official.size())
      for (const auto& [side, sel] : {std::pair{"official", &official}, std::pair{"ours", &ours}})
        for (int64_t t = 0; t < N; ++t) {
          const bounds::TopkJudgement j = judge(*sel, t, side == std::string("official"));
          if (!j.admissible && r.outside++ == 0)
            r.outside_at = j.in < 0 ? fmt::format("{} row {}: {} chose an entry twice, out of range or not yet visible, or not whole blocks",
                                                  at, t, side)
                                    : fmt::format("{} row {}: {} chose {} over {} (of {}), whose score is higher for every "
                                                  "admissible value", at, t, side, j.in, j.out, n);
          if (j.admissible && j.contested && side == std::string("official") && r.straddled++ == 0)
            r.bound_use_at = fmt::format("{} row {}: {} and {} could trade places", at, t, j.in, j.out);
        }
    if (st.values > 0 || st.scales > 0)
      r.notes.push_back(fmt::format("{} {}: {} quantized values and {} block scales admissible both ways; first: {}", kind,
                                    at, st.values, st.scales, st.first));
    v41_judge(r);
    if (trace && ours.size() == static_cast<size_t>(N * k))
      trace->push_back({l, kind, 0, {}, {}, N, k, offset, a, {scores.begin(), scores.end()},
                        [judge](std::span<const int64_t> sel, int64_t t) {
                          return judge(std::vector<int32_t>(sel.begin(), sel.end()), t, false);  // our side's
                        }});
  }
  // sparse_attn's index lists [N, k] a layer builds from a selection: the window's positions of a prefill
  // from 0, then the compressed part: the official's own selection where the layer owns the indexer, else
  // the one published before it (the official's, in teacher forcing).
  std::vector<int32_t> index_lists(const LayerPlan& lp, const V41LayerCapture& o, const V41SharedAttention& before,
                                   int64_t N) const {
    const int64_t W = model.config().window_size, kw = std::min(N, W);
    const std::vector<int32_t> win = fwd::window_topk_idxs(N, W);
    std::vector<int32_t> comp;
    if (lp.ratio > 0) comp = lp.owns_indexer ? o.topk_idxs : before.topk_idxs;
    const int64_t kc = N > 0 ? static_cast<int64_t>(comp.size()) / N : 0;
    std::vector<int32_t> idx(static_cast<size_t>(N * (kw + kc)));
    for (int64_t t = 0; t < N; ++t) {
      std::copy_n(win.begin() + t * kw, kw, idx.begin() + t * (kw + kc));
      std::copy_n(comp.begin() + t * kc, kc, idx.begin() + t * (kw + kc) + kw);
    }
    return idx;
  }
  // The block around its sublayers (docs/sound-bounds.md §14.2): its mixes, the FFN's input, the next block's
  // pre and the output streams (or, after the last block, the final collapse), each side by bounds from its
  // own streams, sublayer outputs and hc mixes, where the file holds the mixes; else by budgets. next_in and
  // next_pre: the official's next block's input streams and pre_mix (empty after the last block).
  void block(int64_t l, const V41LayerCapture& o, const V41LayerCapture& ours, int64_t N, const std::vector<double>& next_in,
             const std::vector<double>& next_pre, std::span<const double> ours_final, std::span<const double> official_final,
             const std::string& prefix = "") {
    const V41Config& c = model.config();
    const bool last = next_in.empty();
    if (unseen(ours.out.size())) return;
    // Each side's bounds are built from its own captures; the last block's collapse needs the FFN's pre too.
    const bool whole = v41_block_captured(c, o, N) && v41_block_captured(c, ours, N) &&
                       (!last || o.ffn_pre.size() == static_cast<size_t>(N * c.hc_mult));
    // Without the mixes, or with a capture of another shape (which its own row fails), the budgets.
    if (!bounds || !whole) {
      if (!last) {
        values(l, prefix + "out", ours.out, next_in, c.dim);
        values(l, prefix + "ffn_pre", ours.ffn_pre, next_pre);
      } else {
        values(l, prefix + "final_collapsed", ours_final, official_final, c.dim);
      }
      return;
    }
    const V41BlockBounds b = v41_block_bounds(model, l, o, N, *bounds), mine = v41_block_bounds(model, l, ours, N, *bounds);
    auto as_bounded = [](const std::vector<bounds::Interval>& v) {
      std::vector<bounds::BoundedValue> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = {(v[i].lo + v[i].hi) / 2, v[i], (v[i].lo + v[i].hi) / 2};
      return out;
    };
    bounded(l, prefix + "attn_pre", ours.attn_pre, o.attn_pre, as_bounded(b.attn_mixes.pre), 0, {}, as_bounded(mine.attn_mixes.pre));
    bounded(l, prefix + "attn_post", ours.attn_post, o.attn_post, as_bounded(b.attn_mixes.post), 0, {},
            as_bounded(mine.attn_mixes.post));
    // Sinkhorn: reported, not judged (docs/sound-bounds.md §15)
    values(l, prefix + "attn_comb", ours.attn_comb, o.attn_comb);
    bounded(l, prefix + "ffn_x", ours.ffn_x, o.ffn_x, b.ffn_x, c.dim, {}, mine.ffn_x);
    bounded(l, prefix + "ffn_pre", ours.ffn_pre, o.ffn_pre.empty() ? next_pre : o.ffn_pre, as_bounded(b.ffn_mixes.pre), 0, {},
            as_bounded(mine.ffn_mixes.pre));
    bounded(l, prefix + "ffn_post", ours.ffn_post, o.ffn_post, as_bounded(b.ffn_mixes.post), 0, {}, as_bounded(mine.ffn_mixes.post));
    values(l, prefix + "ffn_comb", ours.ffn_comb, o.ffn_comb);
    if (!last) {
      bounded(l, prefix + "out", ours.out, next_in, b.out, c.dim, {}, mine.out);
      if (!o.ffn_pre.empty() && next_pre != o.ffn_pre)  // the next block collapses with what this one made
        lists(l, prefix + "next pre_mix", std::vector<int64_t>{0}, std::vector<int64_t>{1}, {}, 0, 1);
    } else {
      bounded(l, prefix + "final_collapsed", ours_final, official_final,
              v41_final_collapse_bounds(model, b.out, o.ffn_pre, N, *bounds), c.dim, {},
              v41_final_collapse_bounds(model, mine.out, ours.ffn_pre, N, *bounds));
    }
  }
  // A kv source's compressor on the official's attn_x (docs/sound-bounds.md §14.4): its latent, compressed KV
  // and index keys, by bounds; budgets in f64.
  void compressor(int64_t l, const LayerPlan& lp, const V41LayerCapture& o, int64_t N, const V41LayerCapture& mine) {
    const V41Config& c = model.config();
    if (!lp.owns_compressor) return;
    if (!bounds || o.attn_x.empty() || lp.ratio <= 0) {
      values(l, "latent (forced x)", mine.latent, o.latent, c.head_dim);
      values(l, "compress_kv (forced x)", mine.compress_kv, o.compress_kv);
      if (lp.owns_index_k) values(l, "index_k (forced x)", mine.index_k, o.index_k);
      return;
    }
    const V41CompressorBounds b = v41_compressor_bounds(model, l, o.attn_x, N, *bounds);
    bounded(l, "latent (forced x)", mine.latent, o.latent, b.latent, c.head_dim, b.latent_straddles);
    bounded(l, "compress_kv (forced x)", mine.compress_kv, o.compress_kv, b.compress_kv, c.head_dim, b.kv_straddles);
    if (lp.owns_index_k)
      bounded(l, "index_k (forced x)", mine.index_k, o.index_k, b.index_k, c.index_head_dim, b.k_straddles);
  }
  // The query and the window KV on the official's attn_x, by bounds carried through wq_a, q_norm, wq_b, the
  // RoPE (and for the KV wkv, kv_norm, the RoPE, the QDQ): attn_kv's window rows only, its compressed rows
  // being the published compress_kv, judged as such. Budgets in f64.
  // Returns the window KV rows' bounds [N, head_dim] (empty where not bounded).
  std::vector<bounds::BoundedValue> query_and_window(int64_t l, const V41LayerCapture& o, int64_t N,
                                                     const V41LayerCapture& mine) {
    const V41Config& c = model.config();
    if (!bounds) {
      values(l, "attn_q (forced x)", mine.attn_q, o.attn_q, c.head_dim);
      values(l, "attn_kv (forced x)", mine.attn_kv, o.attn_kv);
      return {};
    }
    if (o.attn_x.empty()) return {};
    const size_t w = static_cast<size_t>(N * c.head_dim);
    const bool kv = o.attn_kv.size() >= w && mine.attn_kv.size() >= w;
    // The rows where the query or the window KV differ (every row where the decode seed reads the window's).
    std::vector<int64_t> rows = rows_to_bound(mine.attn_q, o.attn_q, N);
    if (kv) {
      const auto r = rows_to_bound(std::span<const double>(mine.attn_kv).first(w), std::span<const double>(o.attn_kv).first(w), N);
      std::vector<int64_t> both;
      std::set_union(rows.begin(), rows.end(), r.begin(), r.end(), std::back_inserter(both));
      rows = std::move(both);
    }
    if (off.decode) {
      rows.resize(static_cast<size_t>(N));
      std::iota(rows.begin(), rows.end(), 0);
    }
    V41QkvBounds b = v41_attention_qkv_bounds(model, l, gather<double>(o.attn_x, rows, c.dim), static_cast<int64_t>(rows.size()),
                                              *bounds, rows);
    renumber(b.q_straddles, rows);
    renumber(b.kv_straddles, rows);
    bounded(l, "attn_q (forced x)", mine.attn_q, o.attn_q, spread(std::move(b.q), rows, o.attn_q, c.n_heads * c.head_dim),
            c.head_dim, b.q_straddles);
    if (!kv) return {};
    const std::span<const double> off_kv = std::span<const double>(o.attn_kv).first(w);
    std::vector<bounds::BoundedValue> window = spread(std::move(b.kv), rows, off_kv, c.head_dim);
    bounded(l, "attn_kv window (forced x)", std::span<const double>(mine.attn_kv).first(w), off_kv, window, c.head_dim,
            b.kv_straddles);
    return window;
  }
  // What the prefill hands to the decode steps (docs/sound-bounds.md §13.5): the window ring (the window KV's
  // bounds at slot p % W, the unwritten slots 0) and a ratio > 1 kv source's pending group (the compressor's
  // fp32 wkv and wgate rows of its tokens at slot p % ratio, bounded by §5; score -inf and kv 0 unwritten).
  // Budgets where not bounded.
  void decode_seed(int64_t l, const LayerPlan& lp, std::span<const double> x, std::span<const double> x_ours, int64_t N,
                   const V41LayerCache& mine, const V41LayerCache& os, const std::vector<bounds::BoundedValue>& window) {
    const V41Config& c = model.config();
    const int64_t hd = c.head_dim, W = c.window_size;
    if (!bounds || window.size() != static_cast<size_t>(N * hd)) {
      values(l, "decode seed window", mine.window, os.window);
      values(l, "decode seed kv_state", mine.kv_state, os.kv_state);
      values(l, "decode seed score_state", mine.score_state, os.score_state);
      return;
    }
    // Each side's seed from its own attn_x: ours ran the layer on the official's streams, and its attn_x
    // may differ from the official's by a legitimate rounding (judged as attn_x).
    const bool own_x = x_ours.size() == x.size() && !std::equal(x.begin(), x.end(), x_ours.begin());
    const std::vector<bounds::BoundedValue> window_ours =
        own_x ? v41_attention_qkv_bounds(model, l, x_ours, N, *bounds).kv : std::vector<bounds::BoundedValue>{};
    const bounds::BoundedValue zero{0, {0, 0}, 0};
    auto ring_of = [&](const std::vector<bounds::BoundedValue>& win) {
      std::vector<bounds::BoundedValue> ring(static_cast<size_t>(W * hd), zero);
      for (int64_t p = std::max<int64_t>(0, N - W); p < N && !win.empty(); ++p)
        std::copy_n(win.begin() + p * hd, hd, ring.begin() + (p % W) * hd);
      return win.empty() ? std::vector<bounds::BoundedValue>{} : ring;
    };
    bounded(l, "decode seed window", mine.window, os.window, ring_of(window), hd, {}, ring_of(window_ours));
    if (lp.ratio <= 1 || os.kv_state.empty()) return;
    const int64_t r = lp.ratio, cut = N - N % r, n = N - cut;
    const V41LayerWeights& w = model.layer_weights(l);
    const bounds::BoundedValue none{-INFINITY, {-INFINITY, -INFINITY}, -INFINITY};
    for (const auto& [kind, lin, empty, own, theirs] :
         {std::tuple{"decode seed kv_state", &w.compressor_wkv, zero, &mine.kv_state, &os.kv_state},
          std::tuple{"decode seed score_state", &w.compressor_wgate, none, &mine.score_state, &os.score_state}}) {
      // The compressor's fp32 rows of the pending group's tokens at slot p % ratio, from a side's attn_x.
      // (Plain locals: clang 14 cannot capture structured bindings.)
      const V41Linear& weight = *lin;
      const bounds::BoundedValue unwritten = empty;
      auto state_of = [&](std::span<const double> xs) {
        std::vector<bounds::BoundedValue> b(static_cast<size_t>(r * hd), unwritten);
        if (n > 0) {
          std::vector<bounds::Interval> rows(static_cast<size_t>(n * c.dim));
          const double* from = xs.data() + cut * c.dim;
          for (size_t i = 0; i < rows.size(); ++i) rows[i] = {from[i], from[i]};
          const auto y = v41_linear_w_bounds(model, rows, n, weight, *bounds, 24);
          std::copy(y.begin(), y.end(), b.begin());
        }
        return b;
      };
      bounded(l, kind, *own, *theirs, state_of(x), 0, {}, own_x ? state_of(x_ours) : std::vector<bounds::BoundedValue>{});
    }
  }
  // The MoE on the official's ffn_x, each side judged under its own selection (the selections themselves
  // judged by the router's bounds): budgets where the router is not one the derivation covers, or in f64.
  void moe(int64_t l, const std::string& prefix, std::span<const double> ffn_x, int64_t N, std::span<const double> ours,
           const V41LayerCapture& mine, const V41LayerCapture& o) {
    const std::string kind = prefix + "ffn_out (forced x)";
    const V41Config& c = model.config();
    if (bounds && !o.experts.empty() && !mine.experts.empty() && c.score_func == "sqrtsoftplus" && c.gate_temp > 0) {
      const std::vector<int64_t> theirs(o.experts.begin(), o.experts.end()), own(mine.experts.begin(), mine.experts.end());
      const int64_t D = c.dim, K = c.n_activated_experts;
      // The rows where the outputs or the selections differ.
      std::vector<int64_t> rows;
      if (own.size() == theirs.size() && ours.size() == o.ffn_out.size()) {
        const auto r = rows_to_bound(ours, o.ffn_out, N);
        std::vector<uint8_t> at(static_cast<size_t>(N), 0);
        for (int64_t t : r) at[static_cast<size_t>(t)] = 1;
        for (int64_t t = 0; t < N; ++t)
          if (at[static_cast<size_t>(t)] || !std::equal(own.begin() + t * K, own.begin() + (t + 1) * K, theirs.begin() + t * K))
            rows.push_back(t);
      } else {
        rows.resize(static_cast<size_t>(N));
        std::iota(rows.begin(), rows.end(), 0);
      }
      const int64_t M = static_cast<int64_t>(rows.size());
      const std::vector<double> x = gather<double>(ffn_x, rows, D);
      V41Straddles st;
      const auto admissible = spread(v41_moe_bounds(model, l, x, M, gather<int64_t>(theirs, rows, K), *bounds, &st), rows, o.ffn_out, D);
      const auto admissible_ours = own == theirs ? std::vector<bounds::BoundedValue>{}
                                                 : spread(v41_moe_bounds(model, l, x, M, gather<int64_t>(own, rows, K), *bounds),
                                                          rows, o.ffn_out, D);
      renumber(st, rows);
      return bounded(l, kind, ours, o.ffn_out, admissible, D, st, admissible_ours);
    }
    values(l, kind, ours, o.ffn_out, model.config().dim);
  }
  // The head on the official's final_collapsed (and, for the logits, the official's final_normed: each op
  // fed the official's own input), judged by bounds where the regime rounds as the release does.
  void head(std::span<const double> collapsed, std::span<const double> normed, std::span<const double> logits,
            int64_t N, const std::string& prefix, bool judge_normed) {
    const V41Config& c = model.config();
    V41ForwardResult h;
    model.head_collapsed(collapsed, N, h);
    if (!bounds) {
      if (judge_normed) values(-1, prefix + "final_normed (forced collapsed)", h.final_normed, normed, c.dim);
      values(-1, prefix + "logits (forced collapsed)", h.logits, logits, c.vocab_size);
      return;
    }
    if (judge_normed && !normed.empty())
      bounded(-1, prefix + "final_normed (forced collapsed)", h.final_normed, normed,
              bounds::rmsnorm_bounds(collapsed, c.dim, model.final_norm_weight(), c.norm_eps, *bounds, 8), c.dim);
    if (normed.empty() || logits.empty()) return values(-1, prefix + "logits (forced collapsed)", h.logits, logits, c.vocab_size);
    std::vector<double> ours(static_cast<size_t>(N * c.vocab_size));
    fwd::linear(fwd::Arith(model.regime()), normed, N, c.dim, model.head_weight(), c.vocab_size, ours, false);
    bounded(-1, prefix + "logits (forced normed)", ours, logits,
            bounds::linear_bounds(normed, N, c.dim, model.head_weight(), c.vocab_size, *bounds, 24), c.vocab_size);
  }
  // The router on the official's ffn_x: each side's selection judged admissible under the score intervals,
  // each side's route weights under its own selection (docs/sound-bounds.md §9); budgets where the router
  // is not one the derivation covers, or in the f64 regime.
  void router(int64_t l, const std::string& prefix, std::span<const double> ffn_x, int64_t N, const V41LayerCapture& ours,
              const V41LayerCapture& o) {
    if (unseen(ours.experts.size())) return;
    if (bounds && !o.experts.empty()) {
      const std::vector<int64_t> mine(ours.experts.begin(), ours.experts.end()), theirs(o.experts.begin(), o.experts.end());
      // Both rows first (row() may grow the table), then references to them.
      const size_t e = index_of(l, prefix + "experts (forced x)");
      const size_t w = o.expert_weights.empty() ? e : index_of(l, prefix + "expert_weights (forced x)");
      if (v41_judge_router(model, l, ffn_x, N, mine, ours.expert_weights, theirs, o.expert_weights, *bounds,
                           fmt::format("layer {}{}", l, step), out.rows[e], o.expert_weights.empty() ? nullptr : &out.rows[w])) {
        if (trace) trace_router(l, prefix, ffn_x, N, mine, ours.expert_weights);
        return;
      }
      out.rows.erase(out.rows.begin() + static_cast<std::ptrdiff_t>(std::max(e, w)));  // not covered: budgets judge
      if (w != e) out.rows.erase(out.rows.begin() + static_cast<std::ptrdiff_t>(std::min(e, w)));
    }
    lists(l, prefix + "experts (forced x)", ours.experts, o.experts, {}, 0, N);
    if (!o.expert_weights.empty()) values(l, prefix + "expert_weights (forced x)", ours.expert_weights, o.expert_weights);
  }
  // The router's judgements of our side, as v41_judge_router makes them: the selection's rows against the
  // biased scores, the route weights against their intervals under our selection.
  void trace_router(int64_t l, const std::string& prefix, std::span<const double> ffn_x, int64_t N,
                    const std::vector<int64_t>& mine, std::span<const double> weights) {
    const V41Config& c = model.config();
    const auto rb = v41_router_bounds(c, ffn_x, N, model.gate_weight(l), model.gate_bias(l), *bounds);
    const int64_t K = c.n_activated_experts, E = c.n_routed_experts;
    if (!rb || mine.size() != static_cast<size_t>(N * K)) return;
    trace->push_back({l, prefix + "experts (forced x)", 0, {}, {}, N, K, 0, mine, rb->biased,
                      [biased = rb->biased, K, E](std::span<const int64_t> sel, int64_t t) {
                        return bounds::judge_topk(std::span<const bounds::Interval>(biased).subspan(static_cast<size_t>(t * E), static_cast<size_t>(E)),
                                                  sel.subspan(static_cast<size_t>(t * K), static_cast<size_t>(K)));
                      }});
    if (weights.size() != mine.size()) return;
    V41BoundsRecord& w = trace->emplace_back();
    w.layer = l;
    w.kind = prefix + "expert_weights (forced x)";
    w.ours.assign(weights.begin(), weights.end());
    for (int64_t t = 0; t < N; ++t)
      for (const bounds::Interval& iv :
           v41_route_weight_bounds(c, *rb, t, std::span<const int64_t>(mine).subspan(static_cast<size_t>(t * K), static_cast<size_t>(K)), *bounds)) {
        const double mid = (iv.lo + iv.hi) / 2;
        w.admissible.push_back({mid, iv, bounds::rounded_nearest(mid, mid, 24).lo});
      }
  }
  // rows: of both lists (0: the prefill's N).
  template <class A, class B>
  void lists(int64_t layer, const std::string& kind, const std::vector<A>& ours, const std::vector<B>& official,
             std::span<const double> scores, int64_t offset, int64_t rows = 0) {
    if (official.empty() || unseen(ours.size())) return;
    V41TensorAgreement& r = row(layer, kind);
    const std::vector<int64_t> a(ours.begin(), ours.end()), b(official.begin(), official.end());
    const size_t noted = r.notes.size();
    const bool placed = !r.where.empty();
    v41_compare_rows(r, a, b, rows ? rows : off.result.N, scores, offset);
    for (size_t i = noted; i < r.notes.size(); ++i) r.notes[i] += step;
    if (!placed && !r.where.empty()) r.where += step;
    v41_judge(r);
  }
};

// The streams entering layer l of an official result (the prefill's or a decode step's): before its Engram.
const std::vector<double>& official_input(const V41ForwardResult& r, const V41Plan& plan, int64_t l) {
  const V41LayerCapture& c = r.layers[static_cast<size_t>(l)];
  return plan[l].engram ? c.engram_in : c.in;
}

// One layer judged, teacher forced: `ours` the side under test's layer on the official's inputs, `after` the
// official's state before the layer with the side's attention's publications (what its index lists and
// selection read); `seed` what our layer hands to decode steps (our reference only).
void judge_layer(Gate& g, int64_t l, const V41SharedAttention& after, const V41ForcedLayer& ours,
                 const V41LayerCache* seed) {
  const V41Model& m = g.model;
  const V41Config& c = m.config();
  const V41RunFile& off = g.off;
  const int64_t N = off.result.N, L = c.n_layers;
  const LayerPlan& lp = m.plan()[l];
  const V41LayerCapture& o = off.result.layers[static_cast<size_t>(l)];
  const V41LayerCapture& block = ours.block;
  if (lp.engram) g.lists(l, "hash_ids", ours.hash_ids, o.hash_ids, {}, 0);
  // Engram is judged on the official's streams: a side that shows other streams into it (ced diff of two files
  // that differ upstream) has its Engram not judged, its block still judged on its own captures below.
  const bool engram_on_theirs = block.engram_in.empty() || same_bits(block.engram_in, o.engram_in);
  if (lp.engram && engram_on_theirs) {
    if (g.bounds && !o.engram_in.empty() && !o.hash_ids.empty() && !o.in.empty()) {
      // Engram on the official's streams and hash ids, ours on the hash ids it read.
      const std::vector<int64_t> theirs(o.hash_ids.begin(), o.hash_ids.end());
      const std::vector<int64_t> own =
          block.hash_ids.empty() ? theirs : std::vector<int64_t>(block.hash_ids.begin(), block.hash_ids.end());
      g.bounded(l, "in", block.in, o.in, v41_engram_bounds(m, l, o.engram_in, theirs, N, *g.bounds), c.dim, {},
                own == theirs || own.size() != theirs.size() ? std::vector<bounds::BoundedValue>{}
                                                             : v41_engram_bounds(m, l, o.engram_in, own, N, *g.bounds));
    } else {
      g.values(l, "in", block.in, o.in, c.dim);
    }
  }
  if (g.bounds && !o.in.empty() && !o.attn_x.empty())  // the collapse and attn_norm, each side on its own streams
    g.bounded(l, "attn_x", block.attn_x, o.attn_x, v41_attn_x_bounds(m, l, o.in, o.pre_mix, N, *g.bounds), c.dim, {},
              lp.engram && block.in.size() == o.in.size() ? v41_attn_x_bounds(m, l, block.in, o.pre_mix, N, *g.bounds)
                                                          : std::vector<bounds::BoundedValue>{});
  else
    g.values(l, "attn_x", block.attn_x, o.attn_x, c.dim);
  // Each sublayer on the official's own input: its differences are its own.
  const V41LayerCapture& sa = ours.attention;
  const std::vector<bounds::BoundedValue> window = g.query_and_window(l, o, N, sa);
  if (off.decode && seed) g.decode_seed(l, lp, o.attn_x, block.attn_x, N, *seed, off.decode->seed[static_cast<size_t>(l)], window);
  if (g.bounds && !g.engine)  // the index lists of the official's own selection (itself judged by its bounds)
    g.lists(l, "attn_idx (forced selection)", g.index_lists(lp, o, after, N), o.attn_idx, {}, 0);
  else if (lp.owns_indexer && !sa.topk_idxs.empty() && sa.topk_idxs.size() == o.topk_idxs.size())
    // An engine's own lists against those its own selection makes: the selection is judged by its bounds below,
    // where a tie broken the other way is admissible, and so are the lists it makes.
    g.lists(l, "attn_idx (forced x)", sa.attn_idx, g.index_lists(lp, sa, after, N), {}, 0);
  else  // an engine's own lists, built from the official's selection (of a layer below)
    g.lists(l, "attn_idx (forced x)", sa.attn_idx, o.attn_idx, {}, 0);
  g.compressor(l, lp, o, N, sa);
  if (lp.owns_indexer) g.index_selection(l, lp, o, after, sa, N);

  if (lp.candidate_source && !g.bounds) g.lists(l, "candidates (forced x)", sa.candidates, o.candidates, {}, 0);
  g.attention_ops(l, o, N, sa.attn_o, ours.attn_out, ours.attn_o, ours.attn_out_of_o);
  g.router(l, "", o.ffn_x, N, ours.moe, o);  // the selection first: ffn_out is judged under it
  g.moe(l, "", o.ffn_x, N, ours.ffn_out, ours.moe, o);
  V41ForwardResult h;
  if (l + 1 == L && !block.out.empty()) m.head(block.out, block.ffn_pre, N, h);
  g.block(l, o, block, N, l + 1 < L ? official_input(off.result, m.plan(), l + 1) : std::vector<double>{},
          l + 1 < L ? off.result.layers[static_cast<size_t>(l + 1)].pre_mix : std::vector<double>{},
          h.final_collapsed, off.result.final_collapsed);
}

// The layers in order, each given the official's state before it (its publications, from here on the
// official's: a selection flip stays in its layer); `layer(l, shared, after, seed)` returns the side's layer l,
// leaves in `after` (the state before it) what its attention published and may publish its block's own into
// `shared` (kept where the run file lacks the official's).
template <typename Layer>
void forced_layers(Gate& g, Layer layer) {
  g.pass = "teacher forced";
  const V41Model& m = g.model;
  const V41RunFile& off = g.off;
  const int64_t L = m.config().n_layers;
  V41SharedAttention shared;
  for (int64_t l = 0; l < L; ++l) {
    const LayerPlan& lp = m.plan()[l];
    const V41LayerCapture& o = off.result.layers[static_cast<size_t>(l)];
    if (official_input(off.result, m.plan(), l).empty() || o.pre_mix.empty())
      throw InputError(fmt::format("v41 gate: the run file has no input streams or pre_mix for layer {}", l));
    V41SharedAttention after = shared;
    V41LayerCache seed;
    const V41ForcedLayer ours = layer(l, shared, after, off.decode ? &seed : nullptr);
    judge_layer(g, l, after, ours, off.decode && !g.engine ? &seed : nullptr);
    if (lp.owns_compressor && !o.compress_kv.empty()) shared.compress_kv = o.compress_kv;
    if (lp.owns_index_k && !o.index_k.empty()) shared.index_k = o.index_k;
    if (lp.owns_indexer && !o.topk_idxs.empty()) shared.topk_idxs.assign(o.topk_idxs.begin(), o.topk_idxs.end());
    if (lp.candidate_source && !o.candidates.empty()) shared.candidates.assign(o.candidates.begin(), o.candidates.end());
  }
}

void teacher_forced(Gate& g) {
  const V41Model& m = g.model;
  const V41RunFile& off = g.off;
  const int64_t N = off.result.N;
  // Our hash ids from the prompt, judged before each Engram layer consumes the official's.
  const std::vector<int64_t> ids = m.engram_hash_ids(off.tokens, g.hashing);
  int64_t engram_index = 0;
  forced_layers(g, [&](int64_t l, V41SharedAttention& shared, V41SharedAttention& after, V41LayerCache* seed) {
    const V41LayerCapture& o = off.result.layers[static_cast<size_t>(l)];
    V41ForcedLayer f;
    if (m.plan()[l].engram) {
      const std::vector<int64_t> own = m.engram_layer_hash_ids(ids, N, engram_index++);
      f.hash_ids.assign(own.begin(), own.end());
    }
    f.block = m.run_layer(l, official_input(off.result, m.plan(), l), o.pre_mix, N, o.hash_ids, shared, seed);
    f.attn_out = m.attention(l, o.attn_x, N, after, f.attention);
    if (!o.attn_q.empty() && !o.attn_kv.empty() && !o.attn_idx.empty())
      f.attn_o = m.attention_core(l, o.attn_q, o.attn_kv, o.attn_idx, N);
    if (!o.attn_o.empty()) f.attn_out_of_o = m.attention_output(l, o.attn_o, N);
    f.ffn_out = m.moe(l, o.ffn_x, N, f.moe);
    return f;
  });
  g.head(off.result.final_collapsed, off.result.final_normed, off.result.logits, N, "", true);
}

void end_to_end(Gate& g) {
  g.pass = "end to end";
  const V41Model& m = g.model;
  const V41Config& c = m.config();
  const std::vector<int64_t>& tokens = g.off.tokens;
  // The rotary tables depend on the config and the prompt length alone.
  const fwd::Arith a(m.regime());
  for (const auto& [kind, yarn] : {std::pair{"swa", false}, std::pair{"compressed", true}}) {
    const auto t = fwd::rope_table(a, c.rope_head_dim, g.off.result.N, yarn ? c.original_seq_len : 0,
                                   yarn ? c.compress_rope_theta : c.rope_theta, c.rope_factor, c.beta_fast, c.beta_slow);
    const auto cos = g.off.rope.find(std::string(kind) + "_cos"), sin = g.off.rope.find(std::string(kind) + "_sin");
    if (cos != g.off.rope.end()) g.values(-1, "rope", t.cos, cos->second);
    if (sin != g.off.rope.end()) g.values(-1, "rope", t.sin, sin->second);
  }
  const V41ForwardResult r = m.forward(tokens, g.hashing);
  for (const auto& ours : r.layers) {
    const V41LayerCapture& o = g.off.result.layers[static_cast<size_t>(ours.layer)];
    g.values(ours.layer, "in (end to end)", ours.in, o.in);
    if (m.plan()[ours.layer].owns_indexer)
      g.lists(ours.layer, "topk_idxs (end to end)", ours.topk_idxs, o.topk_idxs, ours.index_score, g.off.result.N);
    g.lists(ours.layer, "experts (end to end)", ours.experts, o.experts, {}, 0);
  }
  g.values(-1, "final_collapsed (end to end)", r.final_collapsed, g.off.result.final_collapsed);
  g.values(-1, "logits (end to end)", r.logits, g.off.result.logits);
}

// The decode after the official's prefill: its state rebuilt from the file (the official's rings and
// groups after the prefill, its compressed KV and index keys), then every step's layers fed the official's
// step inputs (each sublayer also alone on the official's sublayer input), the official's selection and
// candidate pool published after each layer, as in the prefill's teacher forcing.
void decode_teacher_forced(Gate& g) {
  g.pass = "decode forced";
  const V41Model& m = g.model;
  const V41Config& c = m.config();
  const V41RunFile& off = g.off;
  const V41DecodeRecord& d = *off.decode;
  const int64_t L = c.n_layers;
  V41DecodeState st;
  st.pos = off.result.N;
  st.tokens = off.tokens;
  st.layers = d.seed;
  for (int64_t l = 0; l < L; ++l) {
    st.layers[static_cast<size_t>(l)].compress_kv = off.result.layers[static_cast<size_t>(l)].compress_kv;
    st.layers[static_cast<size_t>(l)].index_k = off.result.layers[static_cast<size_t>(l)].index_k;
  }
  m.seed_decode_pointers(st);
  for (size_t s = 0; s < d.steps.size(); ++s) {
    const V41ForwardResult& os = d.steps[s];
    g.step = fmt::format(" step {}", s);
    st.tokens.push_back(d.tokens[s]);
    const std::vector<int64_t> ids = m.engram_step_hash_ids(st, g.hashing);
    int64_t engram_index = 0;
    for (int64_t l = 0; l < L; ++l) {
      const LayerPlan& lp = m.plan()[l];
      const V41LayerCapture& o = os.layers[static_cast<size_t>(l)];
      const std::vector<double>& input = official_input(os, m.plan(), l);
      if (input.empty() || o.pre_mix.empty() || o.attn_x.empty() || o.ffn_x.empty())
        throw InputError(fmt::format("v41 gate: decode step {} has no inputs for layer {}", s, l));
      if (lp.engram) g.lists(l, "decode hash_ids", m.engram_layer_hash_ids(ids, 1, engram_index++), o.hash_ids, {}, 0, 1);
      V41DecodeState forced = st;  // the attention alone on the official's attn_x, from the same state
      V41LayerCapture sa;
      const std::vector<double> ao = m.attention_step(l, o.attn_x, forced, sa);
      if (lp.owns_compressor) g.values(l, "decode latent (forced x)", sa.latent, o.latent, c.head_dim);
      if (lp.owns_indexer) g.lists(l, "decode topk_idxs (forced x)", sa.topk_idxs, o.topk_idxs, sa.index_score, c.window_size, 1);
      if (lp.candidate_source) g.lists(l, "decode candidates (forced x)", sa.candidates, o.candidates, {}, 0, 1);
      g.lists(l, "decode attn_idx (forced x)", sa.attn_idx, o.attn_idx, {}, 0, 1);  // the ring's, then the selection
      if (g.bounds && !o.attn_o.empty()) {  // the output projection on the official's sparse_attn output
        V41Straddles so;
        const auto admissible = v41_attention_output_bounds(m, l, o.attn_o, 1, *g.bounds, &so, st.pos);
        g.bounded(l, "decode attn_out (forced o)", m.attention_output(l, o.attn_o, 1, st.pos), o.attn_out, admissible, c.dim, so);
      }
      // The step's whole attention on the official's attn_x, over the cache rows our steps wrote (no capture
      // holds the official's, so sparse_attn is not bounded there yet: docs/sound-bounds.md §15): by budget.
      g.values(l, "decode attn_out (forced x)", ao, o.attn_out, c.dim);
      V41LayerCapture sm;
      const std::vector<double> mo = m.moe(l, o.ffn_x, 1, sm);
      g.router(l, "decode ", o.ffn_x, 1, sm, o);
      g.moe(l, "decode ", o.ffn_x, 1, mo, sm, o);
      const V41LayerCapture ours = m.decode_layer(l, input, o.pre_mix, o.hash_ids, st);
      {
        V41ForwardResult h;
        if (l + 1 == L) m.head(ours.out, ours.ffn_pre, 1, h);
        g.block(l, o, ours, 1, l + 1 < L ? official_input(os, m.plan(), l + 1) : std::vector<double>{},
                l + 1 < L ? os.layers[static_cast<size_t>(l + 1)].pre_mix : std::vector<double>{}, h.final_collapsed,
                os.final_collapsed, "decode ");
      }
      if (lp.owns_indexer && !o.topk_idxs.empty()) {
        st.topk_idxs.assign(o.topk_idxs.begin(), o.topk_idxs.end());
        st.topk = static_cast<int64_t>(st.topk_idxs.size());
      }
      if (lp.candidate_source && !o.candidates.empty()) st.candidates.assign(o.candidates.begin(), o.candidates.end());
    }
    ++st.pos;
    g.head(os.final_collapsed, os.final_normed, os.logits, 1, "decode ", false);
  }
}

void decode_end_to_end(Gate& g) {
  g.pass = "decode e2e";
  const V41Model& m = g.model;
  const V41DecodeRecord& d = *g.off.decode;
  V41DecodeState st;
  m.forward(g.off.tokens, g.hashing, &st);
  for (size_t s = 0; s < d.steps.size(); ++s) {
    g.step = fmt::format(" step {}", s);
    const V41ForwardResult r = m.decode_step(d.tokens[s], g.hashing, st);
    for (const auto& ours : r.layers) {
      const V41LayerCapture& o = d.steps[s].layers[static_cast<size_t>(ours.layer)];
      if (m.plan()[ours.layer].owns_indexer)
        g.lists(ours.layer, "decode topk_idxs (end to end)", ours.topk_idxs, o.topk_idxs, ours.index_score,
                m.config().window_size, 1);
      g.lists(ours.layer, "decode experts (end to end)", ours.experts, o.experts, {}, 0, 1);
    }
    g.values(-1, "decode logits (end to end)", r.logits, d.steps[s].logits);
  }
}

}  // namespace

void v41_compare_values(V41TensorAgreement& s, std::span<const double> ours, std::span<const double> ref,
                        const std::string& at, int64_t row_len) {
  if (ours.size() != ref.size() || (row_len > 0 && ref.size() % static_cast<size_t>(row_len) != 0)) {
    s.notes.push_back(fmt::format("{} {}: {} values here, {} in the official run", s.kind, at, ours.size(), ref.size()));
    return;
  }
  s.row_scaled = row_len > 0;
  double row_rms = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    if (row_len > 0 && i % static_cast<size_t>(row_len) == 0) {
      double ss = 0;
      for (size_t j = i; j < i + static_cast<size_t>(row_len); ++j) ss += ref[j] * ref[j];
      row_rms = std::sqrt(ss / static_cast<double>(row_len));
    }
    const double o = ours[i], r = ref[i];
    ++s.n;
    if (std::bit_cast<uint32_t>(static_cast<float>(o)) == std::bit_cast<uint32_t>(static_cast<float>(r))) ++s.equal;
    const double d = o == r ? 0.0 : std::fabs(o - r);  // equal infinities (unwritten -inf slots) agree
    if (!std::isfinite(d) && s.nonfinite++ == 0)
      s.nonfinite_at = fmt::format("{}[{}] ours {:.9g} official {:.9g}", at, i, o, r);
    if (d > s.max_abs || std::isnan(d)) {
      s.max_abs = std::isnan(d) ? std::numeric_limits<double>::quiet_NaN() : d;
      s.where = fmt::format("{}[{}] ours {:.9g} official {:.9g}", at, i, o, r);
    }
    s.max_ref = std::max(s.max_ref, std::fabs(r));
    s.max_ulp16 = std::max(s.max_ulp16, ulps(d, row_len > 0 ? std::max(std::fabs(r), row_rms) : r, 8));
    s.max_ulp32 = std::max(s.max_ulp32, ulps(d, r, 24));
  }
}

bool v41_judge_router(const V41Model& model, int64_t layer, std::span<const double> ffn_x, int64_t N,
                      std::span<const int64_t> ours_experts, std::span<const double> ours_weights,
                      std::span<const int64_t> official_experts, std::span<const double> official_weights,
                      const bounds::BoundModel& model_of_bounds, const std::string& placed, V41TensorAgreement& r,
                      V41TensorAgreement* w) {
  const V41Config& c = model.config();
  const std::optional<V41RouterBounds> rb =
      v41_router_bounds(c, ffn_x, N, model.gate_weight(layer), model.gate_bias(layer), model_of_bounds);
  if (!rb) return false;
  const int64_t K = c.n_activated_experts, E = c.n_routed_experts;
  v41_compare_rows(r, ours_experts, official_experts, N, {}, 0);
  r.bound_model = model_of_bounds.name();
  const bool shaped = ours_experts.size() == official_experts.size() && official_experts.size() == static_cast<size_t>(N * K);
  if (r.n > 0 && shaped)
    for (const auto& [side, sel] : {std::pair{"official", official_experts}, std::pair{"ours", ours_experts}})
      for (int64_t t = 0; t < N; ++t) {
        const auto scores = std::span<const bounds::Interval>(rb->biased).subspan(static_cast<size_t>(t * E), static_cast<size_t>(E));
        const auto chosen = sel.subspan(static_cast<size_t>(t * K), static_cast<size_t>(K));
        const bounds::TopkJudgement j = bounds::judge_topk(scores, chosen);
        if (!j.admissible && r.outside++ == 0)
          r.outside_at = j.in < 0 ? fmt::format("{} row {}: {} chose an expert twice or out of range", placed, t, side)
                                  : fmt::format("{} row {}: {} chose expert {} (score at most {:.9g}) over expert {} (at least {:.9g})",
                                                placed, t, side, j.in, scores[static_cast<size_t>(j.in)].hi, j.out,
                                                scores[static_cast<size_t>(j.out)].lo);
        if (j.admissible && j.contested && side == std::string("official") && r.straddled++ == 0)
          r.bound_use_at = fmt::format("{} row {}: experts {} and {} could trade places", placed, t, j.in, j.out);
      }
  v41_judge(r);
  if (!w) return true;
  v41_compare_values(*w, ours_weights, official_weights, placed);
  // Each side's route weights under its own selection.
  auto admissible = [&](std::span<const int64_t> sel) {
    std::vector<bounds::BoundedValue> out;
    for (int64_t t = 0; t < N && sel.size() == static_cast<size_t>(N * K); ++t)
      for (const bounds::Interval& iv :
           v41_route_weight_bounds(c, *rb, t, sel.subspan(static_cast<size_t>(t * K), static_cast<size_t>(K)), model_of_bounds)) {
        const double mid = (iv.lo + iv.hi) / 2;
        out.push_back({mid, iv, bounds::rounded_nearest(mid, mid, 24).lo});
      }
    return out;
  };
  v41_compare_bounds(*w, ours_weights, official_weights, admissible(ours_experts), admissible(official_experts),
                     model_of_bounds.name(), placed);
  v41_judge(*w);
  return true;
}

void v41_judge_head_collapsed(const V41Model& model, std::span<const double> collapsed, int64_t N,
                              std::span<const double> ours_logits, std::span<const double> official_logits,
                              const bounds::BoundModel& model_of_bounds, const std::string& at, V41TensorAgreement& r) {
  const V41Config& c = model.config();
  // The final norm's admissible bf16 values, each an interval, chained into the projection (§5, §6).
  const auto normed = bounds::rmsnorm_bounds(collapsed, c.dim, model.final_norm_weight(), c.norm_eps, model_of_bounds, 8);
  std::vector<double> lo(normed.size()), hi(normed.size());
  for (size_t i = 0; i < normed.size(); ++i) lo[i] = normed[i].admissible.lo, hi[i] = normed[i].admissible.hi;
  v41_compare_values(r, ours_logits, official_logits, at, c.vocab_size);
  v41_compare_bounds(r, ours_logits, official_logits,
                     bounds::linear_bounds(lo, hi, N, c.dim, model.head_weight(), c.vocab_size, model_of_bounds, 24),
                     model_of_bounds.name(), at);
  v41_judge(r);
}

void v41_compare_bounds(V41TensorAgreement& s, std::span<const double> ours, std::span<const double> official,
                        std::span<const bounds::BoundedValue> admissible, const std::string& bound_model,
                        const std::string& at) {
  v41_compare_bounds(s, ours, official, admissible, admissible, bound_model, at);
}

void v41_compare_bounds(V41TensorAgreement& s, std::span<const double> ours, std::span<const double> official,
                        std::span<const bounds::BoundedValue> admissible_ours,
                        std::span<const bounds::BoundedValue> admissible_official, const std::string& bound_model,
                        const std::string& at) {
  s.bound_model = bound_model;
  if (official.size() != admissible_official.size() || ours.size() != admissible_ours.size()) {
    s.notes.push_back(fmt::format("{} {}: {} values here, {} in the official run, {} and {} intervals", s.kind, at,
                                  ours.size(), official.size(), admissible_ours.size(), admissible_official.size()));
    return;
  }
  for (const auto& [side, values, admissible] :
       {std::tuple{"official", official, admissible_official}, std::tuple{"ours", ours, admissible_ours}}) {
    const bounds::BoundJudgement j = bounds::judge_within(values, admissible);
    if (j.outside > 0 && s.outside == 0) {
      const auto i = static_cast<size_t>(j.first_outside);
      const bounds::Interval& b = admissible[i].admissible;
      s.outside_at = fmt::format("{}[{}] {} {:.9g} outside [{:.9g}, {:.9g}] by {:.3g} (exact {:.9g})", at, i, side,
                                 values[i], b.lo, b.hi, j.outside_by, admissible[i].value);
    }
    s.outside += j.outside;
    if (j.max_use_at >= 0 && j.max_use > s.max_bound_use) {
      s.max_bound_use = j.max_use;
      s.bound_use_at = fmt::format("{}[{}] {}", at, j.max_use_at, side);
    }
    if (side == std::string("official")) s.straddled += j.straddled;
  }
}

void v41_compare_rows(V41TensorAgreement& s, std::span<const int64_t> ours, std::span<const int64_t> ref, int64_t N,
                      std::span<const double> scores, int64_t offset) {
  s.rows_compared = true;
  if (ours.size() != ref.size() || N <= 0 || ref.size() % static_cast<size_t>(N) != 0) {
    s.notes.push_back(fmt::format("{}: {} indices here, {} in the official run", s.kind, ours.size(), ref.size()));
    return;
  }
  const size_t k = ref.size() / static_cast<size_t>(N);
  const int64_t T = scores.empty() ? 0 : static_cast<int64_t>(scores.size()) / N;
  for (int64_t t = 0; t < N; ++t) {
    const auto a = ours.subspan(static_cast<size_t>(t) * k, k), b = ref.subspan(static_cast<size_t>(t) * k, k);
    ++s.n;
    if (std::equal(a.begin(), a.end(), b.begin())) {
      ++s.equal;
      continue;
    }
    const std::set<int64_t> sa(a.begin(), a.end()), sb(b.begin(), b.end());
    auto score = [&](int64_t idx) {
      const int64_t col = idx - offset;
      return idx < 0 || T == 0 || col < 0 || col >= T ? std::string("-")
                                                      : fmt::format("{:.6g}", scores[static_cast<size_t>(t * T + col)]);
    };
    std::string only;
    for (int64_t x : sa)
      if (!sb.count(x)) only += fmt::format(" ours-only {} (score {})", x, score(x));
    for (int64_t x : sb)
      if (!sa.count(x)) only += fmt::format(" official-only {} (score {})", x, score(x));
    if (sa == sb) only = " the same set in another order";
    if (s.where.empty()) s.where = fmt::format("row {}:{}", t, only);
    s.notes.push_back(fmt::format("{} layer {} row {}:{}", s.kind, s.layer, t, only));
  }
}

const V41TensorAgreement* V41Agreement::first_failure() const {
  for (const auto& r : rows)
    if (!r.failure.empty()) return &r;
  return nullptr;
}

V41Agreement v41_agreement(const V41Model& model, const V41RunFile& official, const bounds::BoundModel& bounds,
                           bool use_bounds, bool every_row) {
  if (model.regime() != official.regime)
    throw InputError(fmt::format("v41 gate: the model runs the {} regime, the run file is of the {} regime",
                                 v41_regime_name(model.regime()), v41_regime_name(official.regime)));
  if (official.options.topk_ties != V41TopkTies::torch || official.options.index_scores != V41IndexScores::bf16 ||
      official.options.decode_index_k != V41DecodeIndexK::official)
    throw InputError("v41 gate: the reference run file was made with non-default switches; the official code has none");
  if (static_cast<int64_t>(official.result.layers.size()) != model.config().n_layers)
    throw InputError("v41 gate: the run file's layers are not the model's");
  Gate g{model, official, v41_checkpoint_hashing(model.config()), {}, "", official.regime == V41Regime::f64 || !use_bounds ? nullptr : &bounds, ""};
  g.every_row = every_row;
  teacher_forced(g);
  end_to_end(g);
  if (official.decode) {
    decode_teacher_forced(g);
    decode_end_to_end(g);
  }
  return std::move(g.out);
}

V41Agreement v41_agreement_forced(const V41Model& model, const V41RunFile& official,
                                  const std::function<V41ForcedLayer(int64_t, const V41SharedAttention&)>& layer,
                                  const bounds::BoundModel& bounds, bool every_row) {
  if (model.regime() != official.regime)
    throw InputError(fmt::format("v41 gate: the model runs the {} regime, the run file is of the {} regime",
                                 v41_regime_name(model.regime()), v41_regime_name(official.regime)));
  if (static_cast<int64_t>(official.result.layers.size()) != model.config().n_layers)
    throw InputError("v41 gate: the run file's layers are not the model's");
  Gate g{model, official, v41_checkpoint_hashing(model.config()), {}, "", official.regime == V41Regime::f64 ? nullptr : &bounds, ""};
  g.every_row = every_row;
  g.engine = true;
  forced_layers(g, [&](int64_t l, V41SharedAttention&, V41SharedAttention& after, V41LayerCache*) {
    V41ForcedLayer f = layer(l, after);
    // What the engine's attention published, as ours publishes it (its index lists and selection read it).
    const LayerPlan& lp = model.plan()[l];
    const V41LayerCapture& a = f.attention;
    if (lp.owns_compressor && !a.compress_kv.empty()) after.compress_kv = a.compress_kv;
    if (lp.owns_index_k && !a.index_k.empty()) after.index_k = a.index_k;
    if (lp.owns_indexer && !a.topk_idxs.empty()) after.topk_idxs = a.topk_idxs;
    if (lp.candidate_source && !a.candidates.empty()) after.candidates = a.candidates;
    return f;
  });
  return std::move(g.out);
}

V41Agreement v41_teacher_forced_traced(const V41Model& model, const V41RunFile& official, const bounds::BoundModel& bounds,
                                       std::vector<V41BoundsRecord>& trace) {
  if (model.regime() != official.regime || official.regime == V41Regime::f64)
    throw InputError("v41 gate: a traced pass needs the run file's regime, bf16 or release (f64 is judged by budgets)");
  if (static_cast<int64_t>(official.result.layers.size()) != model.config().n_layers)
    throw InputError("v41 gate: the run file's layers are not the model's");
  Gate g{model, official, v41_checkpoint_hashing(model.config()), {}, "", &bounds, "", &trace};
  teacher_forced(g);
  return std::move(g.out);
}

V41Checkpoint v41_golden_checkpoint(const V41RunFile& f) {
  if (!f.weight_seed) throw InputError("v41 golden: the run file records no weight seed: not a `ced export` checkpoint");
  V41Checkpoint ck = make_v41_random_checkpoint(v41_builtin_config(f.config.name), *f.weight_seed);
  if (const auto b = f.provenance.find("boost"); b != f.provenance.end()) {
    std::stringstream list(b->second);
    for (std::string item; std::getline(list, item, ',');) apply_v41_boost(ck, item);
  }
  if (const std::string d = v41_weights_digest(ck.weights); d != f.weights_digest)
    throw InputError(fmt::format("v41 golden: the regenerated weights have digest {}, the file's are {}", d,
                                 f.weights_digest));
  return ck;
}

namespace {

// A row within its derived bounds: how much of them it used, and where a rounding boundary lay inside.
std::string bound_verdict(const V41TensorAgreement& r) {
  if (r.rows_compared)
    return fmt::format("admissible ({}){}", r.bound_model,
                       r.straddled ? fmt::format("; {} near-ties, the first at {}", r.straddled, r.bound_use_at) : "");
  if (r.equal == r.n) return fmt::format("bitwise (within bounds: {})", r.bound_model);
  std::string s = fmt::format("within bounds ({}): at most {:.1f} % of an interval used, at {}", r.bound_model,
                              100 * r.max_bound_use, r.bound_use_at);
  if (r.straddled > 0 && r.straddled < r.n) s += fmt::format("; {} of {} admit more than one value", r.straddled, r.n);
  return s;
}

}  // namespace

std::string v41_agreement_table(const V41Agreement& a) {
  std::string s = fmt::format("{:<15} {:>5} {:<34} {:>8} {:>9} {:>10} {:>9} {:>9}  {}\n", "pass", "layer", "kind",
                              "values", "bitwise", "max |d|", "ulp bf16", "ulp fp32", "verdict");
  for (const auto& r : a.rows)
    s += fmt::format("{:<15} {:>5} {:<34} {:>8} {:>9.5f} {:>10.3g} {:>9.3g} {:>9.4g}  {}\n", r.pass,
                     r.layer >= 0 ? std::to_string(r.layer) : "-", r.kind, r.n, r.bitwise(), r.max_abs, r.max_ulp16,
                     r.max_ulp32,
                     !r.failure.empty()      ? fmt::format("FAIL: {}; the largest at {}", r.failure, r.where)
                     : !r.bound_model.empty() ? bound_verdict(r)
                     : budget_of(r.kind).kind[0] ? "ok"
                                                 : "reported");
  for (const auto& r : a.rows)
    for (const auto& n : r.notes) s += "  " + n + "\n";
  return s;
}

}  // namespace ced::v41
