// docs/sound-bounds.md §10: the power of the derived bounds, as a table a user reads: for each kind the
// gate judges by bounds in its teacher-forced pass, the smallest perturbation of our side it catches on a
// golden file. The gate's pass runs once (v41_teacher_forced_traced), keeping our values, selections and
// the intervals each was judged against; then each perturbation is planted on our side and judged again:
//   (a) one value scaled by 1 + 2^-k (rounded to the kind's format), k raised from 1 until one passes:
//       the value of the largest magnitude and the median one, at the first layer the kind is judged;
//   (b) one weight element scaled by 1 + 2^-k in the model (wq_b, wo_b, the shared expert's w2, attn_norm,
//       the final norm, the head), our op run again on the official's input, k likewise;
//   (c) one quantization block of a QDQ'd tensor one scale exponent up (its values times 2): caught or not;
//   (d) one chosen entry of a selection replaced by the lowest-scoring one left out: caught or not;
//   (e) one slot of the decode seed's window ring holding another position's row: caught or not.
// A file with decode steps prints its decode seed's kinds only (the prefill's are the other files'). A
// test-only driver:
//   v41_bounds_power golden/v41/wide-fp8-n33.h5 ... > docs/results/v41-bounds-power.md (its table)
// Exit 0, 2 on bad input.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <set>
#include <vector>

#include "compare/op_bounds.hpp"
#include "model/error.hpp"
#include "checks/v41/agreement.hpp"
#include "reference/v41/forward_ops.hpp"
#include "reference/v41/forward_weights.hpp"

namespace {

using namespace ced;
using namespace ced::v41;

double fp32(double x) { return static_cast<double>(static_cast<float>(x)); }
double bf16(double x) { return bounds::rounded_nearest(fp32(x), fp32(x), 8).lo; }

// The format a kind's values are reported in: fp32 for the hc mixes, the route weights, the logits and the
// compressor's pending rows; bf16 for every other.
int bits_of(const std::string& kind) {
  for (const char* k : {"attn_pre", "attn_post", "ffn_pre", "ffn_post", "expert_weights (forced x)", "logits (forced normed)",
                        "decode seed kv_state", "decode seed score_state"})
    if (kind == k) return 24;
  return 8;
}
double in_format(double x, int bits) { return bits == 24 ? fp32(x) : bf16(x); }

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
std::string verdict(bool caught) { return caught ? "caught" : "not caught"; }

// Where an element of a record's tensor lies: [row, column] in rows of its compared length (else [i]).
std::string place(const V41BoundsRecord& r, size_t i) {
  return r.row_len > 0 ? fmt::format("[{}, {}]", i / static_cast<size_t>(r.row_len), i % static_cast<size_t>(r.row_len))
                       : fmt::format("[{}]", i);
}
std::string layer_of(const V41BoundsRecord& r) { return r.layer >= 0 ? fmt::format("layer {}", r.layer) : "the head"; }

// The finite non-zero element of the largest magnitude and the median one (by magnitude); none: npos.
std::pair<size_t, size_t> largest_and_median(std::span<const double> v) {
  std::vector<size_t> at;
  for (size_t i = 0; i < v.size(); ++i)
    if (std::isfinite(v[i]) && v[i] != 0) at.push_back(i);
  if (at.empty()) return {SIZE_MAX, SIZE_MAX};
  std::stable_sort(at.begin(), at.end(), [&](size_t a, size_t b) { return std::fabs(v[a]) < std::fabs(v[b]); });
  return {at.back(), at[at.size() / 2]};
}
// The column of the largest magnitude in the last `n` values of v.
int64_t largest_of_last(std::span<const double> v, int64_t n) {
  const auto last = v.last(static_cast<size_t>(n));
  int64_t j = 0;
  for (int64_t q = 1; q < n; ++q)
    if (std::fabs(last[static_cast<size_t>(q)]) > std::fabs(last[static_cast<size_t>(j)])) j = q;
  return j;
}
// The element of row j of a weight [out, in] of the largest magnitude.
int64_t largest_in_row(std::span<const double> w, int64_t in, int64_t j) {
  int64_t i = 0;
  for (int64_t q = 1; q < in; ++q)
    if (std::fabs(w[static_cast<size_t>(j * in + q)]) > std::fabs(w[static_cast<size_t>(j * in + i)])) i = q;
  return i;
}

// One weight element of the model scaled by `factor` while `run` runs (a linear's kernel copy packed again),
// then restored. The model's weights are non-const objects behind its const accessors.
template <typename Run>
auto with_weight(const V41Model& m, std::span<const double> weights, size_t at, V41Linear* lin, double factor, Run run) {
  double& w = const_cast<double&>(weights[at]);
  const double kept = w;
  const fwd::Arith a(m.regime());
  w = kept * factor;
  if (lin) fwd::pack_linear(a, *lin);
  auto out = run();
  w = kept;
  if (lin) fwd::pack_linear(a, *lin);
  return out;
}

// wo_b's input at the last position (its act_quant in the release regime), read through the output
// projection with wo_b made the identity on its first `in` outputs (a power-of-two scale's codes exact);
// empty where dim < in.
std::vector<double> wo_b_input(const V41Model& m, V41Linear& wo_b, int64_t layer, std::span<const double> attn_o, int64_t N) {
  if (wo_b.out < wo_b.in) return {};
  const std::vector<double> kept = wo_b.w;
  std::fill(wo_b.w.begin(), wo_b.w.end(), 0.0);
  for (int64_t i = 0; i < wo_b.in; ++i) wo_b.w[static_cast<size_t>(i * wo_b.in + i)] = 1;
  const fwd::Arith a(m.regime());
  fwd::pack_linear(a, wo_b);
  const std::vector<double> y = m.attention_output(layer, attn_o, N);
  wo_b.w = kept;
  fwd::pack_linear(a, wo_b);
  return {y.end() - wo_b.out, y.end() - wo_b.out + wo_b.in};
}

struct Printer {
  std::string file;
  void operator()(const std::string& kind, const std::string& what, const std::string& result) const {
    fmt::print("| {} | {} | {} | {} |\n", file, kind, what, result);
  }
};

// (a): the value of the largest magnitude and the median one, each scaled by 1 + 2^-k in the kind's format.
void scaled_values(const Printer& print, const V41BoundsRecord& r) {
  const auto [big, mid] = largest_and_median(r.ours);
  if (big == SIZE_MAX) return print(r.kind, fmt::format("{}: one value scaled", layer_of(r)), "not planted: every value is 0");
  const int bits = bits_of(r.kind);
  auto power = [&](size_t i) {
    if (!r.admissible[i].admissible.contains(r.ours[i])) return std::string("ours outside before planting");
    return cell(smallest_caught([&](double e) { return !r.admissible[i].admissible.contains(in_format(r.ours[i] * (1 + e), bits)); }));
  };
  print(r.kind,
        fmt::format("{}: one value scaled by 1 + 2^-k ({}), the largest magnitude {} / the median {}", layer_of(r),
                    bits == 24 ? "fp32" : "bf16", place(r, big), place(r, mid)),
        fmt::format("{} / {}", power(big), power(mid)));
}

// (c): the quantization block of the largest value one scale exponent up.
void block_scale(const Printer& print, const V41BoundsRecord& r, int64_t block, const char* format) {
  const size_t big = largest_and_median(r.ours).first;
  if (big == SIZE_MAX) return;
  const size_t first = big - big % static_cast<size_t>(block);
  std::vector<double> v = r.ours;
  for (size_t i = first; i < first + static_cast<size_t>(block); ++i) v[i] *= 2;
  print(r.kind,
        fmt::format("{}: one {} block's scale one exponent up (its {} values {} .. times 2)", layer_of(r), format, block,
                    place(r, first)),
        verdict(fails(v, r.admissible)));
}

// (d): in the last row (of the first layer) with an entry left out that some score admits, the lowest-scoring
// chosen entry replaced by the lowest-scoring one left out.
void replaced_entry(const Printer& print, const std::vector<V41BoundsRecord>& trace, const std::string& kind) {
  auto mid = [](const bounds::Interval& s) { return (s.lo + s.hi) / 2; };
  for (const V41BoundsRecord& r : trace) {
    if (r.kind != kind || !r.selection() || r.rows == 0 || r.scores.size() % static_cast<size_t>(r.rows) != 0) continue;
    const int64_t n = static_cast<int64_t>(r.scores.size()) / r.rows;
    for (int64_t t = r.rows - 1; t >= 0; --t) {
      const auto score = std::span<const bounds::Interval>(r.scores).subspan(static_cast<size_t>(t * n), static_cast<size_t>(n));
      const auto row = std::span<const int64_t>(r.chosen).subspan(static_cast<size_t>(t * r.k), static_cast<size_t>(r.k));
      std::set<int64_t> in;
      for (int64_t e : row)
        if (e >= 0) in.insert(e - r.offset);
      int64_t out = -1, low = -1;  // the lowest-scoring entry left out (a finite score) and chosen (its place in the row)
      for (int64_t p = 0; p < n; ++p)
        if (!in.count(p) && score[static_cast<size_t>(p)].hi > -INFINITY && std::isfinite(mid(score[static_cast<size_t>(p)])) &&
            (out < 0 || mid(score[static_cast<size_t>(p)]) < mid(score[static_cast<size_t>(out)])))
          out = p;
      for (int64_t q = 0; q < r.k; ++q) {
        const int64_t p = row[static_cast<size_t>(q)] - r.offset;
        if (row[static_cast<size_t>(q)] >= 0 && p >= 0 && p < n &&
            (low < 0 || mid(score[static_cast<size_t>(p)]) < mid(score[static_cast<size_t>(row[static_cast<size_t>(low)] - r.offset)])))
          low = q;
      }
      if (out < 0 || low < 0) continue;
      if (!r.judge_row(r.chosen, t).admissible)
        return print(kind, fmt::format("layer {} row {}", r.layer, t), "ours inadmissible before planting");
      std::vector<int64_t> sel = r.chosen;
      const int64_t was = sel[static_cast<size_t>(t * r.k + low)] - r.offset;
      sel[static_cast<size_t>(t * r.k + low)] = out + r.offset;
      if (kind.ends_with("experts (forced x)")) std::sort(sel.begin() + t * r.k, sel.begin() + (t + 1) * r.k);
      const bounds::TopkJudgement j = r.judge_row(sel, t);
      return print(kind,
                   fmt::format("layer {}, row {}: the lowest-scoring chosen {} (score {:.6g}) replaced by the lowest-scoring "
                               "left out {} (score {:.6g})",
                               r.layer, t, was, mid(score[static_cast<size_t>(was)]), out, mid(score[static_cast<size_t>(out)])),
                   j.admissible ? (j.contested ? "not caught (a near-tie)" : "not caught") : "caught");
    }
  }
  print(kind, "one chosen entry replaced by one left out",
        "not planted: every row of every layer chooses every entry it sees");
}

// (e): the decode seed's ring slot of the prompt's last position holding the row of the position before it.
void stale_slot(const Printer& print, const V41BoundsRecord& r, int64_t N, int64_t W) {
  if (N < 2 || r.row_len <= 0) return;
  const int64_t s = (N - 1) % W, o = (N - 2) % W, hd = r.row_len;
  std::vector<double> v = r.ours;
  std::copy_n(r.ours.begin() + o * hd, hd, v.begin() + s * hd);
  print(r.kind, fmt::format("{}: slot {} (position {}) holding slot {}'s row (position {})", layer_of(r), s, N - 1, o, N - 2),
        verdict(fails(v, r.admissible)));
}

const V41BoundsRecord* first_of(const std::vector<V41BoundsRecord>& trace, const std::string& kind) {
  for (const auto& r : trace)
    if (r.kind == kind) return &r;
  return nullptr;
}

void table(const std::filesystem::path& p) {
  const V41RunFile f = read_v41_run_file(p);
  const V41Checkpoint ck = v41_golden_checkpoint(f);
  const V41Model m(ck.config, ck.weights, f.regime);
  const V41Config& c = m.config();
  const int64_t N = f.result.N, D = c.dim, V = c.vocab_size, last = N - 1;
  const bounds::BoundModel model;
  std::vector<V41BoundsRecord> trace;
  const V41Agreement gate = v41_teacher_forced_traced(m, f, model, trace);
  if (const V41TensorAgreement* bad = gate.first_failure())
    throw InputError(fmt::format("{}: the gate fails its own golden file at layer {} {}: {}", p.string(), bad->layer,
                                 bad->kind, bad->failure));
  const Printer print{p.filename().string()};
  const bool decode = f.decode.has_value();
  // Each kind once, at the first layer it is judged, in the gate's order.
  std::vector<std::string> kinds;
  for (const auto& r : trace)
    if (std::find(kinds.begin(), kinds.end(), r.kind) == kinds.end() && decode == r.kind.starts_with("decode seed"))
      kinds.push_back(r.kind);
  for (const std::string& kind : kinds) {
    const V41BoundsRecord& r = *first_of(trace, kind);
    if (r.selection()) {
      replaced_entry(print, trace, kind);
      continue;
    }
    scaled_values(print, r);
    if (kind == "attn_kv window (forced x)" || kind == "decode seed window") block_scale(print, r, 32, "FP8");
    if (kind == "compress_kv (forced x)") block_scale(print, r, 16, "FP4");
    if (kind == "index_k (forced x)") block_scale(print, r, 32, "FP4");
    if (kind == "decode seed window") stale_slot(print, r, N, c.window_size);
    // (b): a weight element, our op run again on the official's input, judged whole.
    const V41LayerCapture& o = f.result.layers[static_cast<size_t>(std::max<int64_t>(r.layer, 0))];
    auto& lw = const_cast<V41LayerWeights&>(m.layer_weights(std::max<int64_t>(r.layer, 0)));
    auto weight = [&](const std::string& what, std::span<const double> w, size_t at, V41Linear* lin,
                      const std::function<std::vector<double>()>& ours) {
      print(kind, what, cell(smallest_caught([&](double e) { return fails(with_weight(m, w, at, lin, 1 + e, ours), r.admissible); })));
    };
    // Row j: the output of the largest magnitude at the last position; its element of the largest term there
    // (of the largest magnitude where the linear's input is not at hand).
    auto linear_weight = [&](const char* name, V41Linear& lin, int64_t j, std::span<const double> input,
                             const std::function<std::vector<double>()>& ours) {
      int64_t i = largest_in_row(lin.w, lin.in, j);
      for (int64_t q = 0; q < lin.in && input.size() == static_cast<size_t>(lin.in); ++q)
        if (std::fabs(input[static_cast<size_t>(q)] * lin.w[static_cast<size_t>(j * lin.in + q)]) >
            std::fabs(input[static_cast<size_t>(i)] * lin.w[static_cast<size_t>(j * lin.in + i)]))
          i = q;
      weight(fmt::format("{}: the {} weight [{}, {}] (the largest output of the last position, {}) scaled by 1 + 2^-k",
                         layer_of(r), name, j, i, input.empty() ? "the row's largest weight" : "its largest term"),
             lin.w, static_cast<size_t>(j * lin.in + i), &lin, ours);
    };
    if (kind == "attn_q (forced x)" && r.layer == 0) {
      // wq_b's input of the last position: q_norm(wq_a(x)).
      const fwd::Arith a(m.regime());
      std::vector<double> qr(static_cast<size_t>(c.q_lora_rank));
      fwd::linear_w(a, std::span<const double>(o.attn_x).subspan(static_cast<size_t>(last * D), static_cast<size_t>(D)), 1,
                    lw.wq_a, qr, true);
      fwd::rmsnorm(a, qr, c.q_lora_rank, lw.q_norm, c.norm_eps);
      linear_weight("wq_b", lw.wq_b, largest_of_last(r.ours, c.n_heads * c.head_dim), qr, [&] {
        V41SharedAttention shared;
        V41LayerCapture cap;
        m.attention(0, o.attn_x, N, shared, cap);
        return cap.attn_q;
      });
    }
    if (kind == "attn_out (forced o)")
      linear_weight("wo_b", lw.wo_b, largest_of_last(r.ours, D), wo_b_input(m, lw.wo_b, r.layer, o.attn_o, N), [&] { return m.attention_output(r.layer, o.attn_o, N); });
    if (kind == "ffn_out (forced x)") {
      // w2's input of the last position: the clamped SwiGLU of w1 and w3 on x, bf16.
      const fwd::Arith a(m.regime());
      const int64_t I = lw.shared.w1.out;
      const auto x = std::span<const double>(o.ffn_x).subspan(static_cast<size_t>(last * D), static_cast<size_t>(D));
      std::vector<double> g(static_cast<size_t>(I)), u(g.size()), h(g.size());
      fwd::linear_w(a, x, 1, lw.shared.w1, g, true);
      fwd::linear_w(a, x, 1, lw.shared.w3, u, true);
      fwd::swiglu(a, g, u, c.swiglu_limit, nullptr, h);
      for (double& v : h) v = a.bf(v);
      linear_weight("shared expert's w2", lw.shared.w2, largest_of_last(r.ours, D), h, [&] {
        V41LayerCapture cap;
        return m.moe(r.layer, o.ffn_x, N, cap);
      });
    }
    if (kind == "attn_x" && r.layer == 0) {
      // Our collapse of our streams after Engram (the `in` judged before), then attn_norm: the layer's own ops.
      const V41BoundsRecord* ours_in = m.plan()[0].engram ? first_of(trace, "in") : nullptr;
      const fwd::Arith a(m.regime());
      const std::vector<double> collapsed =
          fwd::hc_pre(a, ours_in && ours_in->layer == 0 ? std::span<const double>(ours_in->ours) : std::span<const double>(o.in),
                      o.pre_mix, N, c.hc_mult, D);
      const std::function<std::vector<double>()> normed = [&] {
        std::vector<double> y = collapsed;
        fwd::rmsnorm(a, y, D, lw.attn_norm, c.norm_eps);
        return y;
      };
      if (normed() != r.ours) throw InputError(fmt::format("{}: attn_x computed again is not the gate's", p.string()));
      const int64_t i = largest_of_last(r.ours, D);
      weight(fmt::format("layer 0: the attn_norm weight {} (the last position's largest output's; every position) "
                         "scaled by 1 + 2^-k",
                         i),
             lw.attn_norm, static_cast<size_t>(i), nullptr, normed);
    }
    if (kind == "final_normed (forced collapsed)" || kind == "logits (forced normed)") {
      // The head's: the top logit of the last position, and the element of its row with the largest term.
      const auto row = std::span<const double>(f.result.logits).subspan(static_cast<size_t>(last * V), static_cast<size_t>(V));
      const auto j = static_cast<int64_t>(std::max_element(row.begin(), row.end()) - row.begin());
      const auto x = [&](int64_t d) { return f.result.final_normed[static_cast<size_t>(last * D + d)]; };
      const auto hw = m.head_weight();
      int64_t i = 0;
      for (int64_t d = 1; d < D; ++d)
        if (std::fabs(x(d) * hw[static_cast<size_t>(j * D + d)]) > std::fabs(x(i) * hw[static_cast<size_t>(j * D + i)])) i = d;
      if (kind == "final_normed (forced collapsed)")
        weight(fmt::format("the final norm weight {} (every position) scaled by 1 + 2^-k", i), m.final_norm_weight(),
               static_cast<size_t>(i), nullptr, [&] {
                 V41ForwardResult h;
                 m.head_collapsed(f.result.final_collapsed, N, h);
                 return h.final_normed;
               });
      else
        weight(fmt::format("the head weight [{}, {}] (the top logit of the last position, its largest term) scaled by 1 + 2^-k",
                           j, i),
               hw, static_cast<size_t>(j * D + i), nullptr, [&] {
                 std::vector<double> y(static_cast<size_t>(N * V));
                 fwd::linear(fwd::Arith(m.regime()), f.result.final_normed, N, D, m.head_weight(), V, y, false);
                 return y;
               });
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: v41_bounds_power FILE.h5...\n");
    return 2;
  }
  try {
    fmt::print("| golden file | kind | planted on our side | smallest caught |\n|---|---|---|---|\n");
    for (int a = 1; a < argc; ++a) table(argv[a]);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "v41_bounds_power: {}\n", e.what());
    return 2;
  }
}
