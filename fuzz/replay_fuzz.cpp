// Fuzzes the CED properties (docs/spec.md §4–§7) over configs, prompt lengths, replay
// lengths, resume prefixes and decode steps, on the f64 reference.
//
// The input bytes decode (fuzz/byte_reader.hpp) to: a small config (docs/spec.md §1;
// L in [2,6], E in [1,L-1], W in [1,6], ratios, kv / index sources, the
// candidate pool, index_topk), built like property-tests/generators.hpp in
// three of four inputs and free-form in the fourth, where ced::validate
// decides (an invalid config is a clean rejection: return 0); then N in
// [1, 3R+2], mostly one of the awkward lengths of docs/spec.md §4.4; a replay
// length K; a resume prefix P <= N; 0..3 decode steps.
//
// Every check is bitwise or exact (the reference is batch-invariant, docs/spec.md §3):
// a violated property prints what broke and the config as TOML, then traps.
// CED_FUZZ_VERBOSE=1 prints each decoded case on one line; CED_FUZZ_FAULT=
// <fault> injects one of model/run.hpp's faults (a negative control).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include "fuzz/byte_reader.hpp"
#include "model/error.hpp"
#include "oracle/analytic.hpp"
#include "oracle/analytic_flops.hpp"
#include "checks/ced_checks.hpp"
#include "checks/harness.hpp"

namespace {

using namespace ced;
using ced::fuzz::ByteReader;
using ced::prop::Model;

// The widths of property-tests/generators.hpp's gen_config: tiny, so a case
// runs in milliseconds. Only the layer schedule varies widely.
Config read_config(ByteReader& in) {
  Config c;
  c.name = "fuzz";
  c.vocab_size = 31;
  c.d_model = in.pick<int64_t>({8, 16});
  c.n_heads = in.pick<int64_t>({1, 2});
  c.head_dim = in.pick<int64_t>({4, 8});
  c.rope_dim = in.pick<int64_t>({2, 4});
  c.q_lora_rank = 8;
  c.index_n_heads = in.pick<int64_t>({1, 2});
  c.index_head_dim = in.pick<int64_t>({4, 8});
  c.index_topk = in.range(1, 5);
  c.o_groups = c.n_heads;
  c.o_lora_rank = 4;
  c.n_routed_experts = in.pick<int64_t>({0, 3});
  c.n_active_experts = c.n_routed_experts ? in.range(1, c.n_routed_experts) : 0;
  c.n_shared_experts = c.n_routed_experts ? in.range(0, 1) : 1;
  c.moe_dim = 8;
  c.routed_scaling_factor = 1.5;
  c.rms_eps = 1e-6;
  c.rope_theta = 10000.0;
  const int64_t L = in.range(2, 6);
  const int64_t E = in.range(1, L - 1);
  c.n_layers = L;
  c.n_encoder_layers = E;
  c.window = in.range(1, 6);
  c.compress_ratios.assign(size_t(L), 0);
  const bool free_form = in.range(0, 3) == 0;
  if (free_form) {
    // Any ratios, sources and candidate layer: validate() rejects most, and
    // the ones it accepts are schedules the generator never builds (a
    // candidate source in the encoder, several encoder ratios, ...).
    for (int64_t l = 0; l < L; ++l) c.compress_ratios[size_t(l)] = in.range(0, 3);
    const uint64_t kv = in.u64(1), idx = in.u64(1);
    for (int64_t l = 0; l < L; ++l) {
      if ((kv >> l) & 1) c.kv_source_layers.push_back(l);
      if (((kv | idx) >> l) & 1) c.index_source_layers.push_back(l);
    }
    c.candidate_source_layer = in.range(-1, L - 1);
  } else {
    // generators.hpp: SWA-only below the first encoder source (if any), then
    // ratio r_enc or 0; the decoder at r_dec or 0 with layer E a kv source.
    const int64_t r_enc = in.range(1, 3), r_dec = in.range(1, 2);
    const int64_t first_src = in.range(0, E);  // E: no encoder source
    for (int64_t l = first_src; l < E; ++l) c.compress_ratios[size_t(l)] = (l == first_src || in.flag()) ? r_enc : 0;
    for (int64_t l = E; l < L; ++l) c.compress_ratios[size_t(l)] = (l == E || in.flag()) ? r_dec : 0;
    std::set<int64_t> kv, idx;
    if (first_src < E) kv.insert(first_src);
    kv.insert(E);
    for (int64_t l = 0; l < L; ++l)
      if (c.compress_ratios[size_t(l)] > 0 && l != first_src && l != E) {
        const int64_t role = in.range(0, 3);  // 0: kv source, 1: index source, else Reuse
        if (role == 0) kv.insert(l);
        if (role <= 1) idx.insert(l);
      }
    idx.insert(kv.begin(), kv.end());
    c.kv_source_layers.assign(kv.begin(), kv.end());
    c.index_source_layers.assign(idx.begin(), idx.end());
    std::vector<int64_t> dec_idx;
    for (int64_t l : idx)
      if (l >= E) dec_idx.push_back(l);
    c.candidate_source_layer = in.flag() ? in.pick(dec_idx) : -1;
  }
  c.tie_decoder_kv = in.flag();
  c.candidate_block_size = in.range(1, 4);
  c.candidate_topk_blocks = in.range(1, 4);
  return c;
}

void add_around(std::vector<int64_t>& v, int64_t x) {
  v.push_back(x - 1);
  v.push_back(x);
  v.push_back(x + 1);
}

// N in [1, 3R+2], mostly an awkward length: 1, W-1..W+1, R-1..R+1,
// D(W-1)-1..D(W-1)+1, multiples of a compression ratio and of a candidate
// block (in positions) +-1.
int64_t read_length(ByteReader& in, const Config& c, const Plan& p) {
  const int64_t R = p.exact_replay(), max_n = 3 * R + 2;
  std::vector<int64_t> awkward = {1};
  add_around(awkward, p.W);
  add_around(awkward, R);
  add_around(awkward, p.exact_decode_replay());
  for (int64_t r : std::set<int64_t>(c.compress_ratios.begin(), c.compress_ratios.end()))
    for (int64_t k = 1; r > 0 && k <= 3; ++k) add_around(awkward, k * r);
  if (c.candidate_source_layer >= 0) {
    const int64_t block = c.candidate_block_size * c.compress_ratios[size_t(c.candidate_source_layer)];
    for (int64_t k = 1; k <= 3; ++k) add_around(awkward, k * block);
  }
  std::erase_if(awkward, [&](int64_t n) { return n < 1 || n > max_n; });
  if (in.range(0, 3) != 0) return in.pick(awkward);
  return in.range(1, max_n);
}

// K >= 1: around W, R, D(W-1) and N, or any up to N+2.
int64_t read_replay(ByteReader& in, const Plan& p, int64_t N) {
  std::vector<int64_t> v;
  add_around(v, p.W);
  add_around(v, p.exact_replay());
  add_around(v, p.exact_decode_replay());
  add_around(v, N);
  std::erase_if(v, [](int64_t k) { return k < 1; });
  if (in.range(0, 3) != 0) return in.pick(v);
  return in.range(1, N + 2);
}

// 0 <= P <= N: around W and N, or any.
int64_t read_prefix(ByteReader& in, const Plan& p, int64_t N) {
  std::vector<int64_t> v = {0, 1};
  add_around(v, p.W);
  add_around(v, N);
  std::erase_if(v, [&](int64_t x) { return x < 0 || x > N; });
  if (in.range(0, 3) != 0) return in.pick(v);
  return in.range(0, N);
}

std::string flops_match(const Model& m, const RunRequest& r, const RunResult& res) {
  const FlopQuery q = flop_query(r);
  const FlopCount closed = flop_model(m.c, m.p, q), literal = flop_model_by_position(m.c, m.p, q);
  for (size_t l = 0; l < closed.per_layer.size(); ++l)
    for (int k = 0; k < kFlopKinds; ++k) {
      const int64_t got = res.flops.per_layer[l][size_t(k)], want = closed.per_layer[l][size_t(k)];
      if (got != want || literal.per_layer[l][size_t(k)] != want)
        return fmt::format("{} request: layer {} {}: counted {}, flop_model {}, flop_model_by_position {}",
                           mode_name(r.mode), l, flop_kind_name(k), got, want, literal.per_layer[l][size_t(k)]);
    }
  return "";
}

struct Case {
  int64_t N = 0, K = 0, P = 0, steps = 0;
  uint64_t weight_seed = 0;
};

// "" when every property holds, else the first that broke.
std::string check_case(const Model& m, const Case& x) {
  const int64_t N = x.N, K = x.K, P = x.P, steps = x.steps;
  std::string why;
  auto fail = [&](std::string what, std::string s) { return s.empty() ? s : what + ": " + s; };

  // Full mode with decode: finite logits everywhere.
  const RunRequest full_req = m.request(Mode::Full, N, "none", steps);
  const RunResult full = m.run(full_req);
  if (full.logits.rows() != N + steps || !full.logits.allFinite())
    return fmt::format("full mode: logits [{}, {}] for N + decode = {}, all finite: {}", full.logits.rows(),
                       full.logits.cols(), N + steps, full.logits.allFinite());
  if (!(why = flops_match(m, full_req, full)).empty()) return why;

  if (!(why = fail("check_replay_full_equals_full", prop::check_replay_full_equals_full(m, N))).empty()) return why;
  if (!(why = fail("check_cone", prop::check_cone(m, N, K))).empty()) return why;
  if (!(why = fail("check_source_only_write", prop::check_source_only_write(m, N))).empty()) return why;
  if (!(why = fail("check_reuse_selection", prop::check_reuse_selection(m, N))).empty()) return why;
  if (N <= m.p.W) {
    if (!(why = fail("check_bounded_equals_exact_short", prop::check_bounded_equals_exact_short(m, N))).empty())
      return why;
  }

  // ced with replay K and decode: finite, FLOPs as the oracle's, and the
  // decode bound of docs/spec.md §4 at this one K (check_decode_bound searches every
  // K: too slow per input). The probe's decode logits are finite iff
  // K >= min(N, D(W-1)); then the real decode equals decode after full prefill.
  RunRequest ced_req = m.request(Mode::Ced, N, std::to_string(K), steps);
  const RunResult ced = m.run(ced_req);
  if (!ced.logits.allFinite()) return fmt::format("ced replay {}: non-finite logits", K);
  if (!(why = flops_match(m, ced_req, ced)).empty()) return why;
  if (steps > 0) {
    const bool want_exact = K >= predicted_min_exact_decode_replay(m.p, N);
    RunRequest probe_req = ced_req;
    probe_req.poison_truncated = true;
    probe_req.logits = LogitsScope::Last;
    const RunResult probe = m.run(probe_req);
    const bool probe_exact = probe.logits.bottomRows(steps).allFinite();
    if (probe_exact != want_exact)
      return fmt::format("decode after replay {}: oracle says {} (min exact-decode replay {}), the probe says {}", K,
                         want_exact ? "exact" : "inexact", predicted_min_exact_decode_replay(m.p, N),
                         probe_exact ? "exact" : "inexact");
    if (want_exact && !prop::bits_equal(full.logits.bottomRows(steps), ced.logits.bottomRows(steps)))
      return fmt::format("decode after replay {} >= the decode bound differs from decode after full prefill", K);
    if (!(why = fail("check_decode_equals_prefill", prop::check_decode_equals_prefill(m, N, steps))).empty())
      return why;
  }

  // Resume from a prefix P: exact when P <= W (docs/spec.md §6); otherwise finite
  // with the oracle's FLOPs.
  if (P <= m.p.W) {
    if (!(why = fail("check_resume_short_prefix", prop::check_resume_short_prefix(m, N, P))).empty()) return why;
  }
  RunRequest res_req = m.request(Mode::Resume, N, std::to_string(K), steps);
  res_req.prefix_len = P;
  const RunResult res = m.run(res_req);
  if (!res.logits.allFinite()) return fmt::format("resume P {} replay {}: non-finite logits", P, K);
  if (!(why = flops_match(m, res_req, res)).empty()) return why;

  return fail("check_flops", prop::check_flops(m, N));
}

// One line: the schedule and the lengths, each length named when awkward.
std::string describe_case(const Config& c, const Plan& p, const Case& x) {
  auto name = [&](int64_t n) {
    std::vector<std::string> v;
    const int64_t R = p.exact_replay(), Db = p.exact_decode_replay();
    for (auto [base, what] : {std::pair{p.W, "W"}, std::pair{R, "R"}, std::pair{Db, "D(W-1)"}})
      for (int64_t d = -1; d <= 1; ++d)
        if (n == base + d) v.push_back(d == 0 ? std::string(what) : fmt::format("{}{:+}", what, d));
    return v.empty() ? std::string() : fmt::format(" ({})", fmt::join(v, ", "));
  };
  return fmt::format("L {} E {} W {} ratios [{}] kv [{}] idx [{}] cand {} block {} topk_blocks {} index_topk {} "
                     "tie {} | R {} | N {}{} K {}{} P {} decode {} seed {}",
                     c.n_layers, c.n_encoder_layers, c.window, fmt::join(c.compress_ratios, ","),
                     fmt::join(c.kv_source_layers, ","), fmt::join(c.index_source_layers, ","),
                     c.candidate_source_layer, c.candidate_block_size, c.candidate_topk_blocks, c.index_topk,
                     c.tie_decoder_kv, p.exact_replay(), x.N, name(x.N), x.K, name(x.K), x.P, x.steps,
                     x.weight_seed);
}

// CED_FUZZ_FAULT=<fault name> (model/run.hpp) injects a spec violation into
// every run: a negative control showing the target finds it.
Fault injected_fault() {
  static const Fault f = [] {
    const char* name = std::getenv("CED_FUZZ_FAULT");
    return name ? parse_fault(name) : Fault::None;
  }();
  return f;
}

[[noreturn]] void report(const Config& c, const Case& x, const std::string& why) {
  std::fprintf(stderr, "%s", fmt::format("replay_fuzz: PROPERTY VIOLATED: {}\n"
                                        "N = {}, K = {}, P = {}, decode = {}, weight_seed = {}, token_seed = {}\n"
                                        "--- config (TOML) ---\n{}",
                                        why, x.N, x.K, x.P, x.steps, x.weight_seed, prop::kTokenSeed, to_toml(c))
                            .c_str());
  std::fflush(stderr);
  __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const Config c = read_config(in);
  try {
    validate(c);
  } catch (const InputError&) {
    return 0;  // an invalid combination: a clean rejection
  }
  Case x;
  x.weight_seed = prop::kWeightSeed + in.u64(1);
  try {
    const Model m(c, /*f64=*/true, injected_fault(), x.weight_seed);
    x.N = read_length(in, c, m.p);
    x.K = read_replay(in, m.p, x.N);
    x.P = read_prefix(in, m.p, x.N);
    x.steps = in.range(0, 3);
    if (std::getenv("CED_FUZZ_VERBOSE"))
      std::fprintf(stderr, "%s\n", describe_case(c, m.p, x).c_str());
    const std::string why = check_case(m, x);
    if (!why.empty()) report(c, x, why);
  } catch (const std::exception& e) {
    // A valid config and request: no exception is expected, InputError included.
    report(c, x, fmt::format("exception: {}", e.what()));
  }
  return 0;
}
