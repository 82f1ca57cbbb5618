// Fuzzes the release's CED predictions (docs/v41.md §13) over prompt lengths, replay conventions, replay
// lengths, regimes and decode steps, on v41-tiny.
//
// The input bytes decode (fuzz/byte_reader.hpp) to: a regime (f64, bf16, release); a prompt length N in
// [1, 120], in three inputs of four one of v41-tiny's boundary lengths (v41_boundary_lengths: W ± 1, 2W ± 1,
// index_topk × ratio, the candidate pool, ratio 2's first group, YaRN's original_seq_len, Engram's n-gram
// size, every convention's exact span, each ± 1); a convention; a replay length K, from the convention's exact
// span up to N; 0 to 2 decode steps; a token seed.
//
// Each claim is bitwise (the reference is batch-invariant): a CED prefill replaying K >= the exact span rows
// gives the full prefill's last logits; replaying every row, every row's; for N <= W, a bounded replay (W
// rows) is the prefill; replaying at least the exact decode span, each decode step after it is the decode
// step after the full prefill. A violated claim prints the case and traps. CED_FUZZ_VERBOSE=1 prints each
// case on one line; CED_FUZZ_FAULT=<v41 fault> plants one (v41_fault_names: a negative control).
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fuzz/byte_reader.hpp"
#include "model/error.hpp"
#include "models/v41/boundary_lengths.hpp"
#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward.hpp"
#include "models/v41/numerics.hpp"

namespace {

using namespace ced::v41;
using ced::fuzz::ByteReader;

struct Tiny {
  V41Checkpoint checkpoint;
  V41EngramHashing hashing;
  V41Plan plan;
  std::vector<int64_t> boundaries;
  std::map<V41Regime, std::unique_ptr<V41Model>> models;
};

Tiny& tiny() {
  static Tiny* t = [] {
    auto* x = new Tiny;
    x->checkpoint = make_v41_random_checkpoint(v41_builtin_config("v41-tiny"), 0);
    x->hashing = v41_checkpoint_hashing(x->checkpoint.config);
    x->plan = make_v41_plan(x->checkpoint.config);
    for (const V41BoundaryLength& b : v41_boundary_lengths(x->checkpoint.config, x->plan))
      if (b.n <= 120) x->boundaries.push_back(b.n);
    return x;
  }();
  return *t;
}

// The model of a regime, made at its first use (under the sanitizers a model costs seconds).
const V41Model& model_of(Tiny& t, V41Regime r) {
  auto& m = t.models[r];
  if (!m) {
    m = std::make_unique<V41Model>(t.checkpoint.config, t.checkpoint.weights, r);
    m->set_captures(false);
    if (const char* fault = std::getenv("CED_FUZZ_FAULT"); fault && *fault) m->set_fault(v41_fault_from_name(fault));
  }
  return *m;
}

[[noreturn]] void broke(const std::string& what, const std::string& case_line) {
  std::fprintf(stderr, "v41_replay_fuzz: %s\n  case: %s\n", what.c_str(), case_line.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  Tiny& t = tiny();
  const V41Regime regime = in.pick({V41Regime::f64, V41Regime::bf16, V41Regime::release});
  const int64_t N = in.range(0, 3) < 3 ? in.pick(t.boundaries) : in.range(1, 120);
  const auto& conventions = v41_replay_conventions();
  const V41ReplayConvention& conv = conventions[static_cast<size_t>(in.range(0, int64_t(conventions.size()) - 1))];
  const int64_t span = std::min(N, v41_exact_span(t.plan, conv)), decode_span = std::min(N, v41_exact_decode_span(t.plan, conv));
  const int64_t K = in.range(span, N);
  const int64_t steps = in.range(0, 2);
  const uint64_t token_seed = in.u64(8);
  const V41Model& m = model_of(t, regime);
  const int64_t V = m.config().vocab_size;
  std::mt19937_64 g(token_seed);
  std::vector<int64_t> tokens(static_cast<size_t>(N + steps));
  for (int64_t& x : tokens) x = static_cast<int64_t>(g() % static_cast<uint64_t>(V));
  const std::span<const int64_t> prompt(tokens.data(), static_cast<size_t>(N));
  const std::string case_line = fmt::format("regime {}, N {}, convention {}, K {} (exact span {}, decode span {}), {} decode "
                                            "steps, token seed {}", v41_regime_name(regime), N, conv.name, K, span,
                                            decode_span, steps, token_seed);
  if (std::getenv("CED_FUZZ_VERBOSE")) std::printf("%s\n", case_line.c_str());
  V41DecodeState full_state, ced_state;
  const V41ForwardResult full = m.forward(prompt, t.hashing, &full_state);
  const V41ForwardResult ced = m.forward_ced(prompt, t.hashing, K, conv, K >= decode_span ? &ced_state : nullptr);
  const std::span<const double> full_last = std::span<const double>(full.logits).last(static_cast<size_t>(V));
  if (ced.logits.size() < static_cast<size_t>(V) ||
      !same_bits(std::span<const double>(ced.logits).last(static_cast<size_t>(V)), full_last))
    broke(fmt::format("a ced prefill replaying {} >= the exact span's {} rows: its last logits are not the prefill's", K, span),
          case_line);
  if (K == N && !same_bits(ced.logits, full.logits))
    broke("a ced prefill replaying every row: its logits are not the prefill's", case_line);
  if (N <= t.plan.W) {
    const V41ForwardResult bounded = m.forward_ced(prompt, t.hashing, std::min(N, t.plan.W), conv);
    if (!same_bits(bounded.logits, full.logits))
      broke(fmt::format("N = {} <= W: a bounded replay's logits are not the prefill's", N), case_line);
  }
  if (K >= decode_span)
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t token = tokens[static_cast<size_t>(N + s)];
      const V41ForwardResult a = m.decode_step(token, t.hashing, full_state), b = m.decode_step(token, t.hashing, ced_state);
      if (!same_bits(a.logits, b.logits))
        broke(fmt::format("decode step {} after a ced prefill replaying {} >= the decode span's {} rows is not the one "
                          "after the prefill", s, K, decode_span),
              case_line);
    }
  return 0;
}
