// docs/v41.md §12.4: a test-only driver that runs the gate on official run files (the golden files of a
// folder, or the files named) and prints the agreement per regime and tensor kind as the markdown
// table of the README and docs/v41.md; -v also prints each file's table, row by row; --tsv prints
// instead one tab-separated line per judged row (pass, layer, kind, judged by bounds, a budget or
// reported only, ok or FAIL, the failure or the bound used), for sweeps (scripts/v41-soundness-sweep.sh):
// --budgets-only judges every kind by its measured budget, as the gate did before its derived bounds
// (for comparison and the cost ratio of docs/sound-bounds.md §8); --every-row bounds every row of the ops
// bounded where the two sides differ (the official's values judged everywhere: the soundness sweep's):
// --accumulation fp32 | tensor-core:BITS:INTERVAL and --function-ulps K name the bound model (default
// fp32, 2: docs/sound-bounds.md §1-§3):
//   v41_agreement_summary [-v | --tsv] [--budgets-only | --every-row] [--accumulation A] [--function-ulps K] golden/v41 | FILE.h5...
// Exit 0 when every file is within every budget, 1 when one is not, 2 on bad input.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include "model/error.hpp"
#include "checks/v41/agreement.hpp"

namespace {

using namespace ced::v41;

struct Total {
  int64_t files = 0, n = 0, equal = 0;
  double max_ulp16 = 0, max_ulp32 = 0, max_abs = 0, max_rel = 0;
  bool rows = false, row_scaled = false;
  std::vector<std::string> notes;
};

// One judged row as a line of the sweep's table; tabs and newlines in its text made spaces.
std::string tsv_line(const V41TensorAgreement& r) {
  const char* by = !r.bound_model.empty() ? "bounds" : v41_budget_reason(r.kind) == "reported, not judged" ? "reported" : "budget";
  std::string detail = !r.failure.empty() ? r.failure
                       : !r.bound_model.empty() && r.rows_compared ? fmt::format("{} near-ties admitted{}{}", r.straddled, r.straddled ? ", the first at " : "", r.bound_use_at)
                       : !r.bound_model.empty() ? fmt::format("{:.3g} of an interval used at most, at {}", r.max_bound_use, r.bound_use_at)
                                                : fmt::format("{:.3g} bf16 ulps, {:.4g} fp32 ulps, max |d| {:.3g}", r.max_ulp16, r.max_ulp32, r.max_abs);
  std::replace_if(detail.begin(), detail.end(), [](char c) { return c == '\t' || c == '\n'; }, ' ');
  return fmt::format("{}\t{}\t{}\t{}\t{}\t{}\n", r.pass, r.layer, r.kind, by, r.failure.empty() ? "ok" : "FAIL", detail);
}

int run(const std::vector<std::filesystem::path>& args, bool verbose, bool tsv, bool use_bounds, bool every_row,
        const ced::bounds::BoundModel& bounds) {
  std::vector<std::filesystem::path> files;
  for (const auto& a : args) {
    if (!std::filesystem::is_directory(a)) {
      files.push_back(a);
      continue;
    }
    std::vector<std::filesystem::path> in;
    for (const auto& e : std::filesystem::directory_iterator(a))
      if (e.path().extension() == ".h5") in.push_back(e.path());
    if (in.empty()) throw ced::InputError(fmt::format("{}: no .h5 run files", a.string()));
    std::sort(in.begin(), in.end());
    files.insert(files.end(), in.begin(), in.end());
  }
  // regime -> kind (in first-seen order) -> total
  std::map<std::string, std::vector<std::pair<std::string, Total>>> by;
  int failures = 0;
  for (const auto& p : files) {
    const V41RunFile f = read_v41_run_file(p);
    const V41Checkpoint ck = v41_golden_checkpoint(f);
    const V41Model model(ck.config, ck.weights, f.regime);
    const V41Agreement a = v41_agreement(model, f, bounds, use_bounds, every_row);
    if (verbose) fmt::print("\n== {} ({}, N = {})\n{}", p.string(), v41_regime_name(f.regime), f.tokens.size(),
                            v41_agreement_table(a));
    if (tsv)
      for (const auto& r : a.rows) fmt::print("{}", tsv_line(r));
    if (const auto* x = a.first_failure()) {
      ++failures;
      fmt::print(stderr, "{}: {} layer {} {}: {}\n", p.filename().string(), x->pass, x->layer, x->kind, x->failure);
    }
    auto& kinds = by[v41_regime_name(f.regime)];
    std::map<std::string, bool> counted;
    for (const auto& r : a.rows) {
      // A kind's name says its pass, except the prefill's end-to-end rows that share a teacher-forced name.
      const bool named = r.pass != "end to end" || r.kind.find("end to end") != std::string::npos;
      const std::string kind = named ? r.kind : r.kind + " (end to end)";
      auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == kind; });
      if (it == kinds.end()) it = kinds.insert(kinds.end(), {kind, Total{}});
      Total& t = it->second;
      if (!counted[kind]) ++t.files, counted[kind] = true;
      t.n += r.n;
      t.equal += r.equal;
      t.max_ulp16 = std::max(t.max_ulp16, r.max_ulp16);
      t.max_ulp32 = std::max(t.max_ulp32, r.max_ulp32);
      t.max_abs = std::max(t.max_abs, r.max_abs);
      if (r.max_ref > 0) t.max_rel = std::max(t.max_rel, r.max_abs / r.max_ref);
      t.rows = r.rows_compared;
      t.row_scaled = r.row_scaled;
      for (const auto& n : r.notes) t.notes.push_back(fmt::format("{}: {}", p.filename().string(), n));
    }
  }
  for (const auto& [regime, kinds] : tsv ? decltype(by){} : by) {
    fmt::print("\n### regime {}\n\n| kind | files | compared | bitwise | max bf16 ulps | max fp32 ulps | max abs diff |\n"
               "|---|---|---|---|---|---|---|\n", regime);
    for (const auto& [kind, t] : kinds) {
      const double frac = t.n ? static_cast<double>(t.equal) / static_cast<double>(t.n) : 1.0;
      const std::string ulp16 = t.rows ? "–" : fmt::format("{:.3g}{}", t.max_ulp16, t.row_scaled ? " (row)" : "");
      const std::string ulp32 = t.rows || t.row_scaled ? "–" : fmt::format("{:.3g}", t.max_ulp32);
      const std::string abs = t.rows ? "–" : fmt::format("{:.3g}", t.max_abs);
      fmt::print("| {} | {} | {} {} | {} | {} | {} | {} |\n", kind, t.files, t.n, t.rows ? "rows" : "values",
                 t.rows ? fmt::format("{} of {} rows differ", t.n - t.equal, t.n) : fmt::format("{:.4f} %", 100 * frac),
                 ulp16, ulp32, kind.ends_with("logits (end to end)") ? fmt::format("{} ({:.2g} of max |logit|)", abs, t.max_rel) : abs);
    }
    for (const auto& [kind, t] : kinds)
      for (const auto& n : t.notes) fmt::print("- {}\n", n);
  }
  if (!tsv) fmt::print("\n{} files, {} outside a budget\n", files.size(), failures);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> args;
  bool verbose = false, tsv = false, use_bounds = true, every_row = false, bad = false;
  std::string accumulation = "fp32", ulps = "2";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-v") verbose = true;
    else if (a == "--tsv") tsv = true;
    else if (a == "--budgets-only") use_bounds = false;
    else if (a == "--every-row") every_row = true;
    else if (a == "--accumulation" || a == "--function-ulps") {
      if (i + 1 == argc) bad = true;
      else (a == "--accumulation" ? accumulation : ulps) = argv[++i];
    } else if (a.starts_with("--")) bad = true;
    else args.emplace_back(a);
  }
  if (bad || args.empty() || (verbose && tsv) || (every_row && !use_bounds)) {
    fmt::print(stderr, "usage: v41_agreement_summary [-v | --tsv] [--budgets-only | --every-row] [--accumulation fp32|tensor-core:BITS:INTERVAL] "
                       "[--function-ulps K] GOLDEN_DIR | FILE.h5...\n");
    return 2;
  }
  try {
    size_t used = 0;
    double k = 0;
    try {
      k = std::stod(ulps, &used);
    } catch (const std::logic_error&) {
    }
    if (used == 0 || used != ulps.size()) throw ced::InputError(fmt::format("--function-ulps: '{}' is not a number", ulps));
    return run(args, verbose, tsv, use_bounds, every_row, ced::bounds::parse_bound_model(accumulation, k));
  } catch (const std::exception& e) {
    fmt::print(stderr, "v41_agreement_summary: {}\n", e.what());
    return 2;
  }
}
