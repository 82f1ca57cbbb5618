#pragma once
// The backends the harness knows, in one table: every decision that depends
// on which backend runs (how to build it, whether it can run here, its scalar
// type, the golden policy it is judged under, the host memory it needs) reads
// its entry, never a test of its name. Adding a backend is one entry in
// registry.cpp and one file (its factory); golden/README.md says how.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/lab/config.hpp"
#include "model/run.hpp"
#include "reference/v41/forward.hpp"

namespace ced {

using BackendFactory = std::function<std::unique_ptr<Backend>(const Config&, uint64_t weight_seed)>;
// A v41 backend is built on a checkpoint's weights under a numeric regime (docs/v41.md §8.1).
using V41BackendFactory = std::function<std::unique_ptr<v41::V41Model>(const v41::V41Config&, const SafetensorsFile&,
                                                                        v41::V41Regime)>;

struct BackendEntry {
  std::string name{};       // --backend NAME
  std::string scalar{};     // dtype of its results (docs/spec.md §9): "f32", "f64", "bf16"
  // The policy file in the golden directory `ced gate` judges it under by default.
  std::string golden_policy{};
  // True when the gate scales its self-calibrating bounds from the stored
  // calibration (golden/calibration.toml); false for the backend that wrote
  // the golden files, which is judged bitwise.
  bool gate_calibrated = true;
  // Bytes per value in host memory, for refusing a run that cannot fit this
  // machine up front; 0 when the backend keeps its model on a device.
  int host_bytes_per_value = 0;
  std::string description{};
  BackendFactory factory{};  // the lab family's; empty when this build lacks the backend
  // "" when the backend can run on this machine, else why not (a sentence);
  // empty `available` means it always can.
  std::function<std::string()> available{};
  std::string not_built{};  // why `factory` is empty (the configure option that builds it)
  std::string family = "lab";  // the model family it computes (models/family.hpp)
  V41BackendFactory v41_factory{};  // the v41 family's factory (`factory` is the lab family's)

  // "" when make_backend(name) can succeed here, else the reason.
  std::string unavailable_reason() const;
};

// Every backend, in the order `ced --help` and `ced bench` list them, of every family.
const std::vector<BackendEntry>& backend_table();
// The entries of one family, in table order.
std::vector<const BackendEntry*> backend_table_of_family(const std::string& family);
// The entry of `name`; InputError naming the known backends otherwise.
const BackendEntry& backend_entry(const std::string& name);
std::vector<std::string> backend_names();
// The backends of one model family, in table order (none for a family whose backend is not built yet).
std::vector<std::string> backend_names_of_family(const std::string& family);

// The backend `name` for a config and weight seed: InputError for an unknown
// name or one of another family, NotSupported when it cannot run here (not
// built, no device).
std::unique_ptr<Backend> make_backend(const std::string& name, const Config& c, uint64_t weight_seed);

// InputError, with a memory estimate, for a run of `backend` that cannot fit
// this machine's memory (lab-flash); nothing for device backends.
void check_fits_in_memory(const Config& c, int64_t n_positions, const std::string& backend);

// The v41 backend `name` (InputError for an unknown name or one of another family) on a checkpoint.
std::unique_ptr<v41::V41Model> make_v41_backend(const std::string& name, const v41::V41Config& c,
                                                const SafetensorsFile& weights, v41::V41Regime regime);

}  // namespace ced
