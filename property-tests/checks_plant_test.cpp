// Tests of the tests: every check of the
// property library, fed a planted difference in each thing it compares, must
// fail. The plants go in through a Backend wrapper (plant.hpp) at the results
// of one kind of run the check makes: one ulp in one logit or one layer
// output, one selection entry, a position label, a finite row made NaN or the
// reverse, one FLOP count, a cache matrix, a capture or kv source removed, or
// values copied from the run the check compares against. A plant whose run
// never happens or which finds nothing to change is a failure of this test,
// not a pass, so a check that (through a slip) compares a run with itself, or
// stops making the run it should compare against, is caught here.
#include <gtest/gtest.h>

#include <cstdio>

#include "checks/ced_checks.hpp"
#include "property-tests/plant.hpp"

using namespace ced;
using namespace ced::prop;

namespace {

// tiny: L = 8, E = 4, W = 4, R = 13, decode bound D(W-1) = 12; layers 1 Full
// r2, 2 Reindex, 3 Reuse (idx_src 2), 4 = E Full r1, 5 Reuse (idx_src 4),
// 6 Reindex, 7 Reuse (idx_src 6); kv sources 1 (r = 2) and 4.
constexpr int64_t kE = 4;

struct CheckUnderTest {
  const char* name;
  std::function<std::string(const BackendDecorator&)> run;
  std::vector<Plant> plants;
};

using Pred = std::function<bool(const RunRequest&)>;
RunMatch any_model(Pred f) {
  return [f](const std::string&, const RunRequest& r) { return f(r); };
}
RunMatch model(const std::string& label, Pred f) {
  return [label, f](const std::string& l, const RunRequest& r) { return l == label && f(r); };
}
Pred full_mode(int64_t decode = -1, int64_t n = -1) {
  return [=](const RunRequest& r) {
    return r.mode == Mode::Full && (decode < 0 || r.decode_steps == decode) && (n < 0 || r.n_prompt == n);
  };
}
Pred ced_mode(const std::string& replay, bool poison = false) {
  return [=](const RunRequest& r) {
    return r.mode == Mode::Ced && r.replay.str() == replay && r.poison_truncated == poison;
  };
}

Plant plant(std::string name, RunMatch match, PlantKind kind, int64_t layer = 0, int64_t row = -1) {
  Plant p;
  p.name = std::move(name);
  p.match = std::move(match);
  p.kind = kind;
  p.layer = layer;
  p.row = row;
  return p;
}

// The things a bitwise comparison of two captured runs reads, planted into `side`.
void bitwise_run_plants(std::vector<Plant>& out, const std::string& side, const RunMatch& m) {
  out.push_back(plant(side + ": last logit row", m, PlantKind::Logit, 0, -1));
  out.push_back(plant(side + ": first logit row", m, PlantKind::Logit, 0, 0));
  out.push_back(plant(side + ": last logits position label", m, PlantKind::Position, 0, -1));
  out.push_back(plant(side + ": layer 0 out", m, PlantKind::LayerOut, 0, -1));
  out.push_back(plant(side + ": layer E out", m, PlantKind::LayerOut, kE, -1));
  out.push_back(plant(side + ": last layer out, first row", m, PlantKind::LayerOut, -1, 0));
  out.push_back(plant(side + ": layer 1 topk", m, PlantKind::Topk, 1, -1));
  out.push_back(plant(side + ": layer 6 topk", m, PlantKind::Topk, 6, 0));
  out.push_back(plant(side + ": layer 1 selection flag", m, PlantKind::TopkFlagDropped, 1));
  out.push_back(plant(side + ": last layer position label", m, PlantKind::LayerPosition, -1, -1));
  out.push_back(plant(side + ": last captured layer removed", m, PlantKind::LayerDropped));
}

std::function<std::string(const BackendDecorator&)> on(const Config& c, bool f64,
                                                        std::function<std::string(const Model&)> f) {
  return [c, f64, f](const BackendDecorator& wrap) {
    Model m(c, f64);
    if (wrap) m.be = wrap(std::move(m.be), "m");
    return f(m);
  };
}

std::vector<CheckUnderTest> checks_under_test() {
  const Config tiny = builtin_config("tiny");
  const Config wide = wide_config(tiny);
  std::vector<CheckUnderTest> v;

  {  // ced replay = full vs full mode, bitwise (N = 2R).
    CheckUnderTest c{"replay-full=full", on(tiny, true, [](const Model& m) { return check_replay_full_equals_full(m, 26); }), {}};
    bitwise_run_plants(c.plants, "full run", any_model(full_mode()));
    bitwise_run_plants(c.plants, "ced replay=full run", any_model(ced_mode("full")));
    v.push_back(std::move(c));
  }
  {  // bounded vs exact replay with N <= W (N = W = 4).
    CheckUnderTest c{"bounded=exact(N<=W)", on(tiny, true, [](const Model& m) { return check_bounded_equals_exact_short(m, 4); }), {}};
    bitwise_run_plants(c.plants, "bounded run", any_model(ced_mode("bounded")));
    bitwise_run_plants(c.plants, "exact run", any_model(ced_mode("exact")));
    v.push_back(std::move(c));
  }
  {  // cone: N = 26, K = W + 1 = 5, s = 21. Layer E's last row (p = 25) is
     // inside the cone; the last layer's last row is outside (25 - 4·3 < 21);
     // layer E's rows 21..23 are truncated.
    CheckUnderTest c{"cone", on(tiny, true, [](const Model& m) { return check_cone(m, 26, 5); }), {}};
    const RunMatch full = any_model(full_mode()), real = any_model(ced_mode("5")), probe = any_model(ced_mode("5", true));
    c.plants.push_back(plant("full run: encoder layer 0 out", full, PlantKind::LayerOut, 0, -1));
    c.plants.push_back(plant("full run: layer E out inside the cone", full, PlantKind::LayerOut, kE, -1));
    c.plants.push_back(plant("full run: last captured layer removed", full, PlantKind::LayerDropped));
    c.plants.push_back(plant("ced run: encoder layer 0 out", real, PlantKind::LayerOut, 0, -1));
    c.plants.push_back(plant("ced run: layer E out inside the cone", real, PlantKind::LayerOut, kE, -1));
    c.plants.push_back(plant("ced run: layer E first position label", real, PlantKind::LayerPosition, kE, 0));
    c.plants.push_back(plant("ced run: last captured layer removed", real, PlantKind::LayerDropped));
    Plant copy = plant("ced run: layer E's truncated rows equal to full mode's", real, PlantKind::CopyLayerOut, kE);
    copy.source = full;
    c.plants.push_back(copy);
    c.plants.push_back(plant("probe run: layer E exact row made NaN", probe, PlantKind::LayerOutRowFinite, kE, -1));
    c.plants.push_back(plant("probe run: last layer inexact row made finite", probe, PlantKind::LayerOutRowFinite, -1, -1));
    c.plants.push_back(plant("probe run: last captured layer removed", probe, PlantKind::LayerDropped));
    v.push_back(std::move(c));
  }
  {  // minimal exact replay: N = 26, oracle min(N, R) = 13.
    CheckUnderTest c{"min-exact-replay", on(tiny, true, [](const Model& m) { return check_min_exact_replay(m, 26); }), {}};
    c.plants.push_back(plant("probe at K = 13: last logits made NaN", any_model(ced_mode("13", true)), PlantKind::LogitsRowFinite, 0, -1));
    c.plants.push_back(plant("probe at K = 12: last logits made finite", any_model(ced_mode("12", true)), PlantKind::LogitsRowFinite, 0, -1));
    c.plants.push_back(plant("full run: last logit", any_model(full_mode()), PlantKind::Logit));
    c.plants.push_back(plant("ced K = 13 run: last logit", any_model(ced_mode("13")), PlantKind::Logit));
    v.push_back(std::move(c));
  }
  {  // decode bound: N = 26, 2 steps, oracle min(N, D(W-1)) = 12.
    CheckUnderTest c{"decode-bound", on(tiny, true, [](const Model& m) { return check_decode_bound(m, 26, 2); }), {}};
    c.plants.push_back(plant("probe at K = 12: last decode logits made NaN", any_model(ced_mode("12", true)), PlantKind::LogitsRowFinite, 0, -1));
    c.plants.push_back(plant("probe at K = 11: decode logits made finite", any_model(ced_mode("11", true)), PlantKind::LogitsRowFinite, 0, -2));
    c.plants.push_back(plant("full run: last decode logit", any_model(full_mode()), PlantKind::Logit));
    c.plants.push_back(plant("ced K = 12 run: last decode logit", any_model(ced_mode("12")), PlantKind::Logit));
    v.push_back(std::move(c));
  }
  {  // source-only write: N = 27 leaves one pending row in kv source 0 (r = 2).
    CheckUnderTest c{"source-only-write", on(tiny, true, [](const Model& m) { return check_source_only_write(m, 27); }), {}};
    const char* what[] = {"entries", "index keys", "pending c", "pending z"};
    for (const auto& [side, m] : {std::pair<std::string, RunMatch>{"full run", any_model(full_mode())},
                                  std::pair<std::string, RunMatch>{"ced run", any_model(ced_mode("bounded"))}}) {
      for (int k = 0; k < 4; ++k) {
        Plant p = plant(side + ": kv source 0 " + what[k], m, PlantKind::CacheMatrix, 0);
        p.kind_index = k;
        c.plants.push_back(p);
      }
      for (int k = 0; k < 2; ++k) {
        Plant p = plant(side + ": last kv source " + what[k], m, PlantKind::CacheMatrix, -1);
        p.kind_index = k;
        c.plants.push_back(p);
      }
      c.plants.push_back(plant(side + ": last kv source removed", m, PlantKind::CacheSourceDropped));
    }
    v.push_back(std::move(c));
  }
  {  // Reuse layers 3, 5, 7 against their idx_src 2, 4, 6, in a full and a ced run.
    CheckUnderTest c{"reuse-selection", on(tiny, true, [](const Model& m) { return check_reuse_selection(m, 26); }), {}};
    for (const auto& [side, m] : {std::pair<std::string, RunMatch>{"full run", any_model(full_mode())},
                                  std::pair<std::string, RunMatch>{"ced run", any_model(ced_mode("bounded"))}}) {
      for (int64_t l : {2, 3, 4, 5, 6, 7})
        c.plants.push_back(plant(side + ": layer " + std::to_string(l) + " topk", m, PlantKind::Topk, l, -1));
      c.plants.push_back(plant(side + ": Reuse layer 3 position label", m, PlantKind::LayerPosition, 3, -1));
      c.plants.push_back(plant(side + ": Reuse layer 3 selection flag", m, PlantKind::TopkFlagDropped, 3));
      c.plants.push_back(plant(side + ": last captured layer removed", m, PlantKind::LayerDropped));
    }
    v.push_back(std::move(c));
  }
  {  // tied decoder sources vs Reindex layers, and untied must differ.
    CheckUnderTest c{"shared-kv", [tiny](const BackendDecorator& wrap) { return check_shared_kv(tiny, 26, Fault::None, wrap); }, {}};
    for (const char* label : {"tied", "reindex"}) {
      c.plants.push_back(plant(std::string(label) + " model, full run: last logit", model(label, full_mode()), PlantKind::Logit));
      c.plants.push_back(plant(std::string(label) + " model, ced run: last logit", model(label, ced_mode("bounded")), PlantKind::Logit));
    }
    Plant copy = plant("untied model, full run: logits equal to the tied model's", model("untied", full_mode()), PlantKind::CopyLogits);
    copy.source = model("tied", full_mode());
    c.plants.push_back(copy);
    v.push_back(std::move(c));
  }
  {  // resume with P = W = 4 against ced from scratch.
    CheckUnderTest c{"resume(P<=W)", on(tiny, true, [](const Model& m) { return check_resume_short_prefix(m, 26, 4); }), {}};
    const RunMatch res = any_model([](const RunRequest& r) { return r.mode == Mode::Resume; });
    const RunMatch ced = any_model(ced_mode("bounded"));
    c.plants.push_back(plant("resume run: last logit", res, PlantKind::Logit));
    c.plants.push_back(plant("resume run: last position label", res, PlantKind::Position));
    c.plants.push_back(plant("ced run: last logit", ced, PlantKind::Logit));
    c.plants.push_back(plant("ced run: last position label", ced, PlantKind::Position));
    v.push_back(std::move(c));
  }
  {  // resume through a saved cache (P = 11) against resume in memory.
    CheckUnderTest c{"resume-saved-cache", on(tiny, true, [](const Model& m) { return check_resume_saved_cache(m, 26, 11); }), {}};
    const RunMatch mem = any_model([](const RunRequest& r) { return r.mode == Mode::Resume && !r.cache_in; });
    const RunMatch loaded = any_model([](const RunRequest& r) { return r.mode == Mode::Resume && bool(r.cache_in); });
    c.plants.push_back(plant("in-memory resume: last logit", mem, PlantKind::Logit));
    c.plants.push_back(plant("in-memory resume: kv source 0 entries it saves", mem, PlantKind::CacheMatrix, 0));
    c.plants.push_back(plant("resume from the file: last logit", loaded, PlantKind::Logit));
    v.push_back(std::move(c));
  }
  {  // FLOP counter = oracle, on each of the four runs, each kind.
    CheckUnderTest c{"flops=oracle", on(tiny, true, [](const Model& m) { return check_flops(m, 27); }), {}};
    const std::pair<std::string, RunMatch> runs[] = {
        {"full run", any_model(full_mode())},
        {"ced bounded run", any_model(ced_mode("bounded"))},
        {"ced K = 9 run", any_model(ced_mode("9"))},
        {"resume run", any_model([](const RunRequest& r) { return r.mode == Mode::Resume; })}};
    for (const auto& [side, m] : runs) {
      for (int k = 0; k < kFlopKinds; ++k) {
        // layer 1 (Full, r = 2) has every per-layer kind; the lm_head is the last row.
        Plant p = plant(side + ": " + flop_kind_name(k), m, PlantKind::Flops, k == kFlopLmHead ? -1 : 1);
        p.kind_index = k;
        c.plants.push_back(p);
      }
      c.plants.push_back(plant(side + ": an extra FLOP row", m, PlantKind::FlopsExtraRow));
    }
    v.push_back(std::move(c));
  }
  {  // decode after full prefill vs a longer prefill: N = 26, K = 3.
    CheckUnderTest c{"decode=prefill", on(tiny, true, [](const Model& m) { return check_decode_equals_prefill(m, 26, 3); }), {}};
    c.plants.push_back(plant("decode run: last decode logit", any_model(full_mode(3)), PlantKind::Logit));
    c.plants.push_back(plant("decode run: first decode logit", any_model(full_mode(3)), PlantKind::Logit, 0, -3));
    c.plants.push_back(plant("longer prefill: last logit", any_model(full_mode(0)), PlantKind::Logit));
    v.push_back(std::move(c));
  }
  {  // 1 vs 2 threads on the wide model: the two runs have the same request.
    CheckUnderTest c{"thread-invariance(wide)", on(wide, false, [](const Model& m) { return check_thread_invariance(m, 40); }), {}};
    for (int occ : {0, 1}) {
      const std::string side = occ == 0 ? "1-thread run" : "2-thread run";
      for (Plant p : {plant(side + ": last logit", any_model(ced_mode("bounded")), PlantKind::Logit),
                      plant(side + ": layer 0 out", any_model(ced_mode("bounded")), PlantKind::LayerOut, 0, 0),
                      plant(side + ": last layer out", any_model(ced_mode("bounded")), PlantKind::LayerOut, -1, -1),
                      plant(side + ": layer 1 topk", any_model(ced_mode("bounded")), PlantKind::Topk, 1, -1)}) {
        p.occurrence = occ;
        c.plants.push_back(p);
      }
    }
    v.push_back(std::move(c));
  }
  {  // batch of 40 vs 48 positions on the wide model.
    CheckUnderTest c{"batch-invariance(wide)", on(wide, false, [](const Model& m) { return check_batch_invariance(m, 40, 8); }), {}};
    for (int64_t n : {40, 48}) {
      const std::string side = "batch of " + std::to_string(n);
      const RunMatch m = any_model(full_mode(-1, n));
      c.plants.push_back(plant(side + ": first logit row", m, PlantKind::Logit, 0, 0));
      c.plants.push_back(plant(side + ": layer 0 out, position 0", m, PlantKind::LayerOut, 0, 0));
      c.plants.push_back(plant(side + ": last layer out, position 39", m, PlantKind::LayerOut, -1, 39));
      c.plants.push_back(plant(side + ": last captured layer removed", m, PlantKind::LayerDropped));
    }
    v.push_back(std::move(c));
  }
  return v;
}

// Runs one check under one plant: "" when it was caught, else why not.
std::string plant_not_caught(const CheckUnderTest& c, const Plant& p, std::string* caught_by = nullptr) {
  auto st = std::make_shared<PlantState>();
  st->plant = p;
  std::string msg;
  try {
    msg = c.run(planting(st));
  } catch (const PlantNotApplicable& e) {
    return e.what();
  } catch (const std::exception& e) {
    msg = std::string("threw: ") + e.what();  // an exception is a failure of the check, hence a catch
  }
  if (st->applied == 0) return "the plant was never applied: the check did not make the run it targets";
  if (msg.empty()) return "the check PASSED on the plant";
  if (caught_by) *caught_by = msg;
  return "";
}

}  // namespace

TEST(ChecksUnderPlants, EveryCheckPassesWithoutAPlant) {
  for (const auto& c : checks_under_test()) {
    auto st = std::make_shared<PlantState>();  // matches nothing: the wrapper alone
    EXPECT_EQ(c.run(planting(st)), "") << c.name;
  }
}

TEST(ChecksUnderPlants, EveryCheckFailsOnAPlantInEachThingItCompares) {
  int total = 0, missed = 0;
  for (const auto& c : checks_under_test()) {
    for (const auto& p : c.plants) {
      ++total;
      std::string msg;
      const std::string why = plant_not_caught(c, p, &msg);
      std::printf("%-24s %-58s %s\n", c.name, p.name.c_str(), why.empty() ? ("caught: " + msg).c_str() : why.c_str());
      if (!why.empty()) {
        ++missed;
        ADD_FAILURE() << c.name << ", plant '" << p.name << "': " << why;
      }
    }
  }
  std::printf("%d plants, %d caught\n", total, total - missed);
  EXPECT_GT(total, 100);
}

// The class "a property check that, through a slip, compares a thing with
// itself": two such slips, written out, and the plants above flag both (a
// check that ignores one side of its comparison lets that side's plants pass).
TEST(ChecksUnderPlants, ACheckThatComparesARunWithItselfIsFlagged) {
  const Config tiny = builtin_config("tiny");
  const auto all = checks_under_test();
  auto plants_of = [&](const char* name) {
    for (const auto& c : all)
      if (std::string(c.name) == name) return c.plants;
    return std::vector<Plant>{};
  };
  const CheckUnderTest slips[] = {
      {"decode=prefill, decode run compared with itself",
       on(tiny, true,
          [](const Model& m) -> std::string {
            const RunResult dec = m.full(26, 3), longer = m.full(29);
            (void)longer;
            return bits_equal(dec.logits.bottomRows(3), dec.logits.bottomRows(3)) ? "" : "differ";
          }),
       plants_of("decode=prefill")},
      {"reuse-selection, Reuse layer compared with itself",
       on(tiny, true,
          [](const Model& m) -> std::string {
            for (const RunResult& r : {m.full(26, 1, true), m.ced(26, "bounded", 1, true)})
              for (const auto& lp : m.p.layers)
                if (lp.role == Role::Reuse && r.layers.at(size_t(lp.layer)).topk != r.layers.at(size_t(lp.layer)).topk)
                  return "differ";
            return "";
          }),
       plants_of("reuse-selection")},
  };
  for (const auto& slip : slips) {
    ASSERT_FALSE(slip.plants.empty());
    int passed = 0;
    for (const auto& p : slip.plants) passed += plant_not_caught(slip, p).empty() ? 0 : 1;
    EXPECT_GT(passed, 0) << slip.name << ": no plant got past the slipped check";
  }
}
