// Negative controls as an expected check × fault matrix: for every fault
// injection, the matrix below says which checks must catch it ('x') and which
// cannot see it ('.'). Every cell is run and compared: an expected catch that
// no longer happens means a check went vacuous; an unexpected one means the
// matrix is out of date. Each fault must also be caught by some check.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>

#include "checks/ced_checks.hpp"
#include "golden/golden_set.hpp"

using namespace ced;
using namespace ced::prop;

namespace {

struct NamedCheck {
  const char* name;
  std::function<std::string(const Config&, Fault)> run;
};

std::string golden_tiny(const Config& c, Fault f, const std::string& backend) {
  if (c.name != "tiny") return "golden(tiny) runs on tiny only";
  golden::GateOptions g;
  g.dir = golden::default_golden_dir();
  g.backend = backend;
  g.only = "tiny.h5";
  g.fault = f;
  g.quiet = true;
  const auto rep = golden::run_gate(g);
  return rep.failures.empty() ? "" : rep.failures.front().what;
}

// The checks run on tiny (every layer kind) unless named "(wide)": those run
// on tiny widened until the FFN's matmuls open their OpenMP parallel region.
std::vector<NamedCheck> checks() {
  auto on = [](auto f) {
    return [f](const Config& c, Fault fault) {
      const Model m(c, true, fault);
      return f(m);
    };
  };
  return {
      {"replay-full=full", on([](const Model& m) { return check_replay_full_equals_full(m, 2 * m.p.exact_replay()); })},
      {"cone", on([](const Model& m) { return check_cone(m, 2 * m.p.exact_replay(), m.p.W + 1); })},
      {"min-exact-replay", on([](const Model& m) { return check_min_exact_replay(m, 2 * m.p.exact_replay()); })},
      {"decode-bound", on([](const Model& m) { return check_decode_bound(m, 2 * m.p.exact_replay(), 2); })},
      {"bounded=exact(N<=W)", on([](const Model& m) { return check_bounded_equals_exact_short(m, m.p.W); })},
      {"source-only-write", on([](const Model& m) { return check_source_only_write(m, 2 * m.p.exact_replay() + 1); })},
      {"reuse-selection", on([](const Model& m) { return check_reuse_selection(m, 2 * m.p.exact_replay()); })},
      {"shared-kv", [](const Config& c, Fault f) { return check_shared_kv(c, 2 * make_plan(c).exact_replay(), f); }},
      {"resume(P<=W)", on([](const Model& m) { return check_resume_short_prefix(m, 2 * m.p.exact_replay(), m.p.W); })},
      {"flops=oracle", on([](const Model& m) { return check_flops(m, 2 * m.p.exact_replay() + 1); })},
      {"decode=prefill", on([](const Model& m) { return check_decode_equals_prefill(m, 2 * m.p.exact_replay(), 3); })},
      // The old thread test's size (N = 37 on tiny): no matmul reaches the
      // parallel threshold, so it cannot see a thread-dependent reduction.
      {"threads(narrow)", [](const Config& c, Fault f) {
         const Model m(c, false, f);
         return check_thread_invariance(m, 37);
       }},
      {"threads(wide)", [](const Config& c, Fault f) {
         const Model m(wide_config(c), false, f);
         return check_thread_invariance(m, 40);
       }},
      {"batch(wide)", [](const Config& c, Fault f) {
         const Model m(wide_config(c), false, f);
         return check_batch_invariance(m, 40, 8);
       }},
      // The committed golden tensors as an independent known answer: the
      // reference-f64 gate, and the f32 gate under the stored calibration.
      {"golden(tiny)", [](const Config& c, Fault f) { return golden_tiny(c, f, "reference-f64"); }},
      {"golden-f32(tiny)", [](const Config& c, Fault f) { return golden_tiny(c, f, "reference"); }},
  };
}

// The expected matrix, one row per fault, one cell per check in checks()
// order: 'x' must catch, '.' cannot see it. Why the dots: a fault every run
// carries alike (sink-dropped, rope-inverse-skipped, tie-break-reversed,
// ffn-output-scaled) leaves every CED equivalence intact, so only the golden
// tensors see it; the invariance checks compare a model with itself on other
// threads or batches, so only a fault that depends on the thread or on the
// batch moves them (compressor-block-shifted lets a position see an entry
// that only a longer batch has completed); a thread-dependent reduction
// sits in a matmul, which opens its parallel region only on the wide model,
// so no tiny check and no tiny golden file sees it. flops=oracle catches the
// faults that change the work done. bounded=exact(N<=W) catches none of these
// faults (with N <= W both replays cover every position); checks_plant_test
// proves it can still fail.
const std::map<std::string, std::string>& expected_matrix() {
  static const std::map<std::string, std::string> m = {
      //                              replay-full=full
      //                              | cone
      //                              | | min-exact-replay
      //                              | | | decode-bound
      //                              | | | | bounded=exact(N<=W)
      //                              | | | | | source-only-write
      //                              | | | | | | reuse-selection
      //                              | | | | | | | shared-kv
      //                              | | | | | | | | resume(P<=W)
      //                              | | | | | | | | | flops=oracle
      //                              | | | | | | | | | | decode=prefill
      //                              | | | | | | | | | | | threads(narrow)
      //                              | | | | | | | | | | | | threads(wide)
      //                              | | | | | | | | | | | | | batch(wide)
      //                              | | | | | | | | | | | | | | golden(tiny)
      //                              | | | | | | | | | | | | | | | golden-f32(tiny)
      {"window-off-by-one",          ". x x x . . . . . x . . . . x x"},
      {"replay-start-ignored",       ". x x x . . . . . x . . . . x x"},
      {"reuse-own-selection",        ". . . . . . x . . x . . . . x x"},
      {"tie-break-reversed",         ". . . . . . . . . . . . . . x x"},
      {"source-only-wrong-layer",    "x x x x . x . . x . . . . . x x"},
      {"sink-dropped",               ". . . . . . . . . . . . . . x x"},
      {"compressor-block-shifted",   ". . . . . . . . . x x . . x x x"},
      {"pool-pin-dropped",           ". . . . . . . . . x . . . . x x"},
      {"resume-replay-short",        ". . . . . . . . x x . . . . x x"},
      {"rope-inverse-skipped",       ". . . . . . . . . . . . . . x x"},
      {"ffn-output-scaled",          ". . . . . . . . . . . . . . x x"},
      {"thread-dependent-reduction", ". . . . . . . . . . . . x x . ."},
  };
  return m;
}

}  // namespace

TEST(FaultKillTable, UnfaultedModelPassesEveryCheck) {
  for (const char* cfg : {"tiny", "small"})
    for (const auto& ch : checks()) {
      const std::string name = ch.name;
      if (name.rfind("golden", 0) == 0 && std::string(cfg) != "tiny") continue;
      // reference_properties_test runs the invariance checks on small's wide variant.
      if (name.rfind("threads", 0) == 0 || name.rfind("batch", 0) == 0) {
        if (std::string(cfg) != "tiny") continue;
      }
      EXPECT_EQ(ch.run(builtin_config(cfg), Fault::None), "") << cfg << " " << ch.name;
    }
}

TEST(FaultKillTable, EveryCellOfTheExpectedCheckByFaultMatrixHolds) {
  const auto cs = checks();
  const auto& want = expected_matrix();
  ASSERT_EQ(want.size(), all_faults().size()) << "a fault without a row in the expected matrix";
  std::printf("%-27s", "fault \\ check");
  for (const auto& ch : cs) std::printf(" %s", ch.name);
  std::printf("\n");
  for (Fault f : all_faults()) {
    const auto row = want.find(fault_name(f));
    ASSERT_NE(row, want.end()) << "no row for fault " << fault_name(f);
    std::string cells = row->second;  // cells are written space-separated, to line up under the columns
    cells.erase(std::remove(cells.begin(), cells.end(), ' '), cells.end());
    ASSERT_EQ(cells.size(), cs.size()) << "row of " << fault_name(f) << " has the wrong number of cells";
    std::string got;
    int caught = 0;
    for (size_t i = 0; i < cs.size(); ++i) {
      std::string msg;
      try {
        msg = cs[i].run(builtin_config("tiny"), f);
      } catch (const std::exception& e) {
        msg = std::string("threw: ") + e.what();
      }
      const bool hit = !msg.empty();
      caught += hit;
      got += hit ? 'x' : '.';
      const bool expect = cells[i] == 'x';
      if (expect && !hit)
        ADD_FAILURE() << "check " << cs[i].name << " no longer catches fault " << fault_name(f)
                      << " (the matrix expects it to: the check went vacuous)";
      if (!expect && hit)
        ADD_FAILURE() << "check " << cs[i].name << " now catches fault " << fault_name(f) << ": " << msg
                      << " (update the expected matrix if that is right)";
      if (expect && hit) RecordProperty(std::string(fault_name(f)) + "." + cs[i].name, msg);
    }
    std::printf("%-27s %s  caught by %d\n", fault_name(f), got.c_str(), caught);
    EXPECT_GT(caught, 0) << "fault " << fault_name(f) << " survived every check";
  }
}
