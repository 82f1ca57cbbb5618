#include "compare/run_compare.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "model/error.hpp"

namespace ced {
namespace {

TensorDtype dtype_of(const RunResult& r) { return parse_tensor_dtype(r.dtype); }

// Rows of a and b at the positions both have; problems for the rest.
struct Aligned {
  std::vector<double> a, b;
  std::vector<int64_t> positions;
};

Aligned align_rows(const MatD& A, const std::vector<int64_t>& pa, const MatD& B, const std::vector<int64_t>& pb,
                   std::vector<std::string>& problems, const std::string& what) {
  Aligned out;
  std::map<int64_t, int64_t> ib;
  for (size_t i = 0; i < pb.size(); ++i) ib[pb[i]] = int64_t(i);
  int64_t missing = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    auto it = ib.find(pa[i]);
    if (it == ib.end()) {
      ++missing;
      continue;
    }
    out.positions.push_back(pa[i]);
    out.a.insert(out.a.end(), A.row(int64_t(i)).data(), A.row(int64_t(i)).data() + A.cols());
    out.b.insert(out.b.end(), B.row(it->second).data(), B.row(it->second).data() + B.cols());
  }
  if (missing || out.positions.size() != pb.size())
    problems.push_back(fmt::format("{}: positions differ ({} rows vs {}, {} shared)", what, pa.size(), pb.size(),
                                   out.positions.size()));
  return out;
}

// Positions index rows; duplicated or unsorted ones make the alignment
// ambiguous, so they are malformed input (InputError; the loaders refuse
// such files first, docs/spec.md §9 "ascending").
void check_ascending(const std::vector<int64_t>& pos, const std::string& what) {
  for (size_t i = 1; i < pos.size(); ++i)
    if (pos[i] <= pos[i - 1])
      throw InputError(fmt::format("{}: positions are not strictly ascending at index {} ({} after {})", what, i,
                                   pos[i], pos[i - 1]));
}

// docs/spec.md §8.3 near-ties between two stored selections: what each side
// stored (§9.1) at the rows both have.
struct ScoredRows {
  int64_t k = 0;
  std::vector<int64_t> t_ids, r_ids;            // [P, k]
  std::vector<double> t_scores, r_scores;       // [P, k]
  std::vector<double> r_kth, t_left, r_left;    // [P]

  void add(const LayerCapture& t, int64_t ti, const LayerCapture& r, int64_t ri) {
    auto put = [](auto& v, const auto& row) { v.insert(v.end(), row.data(), row.data() + row.size()); };
    put(t_ids, t.topk.row(ti));
    put(r_ids, r.topk.row(ri));
    put(t_scores, t.topk_scores.row(ti));
    put(r_scores, r.topk_scores.row(ri));
    r_kth.push_back(r.kth_score[size_t(ri)]);
    t_left.push_back(t.left_out_score[size_t(ti)]);
    r_left.push_back(r.left_out_score[size_t(ri)]);
  }
  // The score `ids` (one side's row) stored for `entry`; NaN if not chosen there.
  double score_in(const std::vector<int64_t>& ids, const std::vector<double>& scores, int64_t row,
                  int64_t entry) const {
    for (int64_t x = row * k; x < (row + 1) * k; ++x)
      if (ids[size_t(x)] == entry) return scores[size_t(x)];
    return std::numeric_limits<double>::quiet_NaN();
  }
  // The reference's score of an entry: stored when the reference chose it;
  // else not stored, but at most its best left-out score, and estimated as
  // the smaller of that and the test's own score of it.
  SelectionScores scores() const {
    SelectionScores s;
    s.score = [this](int64_t row, int64_t entry) {
      const double r = score_in(r_ids, r_scores, row, entry);
      if (!std::isnan(r)) return r;
      const double t = score_in(t_ids, t_scores, row, entry), bound = r_left[size_t(row)];
      return std::isnan(t) ? bound : std::min(bound, t);  // NaN bound (nothing left out) stays NaN
    };
    s.kth_score = [this](int64_t row) { return r_kth[size_t(row)]; };
    s.tie_possible = [this](int64_t row, int64_t, bool in_t) {
      return !std::isnan(in_t ? r_left[size_t(row)] : t_left[size_t(row)]);
    };
    return s;
  }
};

bool bits_equal(const std::vector<double>& a, const std::vector<double>& b) {
  // data() of an empty vector may be null, which memcmp must not get.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

}  // namespace

std::string TensorDiff::where(int64_t flat) const {
  if (flat < 0 || positions.empty() || !comparison.tensor) return "-";
  const int64_t cols = comparison.tensor->shape.size() == 2 ? comparison.tensor->shape[1] : 1;
  return fmt::format("position {}, column {}", positions[size_t(flat / cols)], flat % cols);
}

std::string TensorDiff::worst() const {
  if (verdict.pass || verdict.violations.empty()) return "-";
  const std::string& v = verdict.violations.front().threshold;
  auto row = [&](int64_t i) {
    return i >= 0 && size_t(i) < positions.size() ? fmt::format("position {}", positions[size_t(i)]) : std::string("-");
  };
  if (const auto& c = comparison.tensor) {
    if (v == "nan") {
      const int64_t a = c->t_nonfinite.first_nan, b = c->r_nonfinite.first_nan;
      return where(a < 0 ? b : b < 0 ? a : std::min(a, b));
    }
    if (v == "inf_mismatch") return where(c->first_inf_mismatch);
    if (v == "atol") return where(c->first_mismatch.flat);
    if (v == "max_ulp") return where(c->max_ulp_at.flat);
    if (v == "max_rel_l2" || v == "max_nmse" || v == "min_cosine") return where(c->max_abs.flat);
  }
  if (const auto& l = comparison.logits) {
    if (v == "max_kl" || v == "max_kl_mean") return row(l->max_kl_row);
    if (v == "max_kl_p99") return row(l->kl_distribution.p99_row);
    if (v == "max_kl_p999") return row(l->kl_distribution.p999_row);
    if (v == "greedy_top_n") return row(l->greedy.step);
    if (v == "min_top1") return row(l->first_top1_disagreement);
    if (v == "min_top5") return row(l->min_topk_overlap_row);
  }
  if (const auto& s = comparison.selection) {
    if (v == "min_jaccard") return row(s->min_jaccard_row);
    if (v == "near_tie") return row(s->worst_gap_row);
    if (v == "invalid_selection") return "-";
  }
  return "-";
}

bool RunDiff::pass() const {
  if (!problems.empty()) return false;
  for (const auto& t : tensors)
    if (!t.verdict.pass) return false;
  return true;
}

RunDiff diff_runs(const std::string& run, const RunResult& t, const RunResult& r, const Policy& policy,
                  const CalibrationFor& cal) {
  RunDiff d;
  d.run = run;
  const TensorDtype dt = dtype_of(t) == dtype_of(r) ? dtype_of(t) : TensorDtype::F32;
  auto calib = [&](const std::string& name) { return cal ? cal(name) : std::optional<Calibration>{}; };
  for (const RunResult* x : {&t, &r}) {
    const std::string side = x == &t ? "run under test" : "reference";
    check_ascending(x->positions, fmt::format("runs/{} ({})", run, side));
    if (x->logits.rows() != int64_t(x->positions.size()))
      throw InputError(fmt::format("runs/{} ({}): {} logits rows for {} positions", run, side, x->logits.rows(),
                                   x->positions.size()));
    for (const auto& cap : x->layers) {
      check_ascending(cap.positions, fmt::format("runs/{}/layers/{} ({})", run, cap.layer, side));
      // rows are indexed by position below: a count that differs is malformed
      if (cap.out.rows() != int64_t(cap.positions.size()) ||
          (cap.has_topk && cap.topk.rows() != int64_t(cap.positions.size())))
        throw InputError(fmt::format("runs/{}/layers/{} ({}): {} positions, {} out rows, {} topk rows", run,
                                     cap.layer, side, cap.positions.size(), cap.out.rows(), cap.topk.rows()));
    }
  }
  // The attributes that define the request (docs/spec.md §9) must agree: two runs of
  // different requests are not comparable, even where their tensors are.
  // backend and dtype may differ (that is what a diff compares).
  auto attr = [&](const char* key, const std::string& a, const std::string& b) {
    if (a != b) d.problems.push_back(fmt::format("runs/{}: attribute {} is {} vs {}", run, key, a, b));
  };
  attr("mode", mode_name(t.mode), mode_name(r.mode));
  attr("replay", t.replay.str(), r.replay.str());
  attr("n_prompt", std::to_string(t.n_prompt), std::to_string(r.n_prompt));
  attr("n_replay", std::to_string(t.n_replay), std::to_string(r.n_replay));
  attr("replay_start", std::to_string(t.replay_start), std::to_string(r.replay_start));
  attr("prefix_len", std::to_string(t.prefix_len), std::to_string(r.prefix_len));
  attr("decode_steps", std::to_string(t.decode_steps), std::to_string(r.decode_steps));
  {
    TensorDiff td;
    td.name = fmt::format("runs/{}/logits", run);
    const Aligned al = align_rows(t.logits, t.positions, r.logits, r.positions, d.problems, td.name);
    const std::vector<int64_t> shape = {int64_t(al.positions.size()), t.logits.cols()};
    if (t.logits.cols() != r.logits.cols()) {
      d.problems.push_back(fmt::format("{}: vocab {} vs {}", td.name, t.logits.cols(), r.logits.cols()));
    } else {
      const Thresholds th = policy.thresholds_for(td.name, calib(td.name));
      td.comparison.tensor = compare_tensors(al.a, al.b, shape, th, dt);
      td.comparison.logits = compare_logits(al.a, al.b, shape, th.greedy_top_n.value_or(kGreedyTopN));
      td.greedy_gated = th.greedy_top_n.has_value();
      td.verdict = judge(policy, td.name, td.comparison, calib(td.name));
      td.bitwise_equal = bits_equal(al.a, al.b);
      td.positions = al.positions;
      d.tensors.push_back(std::move(td));
    }
  }
  // Layers align by layer number (a capture may hold any subset of layers);
  // a layer, or a layer's selection, captured on one side only is a problem.
  std::map<int64_t, std::pair<const LayerCapture*, const LayerCapture*>> layers;
  for (const auto& a : t.layers) layers[a.layer].first = &a;
  for (const auto& b : r.layers) layers[b.layer].second = &b;
  for (const auto& [l, ab] : layers) {
    const std::string lname = fmt::format("runs/{}/layers/{}", run, l);
    if (!ab.first || !ab.second) {
      d.problems.push_back(fmt::format("{}: captured in the {} only", lname, ab.first ? "run under test" : "reference"));
      if (d.first_divergent_layer < 0) d.first_divergent_layer = l;
      if (d.first_inexact_layer < 0) d.first_inexact_layer = l;
      continue;
    }
    const LayerCapture &a = *ab.first, &b = *ab.second;
    bool out_fail = false, out_inexact = false;
    if (a.out.cols() != b.out.cols()) {
      d.problems.push_back(fmt::format("{}/out: {} columns vs {}", lname, a.out.cols(), b.out.cols()));
      out_fail = out_inexact = true;
    } else {
      TensorDiff out;
      out.layer = l;
      out.name = lname + "/out";
      const Aligned al = align_rows(a.out, a.positions, b.out, b.positions, d.problems, out.name);
      const std::vector<int64_t> shape = {int64_t(al.positions.size()), a.out.cols()};
      out.comparison.tensor = compare_tensors(al.a, al.b, shape, policy.thresholds_for(out.name, calib(out.name)), dt);
      out.verdict = judge(policy, out.name, out.comparison, calib(out.name));
      out.bitwise_equal = bits_equal(al.a, al.b);
      out.positions = al.positions;
      out_fail = !out.verdict.pass || al.positions.size() != a.positions.size() ||
                 al.positions.size() != b.positions.size();
      out_inexact = !out.bitwise_equal;
      d.tensors.push_back(std::move(out));
    }
    bool sel_fail = false, sel_inexact = false;
    if (a.has_topk != b.has_topk) {
      d.problems.push_back(
          fmt::format("{}/topk: stored in the {} only", lname, a.has_topk ? "run under test" : "reference"));
      sel_fail = sel_inexact = true;
    } else if (a.has_topk && a.topk.cols() != b.topk.cols()) {
      d.problems.push_back(fmt::format("{}/topk: {} columns vs {}", lname, a.topk.cols(), b.topk.cols()));
      sel_fail = sel_inexact = true;
    } else if (a.has_topk) {
      TensorDiff sel;
      sel.layer = l;
      sel.name = lname + "/topk";
      // rows at shared positions (the positions are out's; align_rows above
      // reported any that differ)
      std::vector<int64_t> ta, tb;
      const bool scored = a.has_scores && b.has_scores;
      ScoredRows sr;
      sr.k = a.topk.cols();
      std::map<int64_t, int64_t> ib;
      for (size_t i = 0; i < b.positions.size(); ++i) ib[b.positions[i]] = int64_t(i);
      for (size_t i = 0; i < a.positions.size(); ++i) {
        auto it = ib.find(a.positions[i]);
        if (it == ib.end()) continue;
        sel.positions.push_back(a.positions[i]);
        ta.insert(ta.end(), a.topk.row(int64_t(i)).data(), a.topk.row(int64_t(i)).data() + a.topk.cols());
        tb.insert(tb.end(), b.topk.row(it->second).data(), b.topk.row(it->second).data() + b.topk.cols());
        if (scored) sr.add(a, int64_t(i), b, it->second);
      }
      if (!scored)
        sel.near_tie_untested = fmt::format("the {} has no index scores (a version-1 file)",
                                            !a.has_scores && !b.has_scores ? "run under test and the reference"
                                            : !a.has_scores                ? "run under test"
                                                                           : "reference");
      const std::vector<int64_t> shape2 = {int64_t(sel.positions.size()), a.topk.cols()};
      const SelectionScores scores = sr.scores();
      sel.comparison.selection =
          compare_selections(ta, tb, shape2, policy.thresholds_for(sel.name), scored ? &scores : nullptr);
      sel.verdict = judge(policy, sel.name, sel.comparison);
      sel.bitwise_equal = ta == tb;
      sel_fail = !sel.verdict.pass;
      sel_inexact = !sel.bitwise_equal;
      d.tensors.push_back(std::move(sel));
    }
    if (d.first_divergent_layer < 0 && (out_fail || sel_fail)) d.first_divergent_layer = l;
    if (d.first_inexact_layer < 0 && (out_inexact || sel_inexact)) d.first_inexact_layer = l;
  }
  return d;
}

std::map<std::string, Calibration> calibrate_runs(const std::string& run, const RunResult& f32, const RunResult& f64) {
  std::map<std::string, Calibration> cal;
  std::vector<std::string> ignored;
  auto put = [&](const std::string& name, const MatD& A, const std::vector<int64_t>& pa, const MatD& B,
                 const std::vector<int64_t>& pb) {
    const Aligned al = align_rows(A, pa, B, pb, ignored, name);
    const TensorCompare tc =
        compare_tensors(al.a, al.b, {int64_t(al.positions.size()), A.cols()}, Thresholds{}, TensorDtype::F32);
    cal[name] = calibration_of(tc);
  };
  put(fmt::format("runs/{}/logits", run), f32.logits, f32.positions, f64.logits, f64.positions);
  for (size_t l = 0; l < std::min(f32.layers.size(), f64.layers.size()); ++l)
    put(fmt::format("runs/{}/layers/{}/out", run, l), f32.layers[l].out, f32.layers[l].positions, f64.layers[l].out,
        f64.layers[l].positions);
  return cal;
}

std::string format_run_diff(const RunDiff& d, bool verbose) {
  std::string s = fmt::format("run {}: {}\n", d.run, d.pass() ? "PASS" : "FAIL");
  for (const auto& p : d.problems) s += fmt::format("  problem: {}\n", p);
  s += fmt::format("  {:<34} {:>6} {:>11} {:>11} {:>11} {:>9} {:>8}  {}\n", "tensor", "verdict", "max_abs", "rel_l2",
                   "max_ulp", "mismatch", "nan/inf", "worst element (t vs r)");
  for (const auto& t : d.tensors) {
    if (!verbose && t.verdict.pass && t.layer >= 0) continue;
    const std::string short_name = t.name.substr(t.name.find('/', 5) + 1);
    if (t.comparison.selection) {
      const auto& c = *t.comparison.selection;
      const std::string at = c.min_jaccard_row >= 0 && size_t(c.min_jaccard_row) < t.positions.size()
                                 ? std::to_string(t.positions[size_t(c.min_jaccard_row)])
                                 : "-";
      s += fmt::format("  {:<34} {:>6} jaccard mean {:.4f} min {:.4f} (position {}), {} differing entries\n",
                       short_name, t.verdict.pass ? "ok" : "FAIL", c.mean_jaccard, c.min_jaccard, at, c.differing);
      // docs/spec.md §8.3: each differing entry a near-tie or a real disagreement
      if (c.scored && c.differing > 0) {
        s += fmt::format("  {:<34} {:>6} {} near-ties, {} real disagreements (near_tie {:g})", "", "", c.near_ties,
                         c.real_disagreements, c.near_tie);
        if (c.worst_gap_row >= 0 && size_t(c.worst_gap_row) < t.positions.size())
          s += fmt::format("; worst gap {:.6g} at position {}, entry {}", c.worst_gap,
                           t.positions[size_t(c.worst_gap_row)], c.worst_gap_entry);
        s += "\n";
      } else if (c.differing > 0) {
        s += fmt::format("  {:<34} {:>6} near-tie test not possible: {}\n", "", "", t.near_tie_untested);
      }
    } else if (t.comparison.tensor) {
      const auto& c = *t.comparison.tensor;
      const std::string where =
          c.max_abs.flat >= 0 ? fmt::format("{}: {:.17g} vs {:.17g}", t.where(c.max_abs.flat), c.max_abs.t, c.max_abs.r)
                              : "-";
      s += fmt::format("  {:<34} {:>6} {:>11.3e} {:>11.3e} {:>11} {:>9} {:>3}/{:<4}  {}\n", short_name,
                       t.verdict.pass ? (t.bitwise_equal ? "equal" : "ok") : "FAIL", c.max_abs_err, c.rel_l2,
                       c.max_ulp, c.mismatches, c.t_nonfinite.nan, c.t_nonfinite.inf, where);
      if (t.comparison.logits) {
        const auto& lc = *t.comparison.logits;
        s += fmt::format("  {:<34} {:>6} KL max {:.3e} (row {}), top-1 {}/{}, top-5 overlap {:.4f}\n", "", "",
                         lc.max_kl, lc.max_kl_row, lc.top1_agree, lc.rows, lc.topk_overlap);
        // docs/spec.md §8.7: the whole distribution beside the worst row, and the
        // greedy rule on the rows' argmaxes (teacher-forced: each row saw the prompt's token).
        s += fmt::format("  {:<34} {:>6} {}\n", "", "", summary(lc.kl_distribution, t.positions));
        s += fmt::format("  {:<34} {:>6} teacher-forced {} ({})\n", "", "", summary(lc.greedy, t.positions, "t", "r"),
                         t.greedy_gated ? "gated by greedy_top_n" : "not gated");
      }
    }
    if (!t.verdict.pass) {
      s += fmt::format("      worst: {}, {}\n", t.name, t.worst());
      for (const auto& line : t.verdict.lines()) s += fmt::format("      {}\n", line);
    }
  }
  // Passing selections that differ are said even without -v: how their
  // differences were classified (docs/spec.md §8.3), or that they could not be.
  for (const auto& t : d.tensors) {
    if (verbose || !t.verdict.pass || !t.comparison.selection || t.comparison.selection->differing == 0) continue;
    const auto& c = *t.comparison.selection;
    if (c.scored)
      s += fmt::format("  {}: {} differing entries: {} near-ties, {} real disagreements (near_tie {:g})\n", t.name,
                       c.differing, c.near_ties, c.real_disagreements, c.near_tie);
    else
      s += fmt::format("  {}: {} differing entries; near-tie test not possible: {}\n", t.name, c.differing,
                       t.near_tie_untested);
  }
  if (d.first_divergent_layer >= 0)
    s += fmt::format("  first divergent layer (over tolerance): {}\n", d.first_divergent_layer);
  if (d.first_inexact_layer >= 0) s += fmt::format("  first layer not bitwise equal: {}\n", d.first_inexact_layer);
  return s;
}

std::string run_diffs_json(const std::vector<RunDiff>& diffs) {
  std::string s = "[";
  for (size_t i = 0; i < diffs.size(); ++i) {
    const auto& d = diffs[i];
    s += fmt::format("{}{{\"run\": {}, \"pass\": {}, \"first_divergent_layer\": {}, \"first_inexact_layer\": {}, "
                     "\"problems\": [",
                     i ? ", " : "", json_string(d.run), d.pass() ? "true" : "false", d.first_divergent_layer,
                     d.first_inexact_layer);
    for (size_t k = 0; k < d.problems.size(); ++k) s += (k ? ", " : "") + json_string(d.problems[k]);
    s += "], \"tensors\": [";
    for (size_t k = 0; k < d.tensors.size(); ++k) {
      const auto& t = d.tensors[k];
      s += fmt::format("{}{{\"name\": {}, \"bitwise_equal\": {}, \"verdict\": {}", k ? ", " : "", json_string(t.name),
                       t.bitwise_equal ? "true" : "false", to_json(t.verdict));
      if (t.comparison.tensor) s += ", \"metrics\": " + to_json(*t.comparison.tensor);
      if (t.comparison.logits)
        s += fmt::format(", \"logits\": {}, \"greedy_gated\": {}", to_json(*t.comparison.logits),
                         t.greedy_gated ? "true" : "false");
      if (t.comparison.selection) s += ", \"selection\": " + to_json(*t.comparison.selection);
      if (!t.near_tie_untested.empty()) s += ", \"near_tie_untested\": " + json_string(t.near_tie_untested);
      s += "}";
    }
    s += "]}";
  }
  return s + "]";
}

Policy exact_policy() {
  return parse_policy_toml(R"([[rule]]
pattern = "**"
reason = "ced diff without --policy: any difference is reported as a failure"
atol = 0
rtol = 0
min_jaccard = 1
)",
                           "<exact>");
}

}  // namespace ced
