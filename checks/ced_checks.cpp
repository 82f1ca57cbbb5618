#include "checks/ced_checks.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

#include "models/lab/hdf5_files.hpp"
#include "model/bisect.hpp"
#include "oracle/analytic.hpp"
#include "reference/lab/replays.hpp"

namespace ced::prop {
namespace {

const LayerCapture& layer_of(const RunResult& r, int64_t l) { return r.layers[size_t(l)]; }

std::string compare_runs_bitwise(const RunResult& a, const RunResult& b, const char* what) {
  if (a.positions != b.positions) return fmt::format("{}: logits positions differ", what);
  if (!bits_equal(a.logits, b.logits)) return fmt::format("{}: logits differ", what);
  // A capture missing on one side is a difference, not fewer things to compare.
  if (a.layers.size() != b.layers.size())
    return fmt::format("{}: {} captured layers vs {}", what, a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const auto &x = a.layers[l], &y = b.layers[l];
    if (x.positions != y.positions) return fmt::format("{}: layer {} positions differ", what, l);
    if (!bits_equal(x.out, y.out)) return fmt::format("{}: layer {} out differs", what, l);
    if (x.has_topk != y.has_topk) return fmt::format("{}: layer {} has a selection on one side only", what, l);
    if (x.has_topk && (x.topk.rows() != y.topk.rows() || x.topk.cols() != y.topk.cols() || x.topk != y.topk))
      return fmt::format("{}: layer {} topk differs", what, l);
  }
  return "";
}

std::string expect_capture(const RunResult& r, const Plan& p, const char* what) {
  if (int64_t(r.layers.size()) != p.L) return fmt::format("{}: {} captured layers, the model has {}", what, r.layers.size(), p.L);
  return "";
}

bool last_finite(const RunResult& r) { return r.logits.row(r.logits.rows() - 1).allFinite(); }

RunRequest ced_req(const Model& m, int64_t N, int64_t K, int64_t decode, bool poison, bool last_only) {
  RunRequest r = m.request(Mode::Ced, N, std::to_string(K), decode);
  r.poison_truncated = poison;
  if (last_only) r.logits = LogitsScope::Last;
  return r;
}

}  // namespace

std::string check_replay_full_equals_full(const Model& m, int64_t N) {
  return compare_runs_bitwise(m.full(N, 0, true), m.ced(N, "full", 0, true), "ced replay=full vs full");
}

std::string check_cone(const Model& m, int64_t N, int64_t K) {
  const RunResult full = m.full(N, 0, true);
  const RunResult real = m.ced(N, std::to_string(K), 0, true);
  const RunResult probe = m.ced(N, std::to_string(K), 0, true, /*poison=*/true);
  const int64_t s = N - std::min(N, K);
  for (const RunResult* r : {&full, &real, &probe})
    if (auto e = expect_capture(*r, m.p, "cone"); !e.empty()) return e;
  for (int64_t l = 0; l < m.p.E; ++l)
    if (!bits_equal(layer_of(full, l).out, layer_of(real, l).out))
      return fmt::format("encoder layer {} differs from full mode", l);
  for (int64_t k = 0; k < m.p.D; ++k) {
    const int64_t l = m.p.E + k;
    const auto &f = layer_of(full, l), &r = layer_of(real, l), &pr = layer_of(probe, l);
    if (r.positions.empty()) return fmt::format("layer {}: decoder evaluated no position, replay is {}..{}", l, s, N - 1);
    if (r.positions.front() != s || r.positions.back() != N - 1)
      return fmt::format("layer {}: decoder evaluated {}..{}, replay is {}..{}", l, r.positions.front(),
                         r.positions.back(), s, N - 1);
    for (int64_t p = s; p < N; ++p) {
      const bool exact = cone_exact(m.p, k, p, s);
      if (exact && !rows_equal(f.out, f.positions, r.out, r.positions, p))
        return fmt::format("layer {} p {} s {}: inside the cone but differs from full", l, p, s);
      if (exact != row_finite(pr.out, pr.positions, p))
        return fmt::format("layer {} p {} s {}: cone says {}, the dependency probe says {}", l, p, s,
                           exact ? "exact" : "inexact", exact ? "inexact" : "exact");
      if (!exact && k == 0 && rows_equal(f.out, f.positions, r.out, r.positions, p))
        return fmt::format("layer {} p {} s {}: truncated window but bitwise equal to full", l, p, s);
    }
  }
  return "";
}

std::string check_min_exact_replay(const Model& m, int64_t N) {
  const int64_t want = predicted_min_exact_replay(m.p, N);
  const auto session = open_replays(*m.be, ced_req(m, N, N, 0, true, true));  // the encoder once (reference/lab/replays.hpp)
  auto exact = [&](int64_t K) { return last_finite(session->run(ced_req(m, N, K, 0, true, true))); };
  const int64_t got = fewest_true(N, exact);
  if (got != want) return fmt::format("N {}: minimal exact replay found {}, oracle {}", N, got, want);
  if (want > 1 && exact(want - 1)) return fmt::format("N {}: replay {} already exact", N, want - 1);
  auto full = m.request(Mode::Full, N);
  full.logits = LogitsScope::Last;
  if (!bits_equal(m.run(full).logits, session->run(ced_req(m, N, want, 0, false, true)).logits))
    return fmt::format("N {}: replay {} last logits differ from full", N, want);
  return "";
}

std::string check_decode_bound(const Model& m, int64_t N, int64_t steps) {
  const int64_t want = predicted_min_exact_decode_replay(m.p, N);
  const auto session = open_replays(*m.be, ced_req(m, N, N, steps, true, true));  // the encoder once
  auto decode_exact = [&](int64_t K) {
    const RunResult r = session->run(ced_req(m, N, K, steps, true, true));
    return r.logits.bottomRows(steps).allFinite();
  };
  const int64_t got = fewest_true(N, decode_exact);
  if (got != want) return fmt::format("N {}: minimal exact-decode replay found {}, oracle {}", N, got, want);
  if (want > 1 && decode_exact(want - 1)) return fmt::format("N {}: replay {} already decodes exactly", N, want - 1);
  const RunResult full = m.full(N, steps);
  const RunResult ced = session->run(ced_req(m, N, want, steps, false, false));
  if (!bits_equal(full.logits.bottomRows(steps), ced.logits.bottomRows(steps)))
    return fmt::format("N {}: decode after replay {} differs from decode after full", N, want);
  return "";
}

std::string check_bounded_equals_exact_short(const Model& m, int64_t N) {
  return compare_runs_bitwise(m.ced(N, "bounded", 1, true), m.ced(N, "exact", 1, true),
                              "bounded vs exact with N <= W");
}

std::string check_source_only_write(const Model& m, int64_t N) {
  auto fr = m.request(Mode::Full, N), cr = m.request(Mode::Ced, N, "bounded");
  fr.want_cache = cr.want_cache = true;
  const RunResult f = m.run(fr), c = m.run(cr);
  if (!f.cache || !c.cache) return "source-only write: a run returned no cache";
  if (f.cache->sources.size() != c.cache->sources.size())
    return fmt::format("source-only write: {} kv sources in full mode, {} in ced", f.cache->sources.size(),
                       c.cache->sources.size());
  for (size_t i = 0; i < f.cache->sources.size(); ++i) {
    const auto &a = f.cache->sources[i], &b = c.cache->sources[i];
    if (a.layer != b.layer || a.ratio != b.ratio || a.n_tokens != b.n_tokens)
      return fmt::format("kv source {}: layer, ratio or token count differ from full mode's", i);
    if (!bits_equal(a.entries, b.entries) || !bits_equal(a.index_keys, b.index_keys) ||
        !bits_equal(a.pending_c, b.pending_c) || !bits_equal(a.pending_z, b.pending_z))
      return fmt::format("kv source {}: ced entries differ from full mode's", a.layer);
  }
  return "";
}

std::string check_reuse_selection(const Model& m, int64_t N) {
  for (const RunResult& r : {m.full(N, 1, true), m.ced(N, "bounded", 1, true)}) {
    if (auto e = expect_capture(r, m.p, "reuse selection"); !e.empty()) return e;
    for (const auto& lp : m.p.layers) {
      if (lp.role != Role::Reuse) continue;
      const auto &a = layer_of(r, lp.layer), &b = layer_of(r, lp.idx_src);
      if (!a.has_topk || !b.has_topk)
        return fmt::format("Reuse layer {} or idx_src {} stores no selection", lp.layer, lp.idx_src);
      if (a.positions != b.positions || a.topk.rows() != b.topk.rows() || a.topk.cols() != b.topk.cols() ||
          a.topk != b.topk)
        return fmt::format("Reuse layer {}: selection differs from idx_src {}", lp.layer, lp.idx_src);
    }
  }
  return "";
}

std::string check_shared_kv(const Config& c, int64_t N, Fault fault, const BackendDecorator& wrap) {
  const int64_t E = c.n_encoder_layers, L = c.n_layers, r = c.compress_ratios[size_t(E)];
  Config x = c, y = c;
  std::vector<int64_t> kv, idx;
  for (int64_t l : c.kv_source_layers)
    if (l < E) kv.push_back(l);
  for (int64_t l : c.index_source_layers)
    if (l < E) idx.push_back(l);
  std::vector<int64_t> dec;
  for (int64_t l = E; l < L; ++l) dec.push_back(l);
  for (Config* z : {&x, &y}) {
    for (int64_t l = E; l < L; ++l) z->compress_ratios[size_t(l)] = r;
    z->index_source_layers = idx;
    z->index_source_layers.insert(z->index_source_layers.end(), dec.begin(), dec.end());
    if (z->candidate_source_layer >= 0 && z->candidate_source_layer < E) z->candidate_source_layer = E;
  }
  x.kv_source_layers = kv;
  x.kv_source_layers.insert(x.kv_source_layers.end(), dec.begin(), dec.end());  // formula (1): every decoder layer projects from x̂_E
  y.kv_source_layers = kv;
  y.kv_source_layers.push_back(E);  // CSA2: decoder layers above E are Reindex layers
  x.tie_decoder_kv = true;
  y.tie_decoder_kv = false;
  Config untied = x;
  untied.tie_decoder_kv = false;
  validate(x);
  validate(y);
  Model mx(x, true, fault), my(y, true, fault), mu(untied, true, fault);
  if (wrap) {
    mx.be = wrap(std::move(mx.be), "tied");
    my.be = wrap(std::move(my.be), "reindex");
    mu.be = wrap(std::move(mu.be), "untied");
  }
  const RunResult rx = mx.full(N, 1), ry = my.full(N, 1);
  if (!bits_equal(rx.logits, ry.logits)) return "tied decoder kv sources differ from Reindex layers over layer E";
  const RunResult cx = mx.ced(N, "bounded", 1), cy = my.ced(N, "bounded", 1);
  if (!bits_equal(cx.logits, cy.logits)) return "ced: tied decoder kv sources differ from Reindex layers";
  // Untied sources have their own compressor weights, so once a decoder layer
  // above E sees an entry the outputs must move.
  if (L - E >= 2 && N >= r && !c.tie_decoder_kv) {
    if (bits_equal(mu.full(N, 1).logits, rx.logits)) return "untied decoder kv sources equal the tied ones";
  }
  return "";
}

std::string check_resume_short_prefix(const Model& m, int64_t N, int64_t P) {
  auto rr = m.request(Mode::Resume, N, "bounded", 1);
  rr.prefix_len = P;
  const RunResult res = m.run(rr);
  const RunResult ced = m.ced(N, "bounded", 1);
  if (res.positions != ced.positions || !bits_equal(res.logits, ced.logits))
    return fmt::format("resume P {} <= W differs from ced from scratch (N {})", P, N);
  return "";
}

std::string check_resume_saved_cache(const Model& m, int64_t N, int64_t P) {
  auto rr = m.request(Mode::Resume, N, "bounded", 2);
  rr.prefix_len = P;
  rr.want_cache = true;
  const RunResult mem = m.run(rr);
  const auto path = std::filesystem::temp_directory_path() / fmt::format("ced-cache-{}.h5", ::getpid());
  CacheFile cf;
  cf.generator = "ced_checks";
  cf.config = m.c;
  cf.weight_seed = kWeightSeed;
  cf.cache = *mem.cache;
  cf.tokens.assign(rr.tokens.begin(), rr.tokens.begin() + cf.cache.prefix_len);
  cf.tokens_explicit = true;  // the check's own tokens, not necessarily a token seed's
  write_cache_file(path, cf);
  const CacheFile back = read_cache_file(path);
  std::filesystem::remove(path);
  rr.cache_in = std::make_shared<PersistedCache>(back.cache);
  rr.want_cache = false;
  const RunResult loaded = m.run(rr);
  if (!bits_equal(mem.logits, loaded.logits)) return "resume through a saved cache differs from resume in memory";
  return "";
}

std::string check_flops_of(const Model& m, const RunRequest& r) {
  const FlopCount got = m.run(r).flops;
  const FlopCount want = flop_model(m.c, m.p, flop_query(r));
  if (got.per_layer.size() != want.per_layer.size())
    return fmt::format("{} N {}: counter has {} rows, oracle {}", mode_name(r.mode), r.n_prompt, got.per_layer.size(),
                       want.per_layer.size());
  for (size_t l = 0; l < want.per_layer.size(); ++l)
    for (int k = 0; k < kFlopKinds; ++k)
      if (got.per_layer[l][size_t(k)] != want.per_layer[l][size_t(k)])
        return fmt::format("{} N {}: {} {}: counted {}, oracle {}", mode_name(r.mode), r.n_prompt,
                           l + 1 == want.per_layer.size() ? std::string("lm_head row") : fmt::format("layer {}", l),
                           flop_kind_name(k), got.per_layer[l][size_t(k)], want.per_layer[l][size_t(k)]);
  return "";
}

std::string check_flops(const Model& m, int64_t N) {
  std::vector<RunRequest> reqs;
  reqs.push_back(m.request(Mode::Full, N, "none", 2));
  reqs.push_back(m.request(Mode::Ced, N, "bounded", 1));
  reqs.push_back(m.request(Mode::Ced, N, std::to_string(std::max<int64_t>(1, N / 3)), 0));
  auto res = m.request(Mode::Resume, N, "exact", 1);
  res.prefix_len = N / 2;
  reqs.push_back(res);
  reqs[1].logits = LogitsScope::Last;
  for (const auto& r : reqs)
    if (auto e = check_flops_of(m, r); !e.empty()) return e;
  return "";
}

std::string check_decode_equals_prefill(const Model& m, int64_t N, int64_t K) {
  const RunResult dec = m.full(N, K), longer = m.full(N + K);
  if (!bits_equal(dec.logits.bottomRows(K), longer.logits.bottomRows(K)))
    return "decode after full prefill differs from a longer full prefill";
  return "";
}

std::string check_thread_invariance(const Model& m, int64_t N, int max_threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const RunResult one = m.ced(N, "bounded", 2, true);
  for (int t = 2; t <= max_threads; ++t) {
    omp_set_num_threads(t);
    const RunResult many = m.ced(N, "bounded", 2, true);
    if (auto e = compare_runs_bitwise(one, many, fmt::format("1 thread vs {} threads", t).c_str()); !e.empty()) {
      omp_set_num_threads(saved);
      return e;
    }
  }
  omp_set_num_threads(saved);
  return "";
}

std::string check_batch_invariance(const Model& m, int64_t N, int64_t extra) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);  // a batch moves rows between threads only when there are two
  const RunResult a = m.full(N, 0, true), b = m.full(N + extra, 0, true);
  omp_set_num_threads(saved);
  for (const RunResult* r : {&a, &b})
    if (auto e = expect_capture(*r, m.p, "batch invariance"); !e.empty()) return e;
  for (int64_t p = 0; p < N; ++p)
    if (!rows_equal(a.logits, a.positions, b.logits, b.positions, p))
      return fmt::format("logits at position {} differ between a batch of {} and of {}", p, N, N + extra);
  for (int64_t l = 0; l < m.p.L; ++l)
    for (int64_t p = 0; p < N; ++p)
      if (!rows_equal(a.layers[size_t(l)].out, a.layers[size_t(l)].positions, b.layers[size_t(l)].out,
                      b.layers[size_t(l)].positions, p))
        return fmt::format("layer {} at position {} differs between a batch of {} and of {}", l, p, N, N + extra);
  return "";
}

Config wide_config(const Config& base) {
  // The FFN's shared expert multiplies [n, d] by [d, moe_dim]: at d = 256 and
  // moe_dim = 128 that is 32768 multiply-adds per row, so from n = 33 rows on
  // it passes matmul_rows' parallel threshold (2^20).
  Config c = with_override(base, "d_model=256");
  return with_override(c, "moe_dim=128");
}

Spans empirical_spans(const Model& m, int64_t N, int64_t P,
                      const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& what, int64_t K, bool ok) {
    if (progress) progress(fmt::format("{} B = {}: {}", what, K, ok ? "exact" : "inexact"));
  };
  Spans s;
  // The decoder searches' probes differ only in replay, probe and decode
  // steps: one session computes the encoder over the N positions once
  // (reference/lab/replays.hpp).
  const auto decoder = open_replays(*m.be, ced_req(m, N, N, 1, true, true));
  // The two dependency searches ask one run: with one decode step it has the
  // prompt's last logits of a run without (the step comes after them), so a
  // length both searches probe (their paths part only near the end) runs once.
  std::map<int64_t, std::pair<bool, bool>> probed;  // B -> (last logits finite, decode step's finite)
  auto probe = [&](int64_t K) {
    auto it = probed.find(K);
    if (it == probed.end()) {
      const MatD logits = decoder->run(ced_req(m, N, K, 1, true, true)).logits;  // [2, V]: N-1, then N
      it = probed.emplace(K, std::pair{logits.row(0).allFinite(), logits.row(1).allFinite()}).first;
    }
    return it->second;
  };
  s.exact_last = fewest_true(N, [&](int64_t K) {
    const bool ok = probe(K).first;
    say("decoder, last logits (probe)", K, ok);
    return ok;
  });
  s.exact_decode = fewest_true(N, [&](int64_t K) {
    const bool ok = probe(K).second;
    say("decoder, next decode step (probe)", K, ok);
    return ok;
  });
  auto full = m.request(Mode::Full, N);
  full.logits = LogitsScope::Last;
  const MatD want = m.run(full).logits;
  s.numeric_last = fewest_true(N, [&](int64_t K) {
    const bool ok = bits_equal(decoder->run(ced_req(m, N, K, 0, false, true)).logits, want);
    say("decoder, last logits (bitwise)", K, ok);
    return ok;
  });
  if (P > 0 && N > P) {
    RunRequest base = m.request(Mode::Resume, N, "bounded");
    base.prefix_len = P;
    base.want_cache = true;
    base.logits = LogitsScope::Last;
    base.n_prompt = P;  // the cache of the first P tokens, computed once
    base.tokens.resize(size_t(P));
    auto cache = m.run(base).cache;
    // The resume's encoder starts at P - Kr, so each Kr is a run of its own
    // (no session; importing the shared cache is a copy, not worth sharing).
    // H_E rows are layer E-1's output; both searches read one run per Kr.
    std::map<int64_t, std::pair<bool, bool>> resumed;  // Kr -> (H_E finite at P-1, at P)
    auto hidden_finite = [&](int64_t Kr, int64_t pos) {
      auto it = resumed.find(Kr);
      if (it == resumed.end()) {
        RunRequest r = m.request(Mode::Resume, N, "bounded");
        r.prefix_len = P;
        r.resume_replay = Kr;
        r.poison_truncated = true;
        r.capture_layers = true;
        r.logits = LogitsScope::Last;
        r.cache_in = cache;
        const RunResult res = m.run(r);
        const auto& cap = res.layers[size_t(m.p.E - 1)];
        it = resumed.emplace(Kr, std::pair{row_finite(cap.out, cap.positions, P - 1), row_finite(cap.out, cap.positions, P)})
                 .first;
      }
      const bool ok = pos < P ? it->second.first : it->second.second;
      say(pos < P ? "encoder resume, H_E at P-1 (probe)" : "encoder resume, H_E at P (probe)", Kr, ok);
      return ok;
    };
    s.enc_exact_hidden = fewest_true(P, [&](int64_t Kr) { return hidden_finite(Kr, P - 1); });
    s.enc_exact_next = fewest_true(P, [&](int64_t Kr) { return hidden_finite(Kr, P); });
  }
  return s;
}

std::vector<SpanRow> span_rows(const Plan& p, int64_t N, int64_t P, const Spans& found) {
  const int64_t R = p.exact_replay(), Db = p.exact_decode_replay();
  const int64_t encH = 1 + p.E * (p.W - 1), encN = p.E * (p.W - 1);
  return {{"decoder: exact last-position logits, R = 1 + D(W-1)", std::min(N, R), found.exact_last},
          {"decoder: exact next decode step, D(W-1)", std::max<int64_t>(1, std::min(N, Db)), found.exact_decode},
          {"encoder resume: exact H_E at P-1, 1 + E(W-1)", std::min(P, encH), found.enc_exact_hidden},
          {"encoder resume: exact first new position, E(W-1)", std::max<int64_t>(1, std::min(P, encN)),
           found.enc_exact_next}};
}

bool spans_agree(const std::vector<SpanRow>& rows) {
  return std::all_of(rows.begin(), rows.end(), [](const SpanRow& r) { return r.oracle == r.found; });
}

}  // namespace ced::prop
