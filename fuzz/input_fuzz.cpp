// Fuzzes everything the harness reads from a user: config TOML (docs/spec.md §1),
// HDF5 run and cache files (docs/spec.md §9) and tolerance policies (docs/spec.md §8).
//
// The first byte chooses the reader, the rest is its input:
//   0  config TOML   ced::parse_config_toml; an accepted config must
//                    round-trip through ced::to_toml and have a layer plan
//   1  HDF5 file     the bytes written to a temporary file in $TMPDIR (one per process,
//                    removed after each input) and read with read_run_file,
//                    read_run_file_header, list_runs and read_cache_file;
//                    afterwards no HDF5 identifier may be left open
//   2  policy TOML   ced::parse_policy_toml; an accepted policy then judges a
//                    small comparison for a few tensor names
// A ced::InputError is a clean rejection. Any other exception, a crash, or a
// broken round-trip is a finding: it is printed, then the target traps.
// CED_FUZZ_VERBOSE=1 prints what each reader made of the input.
#include <fmt/format.h>
#include <hdf5.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/lab/hdf5_files.hpp"
#include "models/lab/config.hpp"
#include "model/error.hpp"
#include "models/lab/plan.hpp"
#include "compare/compare.hpp"
#include "compare/policy.hpp"

namespace {

using namespace ced;
namespace fs = std::filesystem;

// CED_FUZZ_VERBOSE=1: one line per reader call, accepted or why rejected.
void say(const char* what, const char* verdict) {
  static const bool verbose = std::getenv("CED_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "  %s: %s\n", what, verdict);
}

[[noreturn]] void finding(const char* reader, const std::string& what) {
  std::fprintf(stderr, "input_fuzz: FINDING in %s: %s\n", reader, what.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

void fuzz_config(std::string_view text) {
  Config c;
  try {
    c = parse_config_toml(text, "fuzz.toml");
    say("parse_config_toml", "accepted");
  } catch (const InputError& e) {
    say("parse_config_toml", e.what());
    return;
  }
  // Accepted: validated, so it has a plan, and it round-trips (config.hpp).
  (void)make_plan(c);
  const std::string toml = to_toml(c);
  Config back;
  try {
    back = parse_config_toml(toml, "round-trip");
  } catch (const InputError& e) {
    finding("config", fmt::format("to_toml of an accepted config is rejected: {}\n{}", e.what(), toml));
  }
  if (to_toml(back) != toml)
    finding("config", fmt::format("to_toml does not round-trip:\n{}--- read back as ---\n{}", toml, to_toml(back)));
}

// One temporary file per process, so parallel fuzzing jobs never collide.
const fs::path& temp_file() {
  static const fs::path p = fs::temp_directory_path() / fmt::format("ced-input-fuzz-{}.h5", ::getpid());
  return p;
}

void fuzz_hdf5(std::string_view bytes) {
  const fs::path& path = temp_file();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out) finding("hdf5", fmt::format("cannot write the temporary file {}", path.string()));
  }
  auto quietly = [](const char* what, auto&& read) {
    try {
      read();
      say(what, "accepted");
    } catch (const InputError& e) {
      say(what, e.what());
    }
  };
  quietly("read_run_file", [&] { (void)read_run_file(path); });
  quietly("read_run_file_header", [&] { (void)read_run_file_header(path); });
  quietly("list_runs", [&] { (void)list_runs(path); });
  quietly("read_cache_file", [&] { (void)read_cache_file(path); });
  std::error_code ec;
  fs::remove(path, ec);
  // Every identifier io/ opened is closed on every path (h5_handle.hpp).
  const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open != 0) finding("hdf5", fmt::format("{} HDF5 identifiers left open after reading", open));
}

void fuzz_policy(std::string_view text) {
  Policy p;
  try {
    p = parse_policy_toml(text, "fuzz-policy.toml");
    say("parse_policy_toml", "accepted");
  } catch (const InputError& e) {
    say("parse_policy_toml", e.what());
    return;
  }
  if (p.rules.empty()) finding("policy", "an accepted policy has no rules");
  // Judge a small comparison (one element off by 1e-6) under the rule each
  // name gets, with and without a calibration.
  const std::array<double, 4> r = {1.0, -2.0, 0.5, 0.0}, t = {1.0, -2.0, 0.500001, 0.0};
  const std::vector<int64_t> shape = {2, 2};
  for (const char* name : {"runs/full/logits", "runs/ced-bounded/layers/12/out", "runs/resume-7/layers/3/topk"})
    for (const std::optional<Calibration>& cal : {std::optional<Calibration>(), std::optional(Calibration{1e-3, 1e-2})}) {
      try {
        const Thresholds th = p.thresholds_for(name, cal);
        Comparison cmp;
        cmp.tensor = compare_tensors(t, r, shape, th, TensorDtype::F32);
        if (std::string_view(name).ends_with("logits")) cmp.logits = compare_logits(t, r, shape);
        const Verdict v = judge(p, name, cmp, cal);
        (void)v.lines();
        (void)to_json(v);
        say(name, v.pass ? "judged: pass" : "judged: fail");
      } catch (const InputError& e) {
        say(name, e.what());
      }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const uint8_t which = data[0] % 3;
  const char* reader = which == 0 ? "config" : which == 1 ? "hdf5" : "policy";
  try {
    if (which == 0) fuzz_config(rest);
    else if (which == 1) fuzz_hdf5(rest);
    else fuzz_policy(rest);
  } catch (const InputError&) {
    // a clean rejection
  } catch (const std::exception& e) {
    finding(reader, fmt::format("an exception other than ced::InputError escaped: {}", e.what()));
  }
  return 0;
}
