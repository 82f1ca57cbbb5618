// docs/v41.md §13.6: the CED fault × check matrix on v41-tiny. Each planted fault is a bug a port had in
// its replay (a ring seeded at the tail's row index, a window floor compared with row indices, the cut
// layer's floor the wrong way round, a resume's window rebuilt from H - W + 1), or a tail right in every
// span but one ulp off in its bits. Every cell is asserted: the clean model passes every check, each
// fault fails the check named for it, and each other check passes or fails as written below, with the
// reason for every other check that also sees the fault. A check that starts or stops seeing a fault is
// a change of the matrix, not noise. The matrix is printed whole, with the reason of each FAIL.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "checks/v41_ced_checks.hpp"
#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward.hpp"
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

// The columns, in v41_ced_checks()' order (asserted, so that a reordered suite is not read as a changed
// matrix).
const char* const kChecks[] = {
    "every row replayed is the prefill",  // every
    "bounded = prefill when N <= W",  // bounded
    "spans found are the plan's, bitwise at them",  // spans
    "vllm keeps layer E's tail exact",  // vllmE
    "decode after ced of the decode span is the prefill's",  // decode
    "source-only write = the prefill's cache",  // source
    "resume after a hit of at most W is the cold run",  // resume
    "encoder replay span found is the plan's, bitwise at it",  // encoder
};
constexpr size_t kColumns = std::size(kChecks);

enum Cell : bool { FAIL = false, pass = true };

struct Row {
  V41Fault fault;
  const char* named;  // the check named for the fault (none for the clean model); its cell must be FAIL
  Cell cells[kColumns];
};

}  // namespace

TEST(V41CedFaults, EveryCellOfTheFaultByCheckMatrixIsTheExpectedPassOrFail) {
  // The numbers quoted are seed 41's (the default); CED_SEED=7 gives the same cells.
  // clang-format off
  const std::vector<Row> rows = {
      // The cells in kChecks' order: every, bounded, spans, vllmE, decode, source, resume, encoder.
      {V41Fault::none, nullptr,                       {pass, pass, pass, pass, pass, pass, pass, pass}},
      // spans: the decode probe's step after each ced prefill reads the misplaced ring, so the decode
      // span found is a row longer than the plan's (sglang 46, plan 45).
      {V41Fault::ced_ring_slot_of_row, kChecks[4],    {pass, pass, FAIL, pass, FAIL, pass, pass, pass}},
      // decode: the tail of the decode span is floored at the wrong positions too. encoder: a resume's
      // recomputed rows start at a position F > 0 and the fault floors their windows at row index 0,
      // not at F (the span found is 15, plan 45, and not bitwise).
      {V41Fault::ced_floor_on_row_index, kChecks[2],  {pass, pass, FAIL, pass, FAIL, pass, pass, FAIL}},
      // spans and decode: a flipped cut floor moves each convention's exact spans by W - 1 = 15 (one
      // floored layer fewer or more), so the plan's are no longer found (sglang 31 / 30, plan 46 / 45)
      // nor exact (vllm's step after a prefill of its 30 rows).
      {V41Fault::ced_cut_floor_flipped, kChecks[3],   {pass, pass, FAIL, FAIL, FAIL, pass, pass, pass}},
      // encoder: its search resumes through the same rebuild, one row short, so the span found is one
      // longer than the plan's (46, plan 45).
      {V41Fault::resume_start_off_by_one, kChecks[6], {pass, pass, pass, pass, pass, pass, FAIL, FAIL}},
      // The spans found are the plan's (46 / 45); what fails is each bitwise clause that compares a tail
      // (rows dropped) with the prefill: spans (the last logits at the probe's K, "not bitwise at it")
      // and vllmE (layer E's tail rows). The others cannot see it: every and bounded replay every row
      // (no tail: their run is the prefill, and spans takes it as its reference); decode compares the
      // step after the tail, not the tail's outputs, and the caches it reads come out the same (in the
      // release regime the next layer's fp32 operations round a one-ulp-of-double move away); resume
      // compares two tails that both carry it; encoder and source run no ced tail.
      {V41Fault::ced_replayed_row_ulp, kChecks[2],    {pass, pass, FAIL, FAIL, pass, pass, pass, pass}},
  };
  // clang-format on
  const auto& checks = v41_ced_checks();
  ASSERT_EQ(checks.size(), kColumns);
  for (size_t j = 0; j < kColumns; ++j) ASSERT_STREQ(checks[j].name, kChecks[j]) << "column " << j;
  // Every replay fault (ced-*, resume-*) has its row; the others are the golden gate's (docs/v41.md §12.4).
  for (size_t f = 0; f < v41_fault_names().size(); ++f) {
    const std::string& name = v41_fault_names()[f];
    if (name.rfind("ced-", 0) != 0 && name.rfind("resume-", 0) != 0) continue;
    EXPECT_TRUE(std::any_of(rows.begin(), rows.end(), [&](const Row& r) { return static_cast<size_t>(r.fault) == f; }))
        << name << " has no row in the matrix";
  }
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
  const auto tokens = prompt(kN + 1, m.config().vocab_size, 11);
  std::printf("%-24s", "fault \\ check");
  for (const V41Check& c : checks) std::printf(" | %s", c.name);
  std::printf("\n");
  std::vector<std::string> reasons;
  for (const Row& r : rows) {
    m.set_fault(r.fault);
    const std::string fault = v41_fault_names()[static_cast<size_t>(r.fault)];
    std::printf("%-24s", fault.c_str());
    for (size_t j = 0; j < kColumns; ++j) {
      if (r.named != nullptr && r.named == kChecks[j]) {
        EXPECT_EQ(r.cells[j], FAIL) << "the table: " << fault << " must fail its named check " << r.named;
      }
      const std::string why = checks[j].run(m, hashing(), tokens);
      const bool pass_ = why.empty();
      std::printf(" | %s", pass_ ? "pass" : "FAIL");
      if (!pass_) reasons.push_back(fault + " × " + kChecks[j] + ": " + why);
      EXPECT_EQ(pass_, static_cast<bool>(r.cells[j]))
          << fault << " × " << kChecks[j] << ": expected " << (r.cells[j] ? "pass" : "FAIL") << ", got "
          << (pass_ ? "pass" : "FAIL: " + why);
    }
    std::printf("\n");
  }
  for (const std::string& s : reasons) std::printf("  %s\n", s.c_str());
  m.set_fault(V41Fault::none);
}

// Other tools and tests name the fault by its string (`--fault`, the Python binding): the name is stable and
// reads back to the fault.
TEST(V41CedFaults, TheReplayedRowUlpFaultIsNamedCedReplayedRowUlpBothWays) {
  EXPECT_EQ(v41_fault_names()[static_cast<size_t>(V41Fault::ced_replayed_row_ulp)], "ced-replayed-row-ulp");
  EXPECT_EQ(v41_fault_from_name("ced-replayed-row-ulp"), V41Fault::ced_replayed_row_ulp);
}
