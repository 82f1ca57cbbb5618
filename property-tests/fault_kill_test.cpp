// Negative controls: every fault injection must be caught by at least one
// property check (SPEC-violating models must not pass the suite).
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "property-tests/ced_checks.hpp"
#include "tools/golden_set.hpp"

using namespace ced;
using namespace ced::prop;

namespace {

struct NamedCheck {
  const char* name;
  std::function<std::string(const Config&, Fault)> run;
};

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
      // The committed golden tensors (reference-f64) as an independent known answer.
      {"golden(tiny)", [](const Config& c, Fault f) -> std::string {
         if (c.name != "tiny") return "";
         tools::GateOptions g;
         g.dir = tools::default_golden_dir();
         g.only = "tiny.h5";
         g.fault = f;
         g.quiet = true;
         const auto rep = tools::run_gate(g);
         return rep.failures.empty() ? "" : rep.failures.front().what;
       }},
  };
}

}  // namespace

TEST(FaultKillTable, UnfaultedModelPassesEveryCheck) {
  for (const char* cfg : {"tiny", "small"})
    for (const auto& ch : checks()) EXPECT_EQ(ch.run(builtin_config(cfg), Fault::None), "") << cfg << " " << ch.name;
}

TEST(FaultKillTable, EveryFaultIsCaughtByAtLeastOneCheck) {
  // tiny has every layer kind; small is checked unfaulted above.
  std::printf("%-26s %s\n", "fault", "caught by (config tiny)");
  int survivors = 0;
  for (Fault f : all_faults()) {
    std::string caught;
    for (const auto& ch : checks()) {
      std::string msg;
      try {
        msg = ch.run(builtin_config("tiny"), f);
      } catch (const std::exception& e) {
        msg = std::string("threw: ") + e.what();
      }
      const bool hit = !msg.empty();
      if (hit) caught += std::string(caught.empty() ? "" : ", ") + ch.name;
    }
    std::printf("%-26s %s\n", fault_name(f), caught.empty() ? "SURVIVED" : caught.c_str());
    if (caught.empty()) {
      ++survivors;
      ADD_FAILURE() << "fault " << fault_name(f) << " survived every check";
    }
  }
  EXPECT_EQ(survivors, 0);
}
