// docs/v41.md §13.6: the CED fault × check matrix on v41-tiny. Each planted fault is a bug a port had in
// its replay (a ring seeded at the tail's row index, a window floor compared with row indices, the cut
// layer's floor the wrong way round, a resume's window rebuilt from H - W + 1); each must fail the check
// named for it, and the clean model must pass every check. The matrix is printed whole, so a check that
// catches more than its own is seen.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "checks/v41_ced_checks.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/forward.hpp"
#include "unit-tests/v41_test_model.hpp"

using namespace ced;
using namespace ced::v41;
using namespace ced::v41::testing;

namespace {

constexpr int64_t kN = 100;  // past every span of v41-tiny (ascend's 91), a hit past the encoder span (45)

const V41EngramHashing& hashing() {
  static const V41EngramHashing h = v41_checkpoint_hashing(tiny_checkpoint().config);
  return h;
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
                                    {V41Fault::ced_cut_floor_flipped, "vllm keeps layer E's tail exact"},
                                    {V41Fault::resume_start_off_by_one, "resume after a hit of at most W is the cold run"}};
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
  const auto tokens = prompt(kN + 1, m.config().vocab_size, 11);
  std::printf("%-24s", "fault \\ check");
  for (const V41Check& c : v41_ced_checks()) std::printf(" | %s", c.name);
  std::printf("\n");
  for (const Expect& e : rows) {
    m.set_fault(e.fault);
    const std::string fault = v41_fault_names()[static_cast<size_t>(e.fault)];
    std::printf("%-24s", fault.c_str());
    for (const V41Check& c : v41_ced_checks()) {
      const std::string why = c.run(m, hashing(), tokens);
      const bool pass = why.empty();
      std::printf(" | %s", pass ? "pass" : "FAIL");
      if (e.caught_by == nullptr) {
        EXPECT_TRUE(pass) << "the clean model fails " << c.name << ": " << why;
      } else if (std::string(c.name) == e.caught_by) {
        EXPECT_FALSE(pass) << fault << " passes its check " << c.name;
      }
    }
    std::printf("\n");
  }
  m.set_fault(V41Fault::none);
}
