// `ced diff`, `ced gate`, `ced golden` (docs/spec.md §8–§10).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "models/lab/hdf5_files.hpp"
#include "io/untrusted.hpp"
#include "model/error.hpp"
#include "compare/run_compare.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"
#include "golden/golden_calibration.hpp"
#include "golden/golden_set.hpp"

namespace ced::tools {
namespace {

// Keys of the docs/spec.md §1 config whose TOML lines differ (one config's lines
// against the other's, in the first config's order, then keys only in the second).
std::vector<std::string> differing_config_keys(const Config& a, const Config& b) {
  auto lines = [](const Config& c) {
    std::map<std::string, std::string> m;
    std::vector<std::string> order;
    std::istringstream in(to_toml(c));
    for (std::string line; std::getline(in, line);) {
      const auto eq = line.find(" = ");
      if (eq == std::string::npos) continue;
      order.push_back(line.substr(0, eq));
      m[order.back()] = line.substr(eq + 3);
    }
    return std::pair{m, order};
  };
  const auto [ma, oa] = lines(a);
  const auto [mb, ob] = lines(b);
  std::vector<std::string> out;
  for (const auto& k : oa)
    if (!mb.count(k) || mb.at(k) != ma.at(k)) out.push_back(k);
  for (const auto& k : ob)
    if (!ma.count(k)) out.push_back(k);
  if (out.empty() && to_toml(a) != to_toml(b)) out.push_back("(config text)");
  return out;
}

}  // namespace

Runner add_diff(CLI::App& app) {
  struct Opts {
    std::string a, b, policy, run;
    bool json = false, verbose = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("diff", "compare two run files tensor by tensor (docs/spec.md §8); A is judged against B");
  sub->add_option("A", o->a, "run file under test")->required();
  sub->add_option("B", o->b, "reference run file")->required();
  sub->add_option("--policy", o->policy, "tolerance policy TOML (default: any difference fails)")->check(non_empty());
  sub->add_option("--run", o->run, "compare only this run")->check(non_empty());
  sub->add_flag("--json", o->json, "print JSON");
  sub->add_flag("-v,--verbose", o->verbose, "list every tensor, not only failures");
  auto checkpoint = std::make_shared<std::string>();
  sub->add_option("--checkpoint", *checkpoint, "v41 run files: the checkpoint folder B ran (default: B's weight seed)")
      ->check(non_empty());
  return {sub, [o, checkpoint] {
            // A v41 run file under test takes the release's judge (docs/v41.md §12.7); a lab file the lab's, whose
            // reader refuses a v41 file as B in one line. (One probe: each reads the file in a forked child.)
            if (is_v41_run_file(o->a)) {
              if (!o->policy.empty() || !o->run.empty() || o->json)
                throw InputError("ced diff on v41 run files: --policy, --run and --json are the lab family's; the v41 "
                                 "diff judges each op by derived bounds");
              return diff_v41({o->a, o->b, *checkpoint, o->verbose});
            }
            if (!checkpoint->empty()) throw InputError("--checkpoint is for v41 run files");
            const RunFile a = read_untrusted_run_file(o->a), b = read_untrusted_run_file(o->b);
            const Policy policy = o->policy.empty() ? exact_policy() : load_policy_file(o->policy);
            std::vector<std::pair<const NamedRun*, const NamedRun*>> pairs;
            std::vector<std::string> problems;
            if (a.runs.size() == 1 && b.runs.size() == 1 && o->run.empty()) {
              pairs.emplace_back(&a.runs[0], &b.runs[0]);
            } else {
              for (const auto& ra : a.runs) {
                if (!o->run.empty() && ra.name != o->run) continue;
                const NamedRun* rb = b.find_run(ra.name);
                if (!rb) problems.push_back(fmt::format("run '{}' is in {} only", ra.name, o->a));
                else pairs.emplace_back(&ra, rb);
              }
              for (const auto& rb : b.runs)
                if ((o->run.empty() || rb.name == o->run) && !a.find_run(rb.name))
                  problems.push_back(fmt::format("run '{}' is in {} only", rb.name, o->b));
            }
            if (pairs.empty() && problems.empty())
              throw InputError(fmt::format("--run: no run '{}' in both files", o->run));
            // What the runs were computed from must agree: the config (each
            // differing key named), the weight and token seeds, and each
            // compared run's tokens (docs/spec.md §9 /inputs/tokens).
            for (const std::string& key : differing_config_keys(a.config, b.config))
              problems.push_back(fmt::format("config key {} differs", key));
            if (a.weight_seed != b.weight_seed)
              problems.push_back(fmt::format("weight_seed {} vs {}", a.weight_seed, b.weight_seed));
            if (a.token_seed != b.token_seed)
              problems.push_back(fmt::format("token_seed {} vs {}", a.token_seed, b.token_seed));
            for (auto [ra, rb] : pairs) {
              const auto need = [](const RunResult& r) { return size_t(r.n_prompt + r.decode_steps); };
              const size_t n = std::min({need(ra->result), need(rb->result), a.tokens.size(), b.tokens.size()});
              for (size_t i = 0; i < n; ++i)
                if (a.tokens[i] != b.tokens[i]) {
                  problems.push_back(fmt::format("run '{}': token {} is {} vs {}", ra->name, i, a.tokens[i], b.tokens[i]));
                  break;
                }
            }
            std::vector<RunDiff> diffs;
            for (auto [ra, rb] : pairs) diffs.push_back(diff_runs(ra->name, ra->result, rb->result, policy));
            bool pass = problems.empty();
            for (const auto& d : diffs) pass &= d.pass();
            if (o->json) {
              std::string probs;
              for (const auto& p : problems) probs += (probs.empty() ? "" : ", ") + json_string(p);
              std::printf("{\"pass\": %s, \"problems\": [%s], \"runs\": %s}\n", pass ? "true" : "false", probs.c_str(),
                          run_diffs_json(diffs).c_str());
            } else {
              std::printf("ced diff %s (under test) vs %s (reference), policy %s\n", o->a.c_str(), o->b.c_str(),
                          o->policy.empty() ? "exact" : o->policy.c_str());
              for (const auto& p : problems) std::printf("problem: %s\n", p.c_str());
              for (const auto& d : diffs) std::fputs(format_run_diff(d, o->verbose).c_str(), stdout);
              std::printf("%s\n", pass ? "PASS" : "FAIL");
            }
            return pass ? 0 : 1;
          }};
}

Runner add_gate(CLI::App& app) {
  auto o = std::make_shared<golden::GateOptions>();
  auto dir = std::make_shared<std::string>(golden::default_golden_dir().string());
  auto fault = std::make_shared<std::string>("none");
  auto* sub = app.add_subcommand("gate", "rerun every golden run on a backend and judge it under the golden policy");
  sub->add_option("--golden", *dir, "golden directory")->capture_default_str();
  sub->add_option("--backend", o->backend, "backend to gate")->capture_default_str()->transform(backend_name());
  sub->add_option("--policy", o->policy, "policy TOML (default: DIR/policy.toml, or policy-calibrated.toml)")
      ->check(non_empty());
  sub->add_option("--only", o->only, "FILE or FILE:RUN")->check(non_empty());
  sub->add_flag("-v,--verbose", o->verbose, "print every tensor's metrics");
  sub->add_option("--fault", *fault, "test only: inject a fault into the backend")->group("");
  auto v41 = std::make_shared<V41GateOptions>();
  sub->add_option("--accumulation", v41->accumulation,
                  "v41 golden files: the bound model's accumulation, fp32 or tensor-core:BITS:INTERVAL (docs/sound-bounds.md)")
      ->capture_default_str();
  sub->add_option("--function-ulps", v41->function_ulps, "v41 golden files: exp, rsqrt, ... within K ulps")
      ->capture_default_str();
  return {sub, [o, dir, fault, v41, sub] {
            if (is_v41_golden_dir(*dir)) {  // the release's golden files: the v41 gate (docs/v41.md §12.4)
              if (sub->count("--backend") || sub->count("--policy"))
                throw InputError("ced gate on v41 golden files: --backend and --policy are the lab family's; the v41 "
                                 "gate judges our reference by derived bounds (a port: python -m pytest --ced-engine)");
              v41->dir = *dir;
              v41->only = o->only;
              v41->verbose = o->verbose;
              v41->fault = *fault;
              return gate_v41(*v41);
            }
            if (sub->count("--accumulation") || sub->count("--function-ulps"))
              throw InputError("--accumulation and --function-ulps judge v41 golden files; " + *dir + " is not a v41 golden folder");
            o->dir = *dir;
            o->fault = parse_fault(*fault);
            std::printf("ced gate: golden %s, backend %s\n", o->dir.c_str(), o->backend.c_str());
            const golden::GateReport rep = golden::run_gate(*o);
            std::printf("%lld runs, %lld passed, %zu failed, %zu not supported\n", (long long)rep.runs,
                        (long long)rep.passed, rep.failures.size(), rep.not_supported.size());
            if (!rep.failures.empty()) {
              std::printf("failures:\n");
              for (const auto& f : rep.failures)
                std::printf("  %s:%s: %s\n    reproduce: %s\n", f.file.c_str(), f.run.c_str(), f.what.c_str(),
                            f.reproduce.c_str());
            }
            return golden::gate_exit_code(rep, o->backend);
          }};
}

Runner add_golden(CLI::App& app) {
  auto dir = std::make_shared<std::string>(golden::default_golden_dir().string());
  auto* sub = app.add_subcommand("golden", "golden files: `ced golden regenerate` is the one command that writes them");
  auto* regen = sub->add_subcommand("regenerate", "rewrite every golden file with reference-f64 (and their calibration)");
  regen->add_option("--dir", *dir, "golden directory")->capture_default_str();
  auto official = std::make_shared<std::string>(), python = std::make_shared<std::string>();
  regen->add_option("--official", *official,
                    "v41: the folder of DeepSeek's run_official.py (its inference/ beside it); the v41 golden files "
                    "are the official code's runs (a folder of v41 run files, or any folder with this option)");
  regen->add_option("--python", *python, "v41: a Python whose torch has the FP8 dtypes");
  auto* calib = sub->add_subcommand(
      "calibrate", "measure the f32 reference's error against every golden tensor into DIR/calibration.toml");
  calib->add_option("--dir", *dir, "golden directory")->capture_default_str();
  sub->require_subcommand(1);
  return {sub, [dir, calib, official, python] {
            if (is_v41_golden_dir(*dir) && calib->parsed())
              throw InputError(fmt::format("ced golden calibrate: {} holds v41 golden files, judged by derived bounds "
                                           "(docs/sound-bounds.md); they have no calibration",
                                           *dir));
            if (!calib->parsed() && (is_v41_golden_dir(*dir) || !official->empty()))
              return regenerate_v41_golden(*dir, *official, *python);
            if (calib->parsed()) {
              golden::write_golden_calibration(*dir, golden::measure_golden_calibration(*dir, true));
              std::printf("wrote %s\n", (std::filesystem::path(*dir) / golden::kCalibrationFile).string().c_str());
            } else {
              golden::regenerate_golden(*dir, true);
            }
            return 0;
          }};
}

}  // namespace ced::tools
