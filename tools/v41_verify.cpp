// `ced verify` on a v41 config (docs/v41.md §13.9): the released architecture's part of the main job. The
// layer plan, the release's oracle, the CED property suite on v41-tiny (and each planted port bug caught by
// its named check), the golden gate against DeepSeek's own code, the conventions' and the encoder replay's
// spans, and a drift summary per convention and per encoder-replay rule on the config itself.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "checks/v41_ced_checks.hpp"
#include "compare/compare.hpp"
#include "compare/op_bounds.hpp"
#include "model/data_root.hpp"
#include "model/error.hpp"
#include "checks/v41/agreement.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/run_file.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"
#include "tools/v41_study.hpp"

namespace ced::tools {
namespace {

namespace fs = std::filesystem;

void heading(const std::string& s) { std::printf("\n== %s\n", s.c_str()); }

void report(std::vector<std::string>& failures, const std::string& scope, const std::string& name,
            const std::string& msg) {
  std::printf("  %-4s %-12s %s%s\n", msg.empty() ? "ok" : "FAIL", scope.c_str(), name.c_str(),
              msg.empty() ? "" : (": " + msg).c_str());
  if (!msg.empty()) failures.push_back(scope + ": " + name + ": " + msg);
}

// Each check named on v41-tiny in each regime, then each planted port bug against the check named for it.
void properties(const std::vector<std::string>& checks, const std::vector<V41PlantedBug>& planted,
                std::vector<std::string>& failures) {
  const v41::V41Config tiny = v41::v41_builtin_config("v41-tiny");
  const std::vector<int64_t> tokens = v41_seeded_tokens(0, tiny, 101);  // past every span of v41-tiny
  for (v41::V41Regime r : {v41::V41Regime::f64, v41::V41Regime::release}) {
    V41Seeded s = v41_seeded_model(tiny, 0, r);
    const std::string scope = fmt::format("v41-tiny {}", v41::v41_regime_name(r));
    for (const std::string& name : checks)
      report(failures, scope, name, v41::v41_ced_check(name).run(s.model, s.hashing, tokens));
  }
  heading("the checks fail on the ports' replay bugs (v41-tiny release, each fault planted)");
  for (const auto& p : planted) {
    V41Seeded s = v41_seeded_model(tiny, 0, v41::V41Regime::release, v41::v41_fault_from_name(p.fault));
    const std::string why = v41::v41_ced_check(p.check).run(s.model, s.hashing, tokens);
    const std::string& fault = p.fault;
    const std::string msg = why.empty() ? "the check passed with the bug planted" : "";
    std::printf("  %-4s %-24s caught by \"%s\"%s\n", msg.empty() ? "ok" : "FAIL", fault.c_str(), p.check.c_str(),
                msg.empty() ? fmt::format(": {}", why).c_str() : "");
    if (!msg.empty()) failures.push_back(fault + ": " + msg);
  }
}

// Every golden file of the official code against our reference (docs/v41.md §12.3).
void golden_gate(const fs::path& dir, std::vector<std::string>& failures) {
  std::vector<fs::path> files;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".h5") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    failures.push_back(fmt::format("golden gate: no golden file in {}", dir.string()));
    std::printf("  FAIL no golden file in %s\n", dir.string().c_str());
    return;
  }
  for (const fs::path& f : files) {
    const v41::V41RunFile file = v41::read_v41_run_file(f);
    const v41::V41Checkpoint ck = v41::v41_golden_checkpoint(file);
    const v41::V41Model m(ck.config, ck.weights, file.regime);
    const v41::V41Agreement a = v41::v41_agreement(m, file);
    const v41::V41TensorAgreement* bad = a.first_failure();
    const std::string msg = bad ? fmt::format("{} layer {} {}: {}", bad->pass, bad->layer, bad->kind, bad->failure) : "";
    report(failures, "golden", fmt::format("{} ({} tensors compared)", f.filename().string(), a.rows.size()), msg);
  }
}

}  // namespace

bool is_v41_golden_dir(const std::string& dir) {
  if (!fs::is_directory(dir) || fs::exists(fs::path(dir) / "policy.toml")) return false;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".h5") files.push_back(e.path());
  if (files.empty()) return false;
  std::sort(files.begin(), files.end());
  return v41::is_untrusted_v41_run_file(files.front());
}

int regenerate_v41_golden(const std::string& dir, const std::string& official, const std::string& python) {
  if (official.empty() || python.empty())
    throw InputError(fmt::format(
        "ced golden regenerate --dir {}: the v41 golden files are DeepSeek's official code's runs; give --official DIR "
        "(its run_official.py beside the release's inference/) and --python PY (a Python whose torch has the FP8 "
        "dtypes), docs/v41.md §12.2",
        dir));
  if (!fs::is_regular_file(fs::path(official) / "run_official.py"))
    throw InputError(fmt::format("ced golden regenerate: {} holds no run_official.py", official));
  if (run_program({python, "-c", "import torch; torch.float8_e4m3fn; torch.float4_e2m1fn_x2"}, true) != 0)
    throw InputError(fmt::format("ced golden regenerate: {} cannot import torch with the FP8 and FP4 dtypes", python));
  // The script exports each checkpoint with this very program: the binary, or, run from the Python package (whose
  // process is python), the `ced` command it names in CED_SELF (python/ced/cli.py).
  const char* self = std::getenv("CED_SELF");
  ::setenv("CED", self && *self ? self : fs::read_symlink("/proc/self/exe").c_str(), 1);
  const int status = run_program({"bash", (data_root() / "scripts" / "v41-official-golden.sh").string(), official,
                                  python, dir});
  if (status != 0) std::fprintf(stderr, "ced golden regenerate: scripts/v41-official-golden.sh exited %d\n", status);
  return status == 0 ? 0 : 1;
}

int gate_v41(const V41GateOptions& o) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(o.dir))
    if (e.path().extension() == ".h5" && (o.only.empty() || e.path().filename() == o.only)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw InputError(o.only.empty() ? fmt::format("ced gate: no golden file in {}", o.dir)
                                    : fmt::format("--only {}: no such golden file in {}", o.only, o.dir));
  const bounds::BoundModel model = bounds::parse_bound_model(o.accumulation, o.function_ulps);
  std::printf("ced gate: golden %s (v41 family: our reference against DeepSeek's official code, docs/v41.md §12.4), "
              "bounds %s%s\n", o.dir.c_str(), model.name().c_str(),
              o.fault == "none" ? "" : fmt::format(", fault {} planted", o.fault).c_str());
  int64_t failed = 0;
  for (const fs::path& f : files) {
    const v41::V41RunFile file = v41::read_untrusted_v41_run_file(f);  // a user's folder: read in a child
    const v41::V41Checkpoint ck = v41::v41_golden_checkpoint(file);
    v41::V41Model m(ck.config, ck.weights, file.regime);
    m.set_fault(v41::v41_fault_from_name(o.fault));
    const v41::V41Agreement a = v41::v41_agreement(m, file, model);
    int64_t bounded = 0;
    for (const v41::V41TensorAgreement& r : a.rows) bounded += !r.bound_model.empty();
    const v41::V41TensorAgreement* bad = a.first_failure();
    std::printf("%-4s %s (%s, N = %zu): %zu tensors judged, %lld by derived bounds\n", bad ? "FAIL" : "ok",
                f.filename().string().c_str(), v41::v41_regime_name(file.regime), file.tokens.size(), a.rows.size(),
                (long long)bounded);
    if (bad) {
      ++failed;
      std::printf("  first failure: %s layer %lld %s: %s\n  reproduce: ced gate --golden %s --only %s -v%s\n",
                  bad->pass.c_str(), (long long)bad->layer, bad->kind.c_str(), bad->failure.c_str(), o.dir.c_str(),
                  f.filename().string().c_str(), o.fault == "none" ? "" : (" --fault " + o.fault).c_str());
    }
    if (o.verbose) std::fputs(v41::v41_agreement_table(a).c_str(), stdout);
  }
  std::printf("%zu files, %zu passed, %lld failed\n", files.size(), files.size() - static_cast<size_t>(failed),
              (long long)failed);
  return failed ? 1 : 0;
}

namespace {

// Each convention's bounded replay and each encoder-replay rule's resume against exact recovery.
void drift(const v41::V41Config& c, std::vector<std::string>& failures) {
  const v41::V41Plan p = v41::make_v41_plan(c);
  const int64_t N = std::min<int64_t>(1024, 8 * p.W), V = c.vocab_size;
  V41Seeded s = v41_seeded_model(c, 0, v41::V41Regime::release);
  const std::vector<int64_t> tokens = v41_seeded_tokens(0, c, N);
  std::printf("  %s, release, weight and token seed 0, N = %lld: the last position's logits against the full "
              "prefill's (the exact recovery), K = W\n",
              c.name.c_str(), (long long)N);
  v41::V41DecodeState cold;  // the prefix caches of the resumes below
  const v41::V41ForwardResult full = s.model.forward(tokens, s.hashing, &cold);
  const std::span<const double> want = last_logits(full, V);
  std::printf("  %-26s %11s %6s %11s %11s\n", "convention / rule", "KL", "top-1", "rel L2", "FLOP ratio");
  auto row = [&](const std::string& what, const v41::V41ForwardResult& r, double flops) {
    const std::span<const double> got = last_logits(r, V);
    const LogitsCompare lc = compare_logits(got, want, {1, V});
    const double rel = rel_l2(got, want);
    std::printf("  %-26s %11.3e %6s %11.3e %11s\n", what.c_str(), lc.mean_kl, lc.top1_agree == 1 ? "yes" : "no", rel,
                flops > 0 ? fmt::format("{:.4f}", flops).c_str() : "-");
    if (!std::isfinite(rel)) failures.push_back(fmt::format("drift: {} non-finite", what));
  };
  for (const char* name : {"sglang", "vllm", "ascend"}) {
    const v41::V41ReplayConvention& conv = v41::v41_replay_convention(name);
    row(fmt::format("ced {}", name), s.model.forward_ced(tokens, s.hashing, p.W, conv),
        ced_flop_ratio(c, p, conv, N, p.W));
  }
  // A hit of at most W is the cold run (the properties above); past it the window is rebuilt from H - W.
  const int64_t H = 2 * p.W + 1;
  for (const auto& rule : v41::v41_encoder_replay_rules())
    row(fmt::format("full, hit {} {}", H, rule.name),
        s.model.forward_resume(tokens, s.hashing, s.model.prefix_hit(cold, H), rule, p.W, N, nullptr), 0);
}

}  // namespace

void verify_v41_golden(const std::string& golden_dir, std::vector<std::string>& failures) {
  golden_gate(golden_dir, failures);
}

const std::vector<V41PlantedBug>& v41_verify_planted_bugs() {
  static const std::vector<V41PlantedBug> bugs = {
      {"ced-ring-slot-of-row", "decode after ced of the decode span is the prefill's"},
      {"ced-floor-on-row-index", "spans found are the plan's, bitwise at them"},
      {"ced-cut-floor-flipped", "vllm keeps layer E's tail exact"},
      {"resume-start-off-by-one", "resume after a hit of at most W is the cold run"},
      // Spans right, one replayed row one ulp off: only a bitwise clause sees it.
      {"ced-replayed-row-ulp", "spans found are the plan's, bitwise at them"}};
  return bugs;
}

void verify_v41_properties(const std::vector<std::string>& checks, const std::vector<V41PlantedBug>& planted,
                           std::vector<std::string>& failures) {
  properties(checks, planted, failures);
}

void verify_v41_drift(const std::string& config, std::vector<std::string>& failures) {
  drift(v41_config_named(config), failures);
}

void verify_v41(const std::string& config, const std::string& golden_dir, bool skip_drift,
                std::vector<std::string>& failures) {
  const v41::V41Config c = v41_config_named(config);
  const v41::V41Plan p = v41::make_v41_plan(c);
  heading(fmt::format("the released architecture: layer plan of {} (docs/v41.md §7)", c.name));
  std::fputs(v41::describe_v41_plan(p).c_str(), stdout);
  heading("oracle of the release at its real sizes (v41-flash, docs/v41.md §14)");
  oracle_v41("v41-flash", {4096, 32768, 1000000}, false);
  heading("CED properties on the release's architecture (v41-tiny, bitwise)");
  std::vector<std::string> checks;
  for (const v41::V41Check& check : v41::v41_ced_checks()) checks.push_back(check.name);
  properties(checks, v41_verify_planted_bugs(), failures);
  heading("golden gate: our v41 reference against DeepSeek's official code (" + golden_dir + ")");
  golden_gate(golden_dir, failures);
  heading(fmt::format("spans of {} (docs/v41.md §13.1, §13.8; found on v41-tiny above)", c.name));
  std::printf("  %-10s %-10s %11s %12s\n", "convention", "cut layer", "exact span", "decode span");
  for (const auto& conv : v41::v41_replay_conventions())
    std::printf("  %-10s %-10s %11lld %12lld\n", conv.name, conv.floor_first_layer ? "floored" : "whole",
                (long long)v41::v41_exact_span(p, conv), (long long)v41::v41_exact_decode_span(p, conv));
  std::printf("  encoder replay after a prefix-cache hit: %lld rows rebuilt make the resume the cold run\n",
              (long long)v41::v41_encoder_replay_span(p, 0));
  if (!skip_drift) {
    heading("replay drift per convention and encoder-replay rule (docs/v41.md §13.7, §13.8)");
    drift(c, failures);
  }
}

}  // namespace ced::tools
