// `ced verify`: the main job. On the embedded default config, the released
// architecture (v41-ced): its plan, the release's oracle, the CED properties,
// the golden gate against DeepSeek's code, the spans and the drift per
// convention (tools/v41_verify.cpp); then the lab model's section: its plan,
// oracle, a quick property run, its golden gate, a replay-drift summary and,
// with a GPU, the CUDA side-by-side. A lab config runs the lab section alone.
// Exit 1 if any part fails.
#include <fmt/format.h>

#include "model/error.hpp"
#include "oracle/analytic.hpp"
#include "checks/ced_checks.hpp"
#include "tools/common.hpp"
#include "golden/golden_set.hpp"
#include "checks/replay_sweep.hpp"
#include "tools/v41_commands.hpp"

namespace ced::tools {
using prop::drift_csv;
using prop::drift_svg;
using prop::drift_table;
using prop::replay_sweep;
using prop::SweepOptions;
namespace {

constexpr const char* kDefaultConfig = "v41-ced";
constexpr const char* kDefaultLabConfig = "v41-shape";

void heading(const std::string& s) { std::printf("\n== %s\n", s.c_str()); }

// The CED checks on one config at lengths past its spans; returns failures.
std::vector<std::string> quick_properties(const Config& c) {
  const prop::Model m(c, true);
  const int64_t R = m.p.exact_replay(), N = 2 * R + 1;
  std::vector<std::pair<std::string, std::function<std::string()>>> checks = {
      {"ced replay=full equals full, bitwise", [&] { return prop::check_replay_full_equals_full(m, N); }},
      {"exactness cone (bitwise inside, dependency outside)", [&] { return prop::check_cone(m, N, m.p.W + 1); }},
      {"minimal exact replay = min(N, R)", [&] { return prop::check_min_exact_replay(m, N); }},
      {"decode exact iff B >= D(W-1)", [&] { return prop::check_decode_bound(m, N, 2); }},
      {"bounded = exact when N <= W", [&] { return prop::check_bounded_equals_exact_short(m, m.p.W); }},
      {"source-only write = full mode's entries", [&] { return prop::check_source_only_write(m, N); }},
      {"Reuse layers take their source's selection", [&] { return prop::check_reuse_selection(m, N); }},
      {"shared KV: tied sources = Reindex layers", [&] { return prop::check_shared_kv(c, N); }},
      {"resume with P <= W = ced from scratch", [&] { return prop::check_resume_short_prefix(m, N, m.p.W); }},
      {"resume through a saved cache = in memory", [&] { return prop::check_resume_saved_cache(m, N, N / 2); }},
      {"FLOP counter = oracle FLOP model", [&] { return prop::check_flops(m, N); }},
      {"decode = longer prefill, bitwise", [&] { return prop::check_decode_equals_prefill(m, N, 3); }},
  };
  std::vector<std::string> failures;
  for (const auto& [name, run] : checks) {
    const std::string msg = run();
    std::printf("  %-4s %-8s %s%s\n", msg.empty() ? "ok" : "FAIL", c.name.c_str(), name.c_str(),
                msg.empty() ? "" : (": " + msg).c_str());
    if (!msg.empty()) failures.push_back(c.name + ": " + name + ": " + msg);
  }
  return failures;
}

}  // namespace

Runner add_verify(CLI::App& app) {
  struct Opts {
    std::string config = kDefaultConfig, lab_config = kDefaultLabConfig;
    std::string golden = golden::default_golden_dir().string();
    std::string golden_v41 = (golden::default_golden_dir() / "v41").string();
    bool skip_drift = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("verify", "the main job: plan, oracle, properties, golden gate, replay drift, CUDA");
  sub->add_option("--config", o->config, "config whose plan, oracle and drift are reported (a v41 config: then the "
                                        "lab section on --lab-config)")->capture_default_str();
  sub->add_option("--lab-config", o->lab_config, "the lab section's config after a v41 one")->capture_default_str();
  sub->add_option("--golden", o->golden, "the lab model's golden directory")->capture_default_str();
  sub->add_option("--golden-v41", o->golden_v41, "the official code's golden files (v41)")->capture_default_str();
  sub->add_flag("--skip-drift", o->skip_drift, "skip the replay-drift summary");
  return {sub, [o] {
            Stopwatch sw;
            std::vector<std::string> failures;
            std::string lab = o->config;
            if (names_v41_family(o->config)) {
              std::printf("ced verify (ced-harness %s): config %s, then the lab model's %s\n", CED_VERSION,
                          o->config.c_str(), o->lab_config.c_str());
              verify_v41(o->config, o->golden_v41, o->skip_drift, failures);
              lab = o->lab_config;
              heading("the lab model (docs/spec.md): " + lab);
            }
            const Config c = load_lab_config(lab);
            const Plan p = make_plan(c);
            std::printf("ced verify (ced-harness %s): config %s\n", CED_VERSION, c.name.c_str());
            heading("layer plan");
            std::fputs(describe_plan(p).c_str(), stdout);
            heading("oracle (docs/spec.md §7)");
            std::fputs(format_oracle_table(oracle_table(c, {256, 4096, 32768}, 4 * c.window)).c_str(), stdout);
            heading("CED properties (reference-f64, bitwise)");
            for (const char* name : {"tiny", "small"}) {
              auto f = quick_properties(builtin_config(name));
              failures.insert(failures.end(), f.begin(), f.end());
            }
            heading("golden gate (reference-f64 against " + o->golden + ")");
            golden::GateOptions g;
            g.dir = o->golden;
            const golden::GateReport rep = golden::run_gate(g);
            std::printf("  %lld runs, %lld passed, %zu not supported\n", (long long)rep.runs, (long long)rep.passed,
                        rep.not_supported.size());
            for (const auto& f : rep.failures) failures.push_back(fmt::format("gate {}:{}: {} ({})", f.file, f.run, f.what, f.reproduce));
            if (!o->skip_drift) {
              heading("replay drift: bounded (B = W) vs exact recovery");
              SweepOptions s;
              s.lengths = {c.window, 4 * c.window, p.exact_replay(), 2 * p.exact_replay()};
              s.prefixes = {c.window / 2, c.window, 4 * c.window};
              s.decode = 2;
              check_fits_in_memory(c, s.lengths.back() + s.decode, s.backend);
              const auto rows = replay_sweep(c, s);
              std::fputs(drift_table(rows).c_str(), stdout);
              for (const auto& r : rows)
                if (!std::isfinite(r.rel_l2)) failures.push_back(fmt::format("drift: non-finite at N = {}", r.n_prompt));
            }
            heading("CUDA side by side");
            // Every device backend of the registry that can run here, gated
            // like the reference; what it cannot do is listed, not failed.
            for (const BackendEntry* be : backend_table_of_family("lab")) {
              const BackendEntry& e = *be;
              if (e.host_bytes_per_value != 0) continue;  // a CPU backend
              if (const std::string why = e.unavailable_reason(); !why.empty()) {
                std::printf("  %s: skipped: %s\n", e.name.c_str(), why.c_str());
                continue;
              }
              golden::GateOptions gc = g;
              gc.backend = e.name;
              const golden::GateReport rc = golden::run_gate(gc);
              std::printf("  %s: %lld runs, %lld passed, %zu not supported\n", e.name.c_str(), (long long)rc.runs,
                          (long long)rc.passed, rc.not_supported.size());
              for (const auto& f : rc.failures)
                failures.push_back(fmt::format("{} gate {}:{}: {}", e.name, f.file, f.run, f.what));
            }
            heading("summary");
            for (const auto& f : failures) std::printf("  FAIL %s\n", f.c_str());
            std::printf("%s (%.1f s)\n", failures.empty() ? "PASS: every check passed" : "FAIL", sw.seconds());
            return failures.empty() ? 0 : 1;
          }};
}

}  // namespace ced::tools
