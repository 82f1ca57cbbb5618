#pragma once
// Every golden file of a folder, read, with the model of the checkpoint it ran (`ced export`'s weights
// of its seed, in its regime), in name order: for the tests that judge something on all of them.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "checks/v41/agreement.hpp"
#include "reference/v41/forward.hpp"
#include "models/v41/run_file.hpp"

namespace ced::v41::testing {

// f(path, file, model) for each .h5 file that keep(path) keeps (asked just before the file is read, so a
// caller may stop early or take a subset); returns how many were read.
template <class F, class Keep>
int64_t for_each_v41_golden(const std::filesystem::path& dir, F f, Keep keep) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".h5") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  int64_t read = 0;
  for (const auto& p : files) {
    if (!keep(p)) continue;
    ++read;
    const V41RunFile file = read_v41_run_file(p);
    const V41Checkpoint ck = v41_golden_checkpoint(file);
    const V41Model model(ck.config, ck.weights, file.regime);
    f(p, file, model);
  }
  return read;
}
// Every file.
template <class F>
int64_t for_each_v41_golden(const std::filesystem::path& dir, F f) {
  return for_each_v41_golden(dir, f, [](const std::filesystem::path&) { return true; });
}

#ifdef CED_V41_GOLDEN_DIR
// The folder the test was built with (CED_V41_GOLDEN_DIR), one of its files by name, and the loop over it.
inline std::filesystem::path v41_golden(const std::string& name = "") {
  return name.empty() ? std::filesystem::path(CED_V41_GOLDEN_DIR) : std::filesystem::path(CED_V41_GOLDEN_DIR) / name;
}
template <class F, class Keep>
int64_t for_each_v41_golden_file(F f, Keep keep) {
  return for_each_v41_golden(v41_golden(), f, keep);
}
#endif

}  // namespace ced::v41::testing
