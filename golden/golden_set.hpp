#pragma once
// The golden set (docs/spec.md §9): which configs, seeds and
// runs the committed files hold, how a stored run turns back into a request,
// and the gate that reruns them.
#include <filesystem>
#include <string>
#include <vector>

#include "backends/registry.hpp"
#include "compare/run_compare.hpp"
#include "models/lab/hdf5_files.hpp"
#include "model/run.hpp"

namespace ced::golden {

struct GoldenRecipe {
  std::string config;  // built-in name; the file is <config>.h5
  uint64_t weight_seed = 1;
  uint64_t token_seed = 2;
  int64_t n_prompt = 0;
  int64_t decode = 0;
  int64_t prefix = 0;  // resume prefix P
  bool capture = true;
  LogitsScope logits = LogitsScope::All;
};
const std::vector<GoldenRecipe>& golden_recipes();

// The runs of one recipe: name and request (tokens filled in).
std::vector<std::pair<std::string, RunRequest>> golden_requests(const GoldenRecipe& g, const Config& c);

// The request that reproduces a stored run (mode, replay, lengths, capture,
// logits scope from its attributes; tokens from the file).
RunRequest request_of(const RunFile& f, const RunResult& stored);

// The backend that writes the golden files: the registry's entry the gate
// judges bitwise (gate_calibrated false), reference-f64.
const BackendEntry& golden_writer();

// Writes every golden file into dir with golden_writer(), then their
// calibration (golden_calibration.hpp).
void regenerate_golden(const std::filesystem::path& dir, bool verbose);

// The project's golden/ folder (compiled in), for defaults.
std::filesystem::path default_golden_dir();

struct GateOptions {
  std::filesystem::path dir;
  std::string backend = "reference-f64";
  std::string policy;  // "" = the backend entry's golden_policy in dir
  std::string only;    // "FILE:RUN" or "FILE" to rerun one
  Fault fault = Fault::None;
  bool verbose = false;
  bool quiet = false;
  // Tests only: gate this entry instead of the registry's entry of `backend`.
  const BackendEntry* entry = nullptr;
};
struct GateFailure {
  std::string file, run, what, reproduce;
};
// A run the backend said it cannot do (Backend::supports): neither passed
// nor failed.
struct GateNotSupported {
  std::string file, run, why;
};
// One judged run with its whole diff (passing or not), for callers that
// report more than the failures (the Python package's ced.gate).
struct GateRun {
  std::string file;
  RunDiff diff;
};
struct GateReport {
  int64_t runs = 0, passed = 0;  // runs = passed + failures + not_supported
  std::vector<GateFailure> failures;
  std::vector<GateNotSupported> not_supported;
  std::vector<GateRun> judged;  // every run judged, in gate order
};
GateReport run_gate(const GateOptions& o);

// The verdict of `ced gate` (docs/spec.md §10): 1 when a run failed, 0 when
// none did and at least one passed; NotSupported (exit 2) when no run was
// judged, every selected run being one the backend cannot do.
int gate_exit_code(const GateReport& rep, const std::string& backend);

}  // namespace ced::golden
