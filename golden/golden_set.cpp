#include "golden/golden_set.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <stdexcept>

#include "io/untrusted.hpp"
#include "models/lab/hdf5_files.hpp"
#include "model/data_root.hpp"
#include "model/error.hpp"
#include "models/lab/weights.hpp"
#include "compare/run_compare.hpp"
#include "golden/golden_calibration.hpp"

namespace ced::golden {

const std::vector<GoldenRecipe>& golden_recipes() {
  // Lengths past R = 1 + D(W-1) (tiny 13, small 43) so bounded and exact
  // replay differ; v41-shape past W with the last logits only, to stay small.
  static const std::vector<GoldenRecipe> r = {
      {"tiny", 1, 2, 17, 3, 11, true, LogitsScope::All},
      {"small", 1, 2, 61, 3, 29, true, LogitsScope::All},
      {"v41-shape", 1, 2, 150, 2, 140, false, LogitsScope::Last},
  };
  return r;
}

std::vector<std::pair<std::string, RunRequest>> golden_requests(const GoldenRecipe& g, const Config& c) {
  auto req = [&](Mode mode, const char* replay, int64_t decode) {
    RunRequest r;
    r.mode = mode;
    r.replay = ReplayPolicy::parse(replay);
    r.n_prompt = g.n_prompt;
    r.decode_steps = decode;
    r.capture_layers = g.capture;
    r.logits = g.logits;
    r.tokens = make_tokens(g.token_seed, c.vocab_size, g.n_prompt + decode);
    return r;
  };
  std::vector<std::pair<std::string, RunRequest>> out;
  out.emplace_back("full", req(Mode::Full, "none", g.decode));
  out.emplace_back("ced-bounded", req(Mode::Ced, "bounded", 0));
  out.emplace_back("ced-exact", req(Mode::Ced, "exact", 0));
  out.emplace_back("ced-bounded-decode", req(Mode::Ced, "bounded", g.decode));
  auto res = req(Mode::Resume, "bounded", g.decode);
  res.prefix_len = g.prefix;
  out.emplace_back("resume", res);
  return out;
}

RunRequest request_of(const RunFile& f, const RunResult& s) {
  RunRequest r;
  r.mode = s.mode;
  r.replay = s.replay;
  r.n_prompt = s.n_prompt;
  r.prefix_len = s.mode == Mode::Resume ? s.prefix_len : -1;
  r.decode_steps = s.decode_steps;
  r.capture_layers = !s.layers.empty();
  const int64_t N = s.n_prompt;
  r.logits = (!s.positions.empty() && s.positions.front() == N - 1 && s.replay_start < N - 1) ? LogitsScope::Last
                                                                                              : LogitsScope::All;
  if (int64_t(f.tokens.size()) < N + s.decode_steps)
    throw InputError(fmt::format("/inputs/tokens: {} tokens, run needs {}", f.tokens.size(), N + s.decode_steps));
  r.tokens.assign(f.tokens.begin(), f.tokens.begin() + N + s.decode_steps);
  return r;
}

// CED_GOLDEN_DIR overrides the shipped golden folder (a build carried to another machine,
// tools/device-check.sh); else the data root's (the source tree, or the installed package's data).
std::filesystem::path default_golden_dir() {
  if (const char* env = std::getenv("CED_GOLDEN_DIR"); env && *env) return env;
  return data_root() / "golden";
}

const BackendEntry& golden_writer() {
  for (const BackendEntry* e : backend_table_of_family("lab"))
    if (!e->gate_calibrated) return *e;
  throw std::logic_error("backend registry: no entry writes the golden files");
}

void regenerate_golden(const std::filesystem::path& dir, bool verbose) {
  if (!std::filesystem::is_directory(dir)) throw InputError(fmt::format("golden: '{}' is not a directory", dir.string()));
  for (const auto& g : golden_recipes()) {
    const Config c = builtin_config(g.config);
    auto be = make_backend(golden_writer().name, c, g.weight_seed);
    RunFile f;
    f.generator = fmt::format("ced golden regenerate (ced-harness {}; {})", CED_VERSION, golden_writer().name);
    f.config = c;
    f.weight_seed = g.weight_seed;
    f.token_seed = g.token_seed;
    f.tokens = make_tokens(g.token_seed, c.vocab_size, g.n_prompt + g.decode);
    for (auto& [name, req] : golden_requests(g, c)) f.runs.push_back({name, be->run(req)});
    const auto path = dir / (g.config + ".h5");
    write_run_file(path, f);
    if (verbose) std::printf("wrote %s (%zu runs)\n", path.string().c_str(), f.runs.size());
  }
  // The calibration belongs to these exact files: measure it again.
  write_golden_calibration(dir, measure_golden_calibration(dir, verbose));
}

GateReport run_gate(const GateOptions& o) {
  GateReport rep;
  if (!std::filesystem::is_directory(o.dir)) throw InputError(fmt::format("--golden: '{}' is not a directory", o.dir.string()));
  const BackendEntry& entry = o.entry ? *o.entry : backend_entry(o.backend);
  const std::string policy_path = !o.policy.empty() ? o.policy : (o.dir / entry.golden_policy).string();
  const Policy policy = load_policy_file(policy_path);
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(o.dir))
    if (e.path().extension() == ".h5") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw InputError(fmt::format("--golden: no .h5 files in '{}'", o.dir.string()));
  std::string only_file = o.only, only_run;
  if (auto colon = o.only.find(':'); colon != std::string::npos) {
    only_file = o.only.substr(0, colon);
    only_run = o.only.substr(colon + 1);
    // "FILE:" and ":RUN" would silently widen the selection to every run or file.
    if (only_file.empty() || only_run.empty())
      throw InputError(fmt::format("--only: '{}' is not FILE or FILE:RUN (both parts non-empty)", o.only));
  }
  std::optional<GoldenCalibration> stored_cal;
  for (const auto& path : files) {
    const std::string fname = path.filename().string();
    if (!only_file.empty() && fname != only_file) continue;
    const RunFile f = read_untrusted_run_file(path);
    if (!o.entry) check_fits_in_memory(f.config, int64_t(f.tokens.size()), entry.name);
    if (const std::string why = entry.unavailable_reason(); !why.empty())
      throw NotSupported(fmt::format("backend {}: {}", entry.name, why));
    auto be = entry.factory(f.config, f.weight_seed);
    // Self-calibrating bounds scale the f32 reference's error measured once
    // and stored beside the golden files, never the error of the run judged.
    const FileCalibration* fcal = nullptr;
    if (entry.gate_calibrated) {
      if (!stored_cal) stored_cal = read_golden_calibration(o.dir);
      fcal = &calibration_of_file(*stored_cal, path);
    }
    for (const auto& nr : f.runs) {
      if (!only_run.empty() && nr.name != only_run) continue;
      ++rep.runs;
      RunRequest req = request_of(f, nr.result);
      req.fault = o.fault;
      // Asked before running: what the backend cannot do is listed, never
      // counted as passed or failed.
      if (std::string why = be->supports(req); !why.empty()) {
        if (!o.quiet) std::printf("  not supported  %s:%s: %s\n", fname.c_str(), nr.name.c_str(), why.c_str());
        rep.not_supported.push_back({fname, nr.name, std::move(why)});
        continue;
      }
      const RunResult got = be->run(req);
      const RunDiff d = diff_runs(nr.name, got, nr.result, policy, [&](const std::string& t) {
        if (!fcal) return std::optional<Calibration>{};
        auto it = fcal->tensors.find(t);
        return it == fcal->tensors.end() ? std::optional<Calibration>{} : std::optional<Calibration>{it->second};
      });
      const std::string reproduce = fmt::format("ced gate --golden {} --backend {} --only {}:{}{}", o.dir.string(),
                                                entry.name, fname, nr.name,
                                                o.fault == Fault::None ? "" : std::string(" --fault ") + fault_name(o.fault));
      rep.judged.push_back({fname, d});
      if (d.pass()) {
        ++rep.passed;
        if (!o.quiet) std::printf("  pass  %s:%s\n", fname.c_str(), nr.name.c_str());
        if (o.verbose) std::fputs(format_run_diff(d, true).c_str(), stdout);
      } else {
        if (!o.quiet) std::fputs(format_run_diff(d, o.verbose).c_str(), stdout);
        std::string what;
        for (const auto& p : d.problems) what += p + "; ";
        for (const auto& t : d.tensors) {
          if (t.verdict.pass) continue;
          // The failing tensor names run, layer and tensor; worst() the position.
          what += fmt::format("{} worst at {}", t.name, t.worst());
          if (t.comparison.tensor && !t.comparison.selection) {
            const auto& m = t.comparison.tensor->max_abs;
            if (m.flat >= 0) what += fmt::format(" (max abs error at {}: {:.17g} vs {:.17g})", t.where(m.flat), m.t, m.r);
          }
          break;
        }
        if (d.first_divergent_layer >= 0) what += fmt::format(" (first divergent layer {})", d.first_divergent_layer);
        rep.failures.push_back({fname, nr.name, what, reproduce});
      }
    }
  }
  // Nothing selected is nothing judged, never a pass.
  if (rep.runs == 0 && o.only.empty())
    throw InputError(fmt::format("--golden: the .h5 files in '{}' hold no run: no run was judged", o.dir.string()));
  if (rep.runs == 0) throw InputError(fmt::format("--only: '{}' matches no golden run", o.only));
  return rep;
}

int gate_exit_code(const GateReport& rep, const std::string& backend) {
  if (!rep.failures.empty()) return 1;
  if (rep.passed == 0) {
    const std::string why = rep.not_supported.empty() ? "none selected" : rep.not_supported.front().why;
    throw NotSupported(fmt::format("no run was judged: backend {} supports none of the {} selected runs ({})",
                                   backend, rep.runs, why));
  }
  return 0;
}

}  // namespace ced::golden
