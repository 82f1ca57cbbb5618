#include "checks/replay_sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "models/lab/weights.hpp"
#include "compare/compare.hpp"
#include "backends/registry.hpp"

namespace ced::prop {

void fill_metrics(DriftRow& row, const double* t, const double* r, int64_t n, bool logits) {
  std::span<const double> ts(t, size_t(n)), rs(r, size_t(n));
  const TensorCompare tc = compare_tensors(ts, rs, {1, n}, Thresholds{}, TensorDtype::F64);
  row.rel_l2 = tc.rel_l2;
  row.max_abs = tc.max_abs_err;
  row.exact = std::memcmp(t, r, sizeof(double) * size_t(n)) == 0;
  if (logits) {
    const LogitsCompare lc = compare_logits(ts, rs, {1, n});
    row.kl = lc.max_kl;
    row.top1 = lc.top1_fraction;
    row.top5 = lc.topk_overlap;
  }
}

std::vector<int64_t> default_lengths(const Plan& p) {
  std::set<int64_t> n;
  for (int64_t k = 1; k <= 64; k *= 2) n.insert(k * p.W);
  const int64_t R = p.exact_replay();
  for (int64_t x : {R - 1, R, R + 1, p.exact_decode_replay()})
    if (x >= 1) n.insert(x);
  return {n.begin(), n.end()};
}

std::vector<DriftRow> replay_sweep(const Config& c, const SweepOptions& o,
                                   const std::function<void(int64_t, int64_t, const std::string&)>& progress) {
  const Plan p = make_plan(c);
  std::vector<int64_t> Ns = o.lengths.empty() ? default_lengths(p) : o.lengths;
  std::sort(Ns.begin(), Ns.end());
  const int64_t Nmax = Ns.back();
  check_fits_in_memory(c, Nmax + o.decode, o.backend);
  auto be = make_backend(o.backend, c, o.weight_seed);
  const auto tokens = make_tokens(o.token_seed, c.vocab_size, Nmax + o.decode);
  std::vector<int64_t> Ps = o.prefixes;
  if (Ps.empty()) Ps = {p.W / 2, p.W, p.W + 1, 2 * p.W, 4 * p.W};
  const int64_t total = int64_t(Ns.size()) * 2 + int64_t(Ps.size()) * 2;
  int64_t done = 0;
  auto tick = [&](const std::string& what) {
    ++done;
    if (progress) progress(done, total, what);
  };
  std::vector<DriftRow> rows;
  for (int64_t N : Ns) {
    RunRequest r;
    r.n_prompt = N;
    r.decode_steps = o.decode;
    r.tokens.assign(tokens.begin(), tokens.begin() + N + o.decode);
    r.logits = LogitsScope::Last;
    r.capture_layers = true;
    r.mode = Mode::Full;
    // Exact recovery: full mode (ced exact equals it at every output compared here).
    const RunResult exact = be->run(r);
    tick(fmt::format("N = {} exact", N));
    r.mode = Mode::Ced;
    r.replay = ReplayPolicy::parse("bounded");
    const RunResult bounded = be->run(r);
    tick(fmt::format("N = {} bounded", N));
    const int64_t V = c.vocab_size, B = std::min(N, p.W);
    DriftRow pre{"prefill", N, B};
    fill_metrics(pre, bounded.logits.row(0).data(), exact.logits.row(0).data(), V, true);
    rows.push_back(pre);
    for (int64_t k = 0; k < o.decode; ++k) {
      DriftRow d{"decode", N, B};
      d.step = k;
      fill_metrics(d, bounded.logits.row(1 + k).data(), exact.logits.row(1 + k).data(), V, true);
      rows.push_back(d);
    }
    for (int64_t l = p.E; l < p.L; ++l) {
      const auto &bl = bounded.layers[size_t(l)], &el = exact.layers[size_t(l)];
      // the last prompt position: row N-1 of the full capture, row N-1-s of the bounded one
      const int64_t ib = std::find(bl.positions.begin(), bl.positions.end(), N - 1) - bl.positions.begin();
      DriftRow lr{"layer", N, B};
      lr.layer = l;
      fill_metrics(lr, bl.out.row(ib).data(), el.out.row(N - 1).data(), c.d_model, false);
      rows.push_back(lr);
    }
  }
  // Resume drift: resume from a persisted prefix against ced from scratch.
  const int64_t Nr = std::min<int64_t>(Nmax, std::max<int64_t>(8 * p.W, 2));
  RunRequest base;
  base.mode = Mode::Ced;
  base.replay = ReplayPolicy::parse("bounded");
  base.n_prompt = Nr;
  base.decode_steps = o.decode;
  base.tokens.assign(tokens.begin(), tokens.begin() + Nr + o.decode);
  base.logits = LogitsScope::Last;
  const RunResult scratch = be->run(base);
  for (int64_t P : Ps) {
    if (P < 0 || P > Nr) {
      tick("skip");
      tick("skip");
      continue;
    }
    RunRequest r = base;
    r.mode = Mode::Resume;
    r.prefix_len = P;
    const RunResult res = be->run(r);
    tick(fmt::format("resume P = {}", P));
    DriftRow d{"resume", Nr, std::min(Nr, p.W), P};
    fill_metrics(d, res.logits.row(0).data(), scratch.logits.row(0).data(), c.vocab_size, true);
    rows.push_back(d);
    for (int64_t k = 0; k < o.decode; ++k) {
      DriftRow s{"resume-decode", Nr, std::min(Nr, p.W), P};
      s.step = k;
      fill_metrics(s, res.logits.row(1 + k).data(), scratch.logits.row(1 + k).data(), c.vocab_size, true);
      rows.push_back(s);
    }
    tick(fmt::format("resume P = {} compared", P));
  }
  return rows;
}

std::string drift_csv(const std::vector<DriftRow>& rows) {
  std::string s = "kind,n_prompt,replay,prefix,layer,step,rel_l2,max_abs,kl,top1,bitwise_exact\n";
  for (const auto& r : rows)
    s += fmt::format("{},{},{},{},{},{},{:.6e},{:.6e},{:.6e},{:.4f},{}\n", r.kind, r.n_prompt, r.replay, r.prefix,
                     r.layer, r.step, r.rel_l2, r.max_abs, r.kl, r.top1, r.exact ? 1 : 0);
  return s;
}

std::string drift_table(const std::vector<DriftRow>& rows) {
  std::string s = "bounded replay vs exact recovery (last prompt position, then decode steps)\n";
  s += fmt::format("{:>8} {:>6} {:>12} {:>12} {:>8} {:>14} {:>14}\n", "N", "B", "logits relL2", "KL", "top-1",
                   "decode relL2", "decode top-1");
  std::map<int64_t, std::vector<const DriftRow*>> dec;
  for (const auto& r : rows)
    if (r.kind == "decode") dec[r.n_prompt].push_back(&r);
  for (const auto& r : rows) {
    if (r.kind != "prefill") continue;
    double drel = 0, dtop = 1;
    for (const DriftRow* d : dec[r.n_prompt]) {
      drel = std::max(drel, d->rel_l2);
      dtop = std::min(dtop, d->top1);
    }
    s += fmt::format("{:>8} {:>6} {:>12.3e} {:>12.3e} {:>8} {:>14.3e} {:>14}\n", r.n_prompt, r.replay, r.rel_l2, r.kl,
                     r.top1 == 1 ? "same" : "DIFF", drel, dtop == 1 ? "same" : "DIFF");
  }
  int64_t nmax = 0;
  for (const auto& r : rows)
    if (r.kind == "layer") nmax = std::max(nmax, r.n_prompt);
  s += fmt::format("per decoder layer at N = {} (hidden state rel L2 at the last position)\n", nmax);
  for (const auto& r : rows)
    if (r.kind == "layer" && r.n_prompt == nmax) s += fmt::format("  layer {:>3}: {:.3e}\n", r.layer, r.rel_l2);
  bool any_resume = false;
  for (const auto& r : rows)
    if (r.kind == "resume") {
      if (!any_resume) s += "resume drift (resume from prefix P vs ced from scratch, last logits)\n";
      any_resume = true;
      s += fmt::format("  N {} P {:>6}: rel L2 {:.3e}{}\n", r.n_prompt, r.prefix, r.rel_l2,
                       r.exact ? " (bitwise exact)" : "");
    }
  return s;
}

std::string drift_svg(const std::vector<DriftRow>& rows, const std::string& title) {
  // Two panels: drift vs N (log-log), and drift per decoder layer at max N.
  const double W = 960, H = 390, pad = 80, pw = 380, ph = 260;
  std::vector<std::pair<double, double>> pre, dec;
  std::map<int64_t, double> dmax;
  int64_t nmax = 0;
  for (const auto& r : rows) {
    if (r.kind == "prefill") pre.emplace_back(double(r.n_prompt), r.rel_l2);
    if (r.kind == "decode") dmax[r.n_prompt] = std::max(dmax[r.n_prompt], r.rel_l2);
    if (r.kind == "layer") nmax = std::max(nmax, r.n_prompt);
  }
  for (auto [n, v] : dmax) dec.emplace_back(double(n), v);
  std::vector<std::pair<double, double>> layers;
  for (const auto& r : rows)
    if (r.kind == "layer" && r.n_prompt == nmax) layers.emplace_back(double(r.layer), r.rel_l2);
  auto lg = [](double v) { return std::log10(std::max(v, 1e-17)); };
  double ymin = 0, ymax = -17;
  for (auto* s : {&pre, &dec, &layers})
    for (auto [x, y] : *s) {
      ymin = std::min(ymin, lg(y));
      ymax = std::max(ymax, lg(y));
    }
  ymin = std::floor(ymin);
  ymax = std::ceil(ymax + 1e-9);
  if (ymax <= ymin) ymax = ymin + 1;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"20\" "
      "font-size=\"15\">{}</text>\n",
      W, H, pad, title);
  auto panel = [&](double x0, const std::vector<std::vector<std::pair<double, double>>>& series,
                   const std::vector<std::string>& colors, const std::vector<std::string>& labels, bool logx,
                   const std::string& xlabel) {
    const double y0 = 62;
    double xmin = 1e300, xmax = -1e300;
    for (const auto& se : series)
      for (auto [x, y] : se) {
        const double xv = logx ? std::log10(x) : x;
        xmin = std::min(xmin, xv);
        xmax = std::max(xmax, xv);
      }
    if (xmax <= xmin) xmax = xmin + 1;
    auto X = [&](double x) { return x0 + (((logx ? std::log10(x) : x) - xmin) / (xmax - xmin)) * pw; };
    auto Y = [&](double y) { return y0 + ph - ((lg(y) - ymin) / (ymax - ymin)) * ph; };
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", x0, y0,
                     pw, ph);
    // The floor 1e-17 stands for bitwise-exact (zero) drift.
    for (double e = ymin; e <= ymax; e += 1)
      s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", x0 - 4,
                       y0 + ph - ((e - ymin) / (ymax - ymin)) * ph + 4,
                       e <= -17 ? std::string("0 (exact)") : fmt::format("1e{}", int(e)));
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x0 + pw / 2, y0 + ph + 32, xlabel);
    for (size_t k = 0; k < series.size(); ++k) {
      std::string pts;
      for (auto [x, y] : series[k]) {
        pts += fmt::format("{:.1f},{:.1f} ", X(x), Y(y));
        s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", X(x), Y(y), colors[k]);
      }
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\"/>\n", pts, colors[k]);
      s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", x0 + 4 + 200 * double(k), y0 - 8,
                       colors[k], labels[k]);
    }
    double last_label = -1e300;
    for (auto [x, y] : series[0])
      if (logx && X(x) - last_label > 28) {
        s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" font-size=\"9\">{}</text>\n", X(x),
                         y0 + ph + 14, int64_t(x));
        last_label = X(x);
      }
  };
  panel(pad, {pre, dec}, {"#1f77b4", "#d62728"}, {"prefill: last logits rel L2", "decode: max rel L2"},
        true, "prompt length N (log scale)");
  if (!layers.empty())
    panel(pad + pw + 90, {layers}, {"#2ca02c"}, {fmt::format("hidden state rel L2 at N = {}", nmax)}, false,
          "decoder layer");
  s += "</svg>\n";
  return s;
}

}  // namespace ced::prop
