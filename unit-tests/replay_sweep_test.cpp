// The replay-error sweep (`ced replay-error`, docs/spec.md §4–§6): each row is recomputed here from runs of
// the reference backend made directly, with the metrics the plain way (long double: rel L2, max abs,
// bitwise equality, and of logits KL, top-1 and top-5), so a slip in
// which positions, layers, steps or prefixes the sweep compares, or in its bookkeeping, fails; and
// the CSV, the table and the SVG carry every row. Written for the mutation pass (docs/mutation.md).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"
#include "models/lab/weights.hpp"
#include "backends/registry.hpp"
#include "checks/replay_sweep.hpp"

using namespace ced;
using namespace ced::prop;

namespace {

struct Plain {
  double rel_l2 = 0, max_abs = 0;
  bool exact = false;
};

// rel L2 = ||t - r|| / ||r|| and max |t - r|, in long double (docs/spec.md §8), no shared helpers.
Plain plain(const double* t, const double* r, int64_t n) {
  long double d2 = 0, r2 = 0, m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const long double d = (long double)t[i] - (long double)r[i];
    d2 += d * d;
    r2 += (long double)r[i] * r[i];
    m = std::max(m, std::fabs(d));
  }
  Plain p;
  p.rel_l2 = r2 > 0 ? double(std::sqrt(d2 / r2)) : (d2 == 0 ? 0.0 : HUGE_VAL);
  p.max_abs = double(m);
  p.exact = std::memcmp(t, r, sizeof(double) * size_t(n)) == 0;
  return p;
}

// The indices of the k largest of v, ties ranking the larger index first (docs/spec.md §8.2).
std::vector<int64_t> plain_top(const double* v, int64_t n, int64_t k) {
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return v[a] != v[b] ? v[a] > v[b] : a > b; });
  idx.resize(size_t(std::min(k, n)));
  return idx;
}

// KL(softmax r || softmax t) clamped at 0, top-1 agreement and top-5 overlap / 5 of one finite
// logits row (docs/spec.md §8.2), in long double with no shared helper.
struct PlainLogits {
  long double kl = 0;
  double top1 = 0, top5 = 0;
};
PlainLogits plain_logits(const double* t, const double* r, int64_t n) {
  long double mt = t[0], mr = r[0], zt = 0, zr = 0;
  for (int64_t i = 0; i < n; ++i) mt = std::max<long double>(mt, t[i]), mr = std::max<long double>(mr, r[i]);
  for (int64_t i = 0; i < n; ++i) zt += std::exp(t[i] - mt), zr += std::exp(r[i] - mr);
  PlainLogits p;
  for (int64_t i = 0; i < n; ++i) {
    const long double log_pr = r[i] - mr - std::log(zr), log_pt = t[i] - mt - std::log(zt);
    p.kl += std::exp(log_pr) * (log_pr - log_pt);
  }
  p.kl = std::max(p.kl, 0.0L);
  const auto tt = plain_top(t, n, 5), tr = plain_top(r, n, 5);
  p.top1 = tt[0] == tr[0] ? 1 : 0;
  int64_t common = 0;
  for (int64_t i : tt) common += std::count(tr.begin(), tr.end(), i);
  p.top5 = double(common) / double(tt.size());
  return p;
}

void expect_row(const DriftRow& row, const double* t, const double* r, int64_t n, const std::string& what,
                bool logits) {
  const Plain p = plain(t, r, n);
  // 1e-12 relative: the sweep sums in double, this in long double; both over at most 97 terms.
  EXPECT_NEAR(row.rel_l2, p.rel_l2, 1e-12 * std::max(1.0, p.rel_l2)) << what;
  EXPECT_NEAR(row.max_abs, p.max_abs, 1e-12 * std::max(1.0, p.max_abs)) << what;
  EXPECT_EQ(row.exact, p.exact) << what;
  if (!logits) return;
  const PlainLogits l = plain_logits(t, r, n);
  // The bounds of unit-tests/metrics_independent_test.cpp: double against long double over 97 terms.
  EXPECT_NEAR(row.kl, double(l.kl), double(1e-13L + 1e-12L * l.kl)) << what;
  EXPECT_EQ(row.top1, l.top1) << what;
  EXPECT_DOUBLE_EQ(row.top5, l.top5) << what;
}

struct Sweep {
  Config c = load_config("tiny");
  Plan p = make_plan(c);
  SweepOptions o;
  std::vector<DriftRow> rows;
  Sweep() {
    o.lengths = {20, 3, 13};  // unsorted on purpose; N < W, N = R, N > R (tiny: W = 4, R = 13)
    o.prefixes = {2, 4, 1000};  // 1000 > N: skipped
    o.decode = 2;
    rows = replay_sweep(c, o);
  }
};

const Sweep& sweep() {
  static const Sweep s;
  return s;
}

}  // namespace

TEST(ReplaySweep, RowsComeInOrderPerLengthThenPerPrefix) {
  const Sweep& s = sweep();
  std::vector<std::string> got;
  for (const DriftRow& r : s.rows)
    got.push_back(r.kind + " " + std::to_string(r.n_prompt) + " " + std::to_string(r.replay) + " " +
                  std::to_string(r.prefix) + " " + std::to_string(r.layer) + " " + std::to_string(r.step));
  std::vector<std::string> want;
  for (int64_t N : {3, 13, 20}) {
    const int64_t B = std::min<int64_t>(N, s.p.W);
    want.push_back("prefill " + std::to_string(N) + " " + std::to_string(B) + " -1 -1 -1");
    for (int k = 0; k < 2; ++k)
      want.push_back("decode " + std::to_string(N) + " " + std::to_string(B) + " -1 -1 " + std::to_string(k));
    for (int64_t l = s.p.E; l < s.p.L; ++l)
      want.push_back("layer " + std::to_string(N) + " " + std::to_string(B) + " -1 " + std::to_string(l) + " -1");
  }
  // Resume at Nr = min(max N, 8W) = 20 from P = 2 and P = 4; P = 1000 > Nr is skipped.
  for (int64_t P : {2, 4}) {
    want.push_back("resume 20 4 " + std::to_string(P) + " -1 -1");
    for (int k = 0; k < 2; ++k) want.push_back("resume-decode 20 4 " + std::to_string(P) + " -1 " + std::to_string(k));
  }
  EXPECT_EQ(got, want);
}

TEST(ReplaySweep, EveryRowMatchesRunsMadeDirectly) {
  const Sweep& s = sweep();
  auto be = make_backend("reference", s.c, 0);
  const auto tokens = make_tokens(0, s.c.vocab_size, 20 + 2);
  const int64_t V = s.c.vocab_size;
  size_t i = 0;
  for (int64_t N : {3, 13, 20}) {
    RunRequest r;
    r.n_prompt = N;
    r.decode_steps = 2;
    r.tokens.assign(tokens.begin(), tokens.begin() + N + 2);
    r.logits = LogitsScope::Last;
    r.capture_layers = true;
    const RunResult exact = be->run(r);
    r.mode = Mode::Ced;
    r.replay = ReplayPolicy::parse("bounded");
    const RunResult bounded = be->run(r);
    ASSERT_LT(i + 3, s.rows.size());
    for (int64_t k = 0; k < 3; ++k, ++i)
      expect_row(s.rows[i], bounded.logits.row(k).data(), exact.logits.row(k).data(), V,
                 "N = " + std::to_string(N) + " logits row " + std::to_string(k), true);
    for (int64_t l = s.p.E; l < s.p.L; ++l, ++i) {
      const auto& bl = bounded.layers[size_t(l)];
      // The last prompt position, N - 1 (the capture goes on with the decode steps).
      const auto at = std::find(bl.positions.begin(), bl.positions.end(), N - 1);
      ASSERT_NE(at, bl.positions.end());
      const int64_t last_b = at - bl.positions.begin();
      ASSERT_EQ(exact.layers[size_t(l)].positions[size_t(N - 1)], N - 1);
      ASSERT_LT(i, s.rows.size());
      expect_row(s.rows[i], bl.out.row(last_b).data(), exact.layers[size_t(l)].out.row(N - 1).data(), s.c.d_model,
                 "N = " + std::to_string(N) + " layer " + std::to_string(l), false);
    }
  }
  RunRequest base;
  base.mode = Mode::Ced;
  base.replay = ReplayPolicy::parse("bounded");
  base.n_prompt = 20;
  base.decode_steps = 2;
  base.tokens.assign(tokens.begin(), tokens.begin() + 22);
  base.logits = LogitsScope::Last;
  const RunResult scratch = be->run(base);
  for (int64_t P : {2, 4}) {
    RunRequest r = base;
    r.mode = Mode::Resume;
    r.prefix_len = P;
    const RunResult res = be->run(r);
    for (int64_t k = 0; k < 3; ++k, ++i) {
      ASSERT_LT(i, s.rows.size());
      expect_row(s.rows[i], res.logits.row(k).data(), scratch.logits.row(k).data(), V,
                 "resume P = " + std::to_string(P) + " logits row " + std::to_string(k), true);
    }
  }
  EXPECT_EQ(i, s.rows.size());
}

TEST(ReplaySweep, ShortPromptsReplayEverythingSoTheirDriftIsZero) {
  // N = 3 < W: bounded replay covers the whole prompt, so it is exact recovery, bit for bit.
  for (const DriftRow& r : sweep().rows)
    if (r.n_prompt == 3) {
      EXPECT_TRUE(r.exact) << r.kind << " layer " << r.layer << " step " << r.step;
      EXPECT_EQ(r.rel_l2, 0);
      if (r.kind != "layer") {
        EXPECT_EQ(r.top1, 1);
      }
    }
}

TEST(ReplaySweep, CsvHasAHeaderAndOneLinePerRow) {
  const Sweep& s = sweep();
  const std::string csv = drift_csv(s.rows);
  std::istringstream in(csv);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "kind,n_prompt,replay,prefix,layer,step,rel_l2,max_abs,kl,top1,bitwise_exact");
  size_t n = 0;
  bool resumed = false;  // a resume row, whose prefix is not -1 and differs from its replay, is among them
  for (; std::getline(in, line); ++n) {
    ASSERT_LT(n, s.rows.size());
    const DriftRow& r = s.rows[n];
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, ',');) f.push_back(x);
    ASSERT_EQ(f.size(), 11u) << line;
    // each column under its own header, the integers exactly and the metrics to the printed digits
    EXPECT_EQ(f[0], r.kind);
    EXPECT_EQ(std::stoll(f[1]), r.n_prompt) << line;
    EXPECT_EQ(std::stoll(f[2]), r.replay) << line;
    EXPECT_EQ(std::stoll(f[3]), r.prefix) << line;
    EXPECT_EQ(std::stoll(f[4]), r.layer) << line;
    EXPECT_EQ(std::stoll(f[5]), r.step) << line;
    EXPECT_EQ(f[6], fmt::format("{:.6e}", r.rel_l2)) << line;
    EXPECT_EQ(f[7], fmt::format("{:.6e}", r.max_abs)) << line;
    EXPECT_EQ(f[8], fmt::format("{:.6e}", r.kl)) << line;
    EXPECT_EQ(f[9], fmt::format("{:.4f}", r.top1)) << line;
    EXPECT_EQ(f[10], r.exact ? "1" : "0") << line;
    resumed |= r.prefix >= 0 && r.prefix != r.replay;
  }
  EXPECT_EQ(n, s.rows.size());
  EXPECT_TRUE(resumed);
}

TEST(ReplaySweep, TableListsEveryLengthEveryLayerAndEveryResume) {
  const Sweep& s = sweep();
  const std::string t = drift_table(s.rows);
  for (int64_t N : {3, 13, 20}) EXPECT_NE(t.find(fmt::format("{:>8} {:>6}", N, std::min<int64_t>(N, 4))), std::string::npos) << t;
  EXPECT_NE(t.find("per decoder layer at N = 20"), std::string::npos) << t;
  for (int64_t l = s.p.E; l < s.p.L; ++l) EXPECT_NE(t.find(fmt::format("  layer {:>3}: ", l)), std::string::npos) << t;
  EXPECT_NE(t.find("resume drift"), std::string::npos) << t;
  EXPECT_NE(t.find("N 20 P      2: rel L2"), std::string::npos) << t;
  EXPECT_NE(t.find("N 20 P      4: rel L2"), std::string::npos) << t;
}

TEST(ReplaySweep, SvgDrawsBothPanelsWithAPointPerValue) {
  const Sweep& s = sweep();
  const std::string svg = drift_svg(s.rows, "tiny");
  auto count = [&](const std::string& w) {
    size_t n = 0;
    for (size_t at = svg.find(w); at != std::string::npos; at = svg.find(w, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  // prefill and decode series over 3 lengths, and one point per decoder layer at N = 20.
  EXPECT_EQ(count("<polyline"), 3u) << svg;
  EXPECT_EQ(count("<circle"), size_t(3 + 3 + (s.p.L - s.p.E))) << svg;
  EXPECT_NE(svg.find("hidden state rel L2 at N = 20"), std::string::npos);
  // The log-x panel labels each N (3, 13 and 20 lie far enough apart on 380 px); the layer panel
  // (linear x) has no such labels.
  for (int N : {3, 13, 20}) EXPECT_NE(svg.find(fmt::format("font-size=\"9\">{}</text>", N)), std::string::npos) << N;
  EXPECT_EQ(count("font-size=\"9\""), 3u) << svg;
}

// Without --tokens the sweep runs W, 2W, ..., 64W and the lengths around the plan's spans:
// R - 1, R, R + 1 and D(W-1) (docs/spec.md §4), each once, ascending.
TEST(ReplaySweep, DefaultLengthsAreTheWindowDoublingsAndTheLengthsAroundTheSpans) {
  const Plan p = make_plan(load_config("tiny"));
  std::vector<int64_t> want;
  for (int64_t k = 1; k <= 64; k *= 2) want.push_back(k * p.W);
  const int64_t R = p.exact_replay();
  for (int64_t x : {R - 1, R, R + 1, p.exact_decode_replay()}) want.push_back(x);
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  EXPECT_EQ(default_lengths(p), want);
  // tiny: W = 4, R = 13, D(W-1) = 12
  EXPECT_EQ(default_lengths(p), (std::vector<int64_t>{4, 8, 12, 13, 14, 16, 32, 64, 128, 256}));
}

// Drawn from rows made by hand, so that each series has its own order of magnitude: the decode series is
// the largest drift of each N's decode steps, never another kind's, and the axis spans it.
TEST(ReplaySweep, SvgDecodeSeriesIsTheLargestDecodeDriftOfEachLength) {
  std::vector<DriftRow> rows;
  for (int64_t N : {10, 100}) {
    rows.push_back({.kind = "prefill", .n_prompt = N, .rel_l2 = 1e-3});
    for (int64_t l : {4, 5}) rows.push_back({.kind = "layer", .n_prompt = N, .layer = l, .rel_l2 = 1e-5});
    rows.push_back({.kind = "decode", .n_prompt = N, .step = 0, .rel_l2 = 1e-10});
    rows.push_back({.kind = "decode", .n_prompt = N, .step = 1, .rel_l2 = 1e-9});
  }
  const std::string svg = drift_svg(rows, "by hand");
  // y axis from 1e-9 (the decode maxima; the smaller step's 1e-10 is not drawn) to 1e-2 (above the prefill's 1e-3)
  EXPECT_NE(svg.find(">1e-9</text>"), std::string::npos) << svg;
  EXPECT_EQ(svg.find(">1e-10</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">1e-2</text>"), std::string::npos) << svg;
}

// Each panel's axis title sits below the panel (and below its tick labels), not inside it.
TEST(ReplaySweep, SvgAxisTitlesSitBelowTheirPanels) {
  const std::string svg = drift_svg(sweep().rows, "tiny");
  auto number_after = [&](size_t at, const std::string& key) {
    const size_t k = svg.find(key, at);
    return k == std::string::npos ? -1.0 : std::stod(svg.substr(k + key.size()));
  };
  double bottom = -1;  // the panels' frames: <rect x= y= width= height= fill="none" ...>
  for (size_t at = svg.find("<rect x="); at != std::string::npos; at = svg.find("<rect x=", at + 1))
    bottom = std::max(bottom, number_after(at, " y=\"") + number_after(at, " height=\""));
  ASSERT_GT(bottom, 0) << svg;
  for (const std::string title : {"prompt length N (log scale)", "decoder layer"}) {
    const size_t end = svg.find(">" + title + "</text>");
    ASSERT_NE(end, std::string::npos) << title << "\n" << svg;
    const double y = number_after(svg.rfind("<text ", end), " y=\"");
    EXPECT_GT(y, bottom + 14) << title << ": the tick labels sit 14 px below the frame\n" << svg;
  }
}

// Each series' legend label starts inside its panel, right of the frame's left edge (text drawn on the edge
// runs into the frame's stroke) and left of its right edge.
TEST(ReplaySweep, SvgLegendLabelsStartInsideTheirPanels) {
  const std::string svg = drift_svg(sweep().rows, "tiny");
  auto number_after = [&](size_t at, const std::string& key) { return std::stod(svg.substr(svg.find(key, at) + key.size())); };
  std::vector<std::pair<double, double>> frames;  // [left, right) of each panel's <rect x= ... fill="none">
  for (size_t at = svg.find("<rect x="); at != std::string::npos; at = svg.find("<rect x=", at + 1))
    frames.emplace_back(number_after(at, " x=\""), number_after(at, " x=\"") + number_after(at, " width=\""));
  ASSERT_EQ(frames.size(), 2u) << svg;
  size_t labels = 0;  // legend labels are the texts with a fill colour
  for (size_t at = svg.find("<text x="); at != std::string::npos; at = svg.find("<text x=", at + 1)) {
    const std::string tag = svg.substr(at, svg.find('>', at) - at);
    if (tag.find(" fill=") == std::string::npos) continue;
    ++labels;
    const double x = number_after(at, " x=\"");
    EXPECT_TRUE(std::any_of(frames.begin(), frames.end(), [&](auto f) { return f.first < x && x < f.second; }))
        << tag << ": outside every panel";
  }
  EXPECT_EQ(labels, 3u) << svg;  // prefill and decode in the first panel, the layers in the second
}

// The table's decode columns, on rows made by hand: per N the largest decode-step rel L2 (not
// the smallest, not another N's) and "DIFF" when any step's top-1 disagrees.
TEST(ReplaySweep, TableDecodeColumnsAreTheWorstStepOfEachLength) {
  std::vector<DriftRow> rows = {{.kind = "prefill", .n_prompt = 10, .replay = 4, .rel_l2 = 1e-3, .kl = 2e-6},
                                {.kind = "decode", .n_prompt = 10, .replay = 4, .step = 0, .rel_l2 = 1e-5},
                                {.kind = "decode", .n_prompt = 10, .replay = 4, .step = 1, .rel_l2 = 3e-5, .top1 = 0},
                                {.kind = "decode", .n_prompt = 10, .replay = 4, .step = 2, .rel_l2 = 2e-5},
                                {.kind = "prefill", .n_prompt = 100, .replay = 4, .rel_l2 = 4e-3, .top1 = 0},
                                {.kind = "decode", .n_prompt = 100, .replay = 4, .step = 0, .rel_l2 = 5e-2}};
  const std::string t = drift_table(rows);
  EXPECT_NE(t.find(fmt::format("{:>8} {:>6} {:>12} {:>12} {:>8} {:>14} {:>14}\n", 10, 4, "1.000e-03", "2.000e-06",
                               "same", "3.000e-05", "DIFF")),
            std::string::npos)
      << t;
  EXPECT_NE(t.find(fmt::format("{:>8} {:>6} {:>12} {:>12} {:>8} {:>14} {:>14}\n", 100, 4, "4.000e-03", "0.000e+00",
                               "DIFF", "5.000e-02", "same")),
            std::string::npos)
      << t;
}
