// docs/v41.md §13.6: the CED fault × check matrix on v41-tiny. Each planted fault is a bug a port had in
// its replay (a ring seeded at the tail's row index, a window floor compared with row indices, the cut
// layer's floor the wrong way round); each must fail the check named for it, and the clean model must
// pass every check. The matrix is printed whole, so a check that catches more than its own is seen.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "models/v41/checkpoint.hpp"
#include "models/v41/forward.hpp"
#include "models/v41/spans.hpp"
#include "unit-tests/v41_test_model.hpp"

using namespace ced;
using namespace ced::v41;
using namespace ced::v41::testing;

namespace {

constexpr int64_t kN = 60;  // past the spans of sglang (46) and vllm (31) on v41-tiny

struct Check {
  const char* name;
  std::function<bool(V41Model&)> passes;
};

const V41EngramHashing& hashing() {
  static const V41EngramHashing h = v41_checkpoint_hashing(tiny_checkpoint().config);
  return h;
}

std::vector<int64_t> tokens() { return prompt(kN + 1, tiny_checkpoint().config.vocab_size, 11); }

std::vector<int64_t> prompt_only() {
  auto t = tokens();
  t.pop_back();
  return t;
}

const std::vector<Check>& checks() {
  static const std::vector<Check> c = {
      {"every row replayed is the prefill",
       [](V41Model& m) {
         return m.forward_ced(prompt_only(), hashing(), kN, v41_replay_convention("sglang")).logits ==
                m.forward(prompt_only(), hashing()).logits;
       }},
      {"spans found are the plan's, bitwise at them",
       [](V41Model& m) {
         for (const char* name : {"sglang", "vllm"}) {
           const V41ReplayConvention& conv = v41_replay_convention(name);
           const V41FoundSpans f = v41_empirical_spans(m, tokens(), hashing(), conv);
           if (f.last_probe != v41_exact_span(m.plan(), conv) ||
               f.decode_probe != v41_exact_decode_span(m.plan(), conv) || !f.bitwise_at_probe)
             return false;
         }
         return true;
       }},
      {"decode after ced of the decode span is the prefill's",
       [](V41Model& m) {
         const auto t = tokens();
         const auto p = prompt_only();
         const V41ReplayConvention& conv = v41_replay_convention("sglang");
         V41DecodeState a, b;
         m.forward(p, hashing(), &a);
         m.forward_ced(p, hashing(), v41_exact_decode_span(m.plan(), conv), conv, &b);
         return m.decode_step(t.back(), hashing(), a).logits == m.decode_step(t.back(), hashing(), b).logits;
       }},
      {"vllm keeps layer E's tail exact",
       [](V41Model& m) {
         const int64_t E = m.plan().E, W = m.config().window_size, row = m.config().hc_mult * m.config().dim;
         const V41ForwardResult full = m.forward(prompt_only(), hashing());
         const V41ForwardResult ced = m.forward_ced(prompt_only(), hashing(), W, v41_replay_convention("vllm"));
         const auto& f = full.layers[static_cast<size_t>(E)].out;
         const auto& c = ced.layers[static_cast<size_t>(E)].out;
         return std::equal(f.end() - W * row, f.end(), c.end() - W * row);
       }},
  };
  return c;
}

struct Expect {
  V41Fault fault;
  const char* caught_by;  // the check named for it
};

}  // namespace

TEST(V41CedFaults, EachPlantedReplayBugFailsItsNamedCheckAndTheCleanModelPassesThemAll) {
  const std::vector<Expect> rows = {{V41Fault::none, nullptr},
                                    {V41Fault::ced_ring_slot_of_row, "decode after ced of the decode span is the prefill's"},
                                    {V41Fault::ced_floor_on_row_index, "spans found are the plan's, bitwise at them"},
                                    {V41Fault::ced_cut_floor_flipped, "vllm keeps layer E's tail exact"}};
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
  m.set_captures(true);  // the layer-E check reads its tail rows
  std::printf("%-24s", "fault \\ check");
  for (const Check& c : checks()) std::printf(" | %s", c.name);
  std::printf("\n");
  for (const Expect& e : rows) {
    m.set_fault(e.fault);
    const std::string fault = v41_fault_names()[static_cast<size_t>(e.fault)];
    std::printf("%-24s", fault.c_str());
    for (const Check& c : checks()) {
      const bool pass = c.passes(m);
      std::printf(" | %s", pass ? "pass" : "FAIL");
      if (e.caught_by == nullptr) EXPECT_TRUE(pass) << "the clean model fails " << c.name;
      else if (std::string(c.name) == e.caught_by) EXPECT_FALSE(pass) << fault << " passes its check " << c.name;
    }
    std::printf("\n");
  }
  m.set_fault(V41Fault::none);
}
