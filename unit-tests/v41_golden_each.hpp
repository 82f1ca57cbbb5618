#pragma once
// Every golden file of a folder, read, with the model of the checkpoint it ran (`ced export`'s weights
// of its seed, in its regime), in name order: for the tests that judge something on all of them.
#include <algorithm>
#include <filesystem>
#include <vector>

#include "models/v41/agreement.hpp"
#include "models/v41/forward.hpp"
#include "models/v41/run_file.hpp"

namespace ced::v41::testing {

// f(path, file, model) for each .h5 file; returns how many there were.
template <class F>
int64_t for_each_v41_golden(const std::filesystem::path& dir, F f) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".h5") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    const V41RunFile file = read_v41_run_file(p);
    const V41Checkpoint ck = v41_golden_checkpoint(file);
    const V41Model model(ck.config, ck.weights, file.regime);
    f(p, file, model);
  }
  return static_cast<int64_t>(files.size());
}

}  // namespace ced::v41::testing
