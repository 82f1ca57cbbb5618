#include "backends/registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include "model/error.hpp"
#include "reference/lab/backend.hpp"
#ifdef CED_HAVE_CUDA
#include "optimized/lab/cuda_backend.hpp"
#endif

namespace ced {
namespace {

#ifdef CED_HAVE_CUDA
BackendFactory cuda_factory(CudaPrecision p) {
  return [p](const Config& c, uint64_t seed) { return make_cuda_backend(c, seed, p); };
}
std::string cuda_device_reason() {
  return cuda_device_available() ? std::string() : std::string("no CUDA device on this machine");
}
#endif

std::vector<BackendEntry> build_table() {
  std::vector<BackendEntry> t;
  // The reference (reference/lab/): the f64 one wrote the golden files, so the
  // gate judges it bitwise (policy.toml); the f32 one under bounds scaled
  // from the stored calibration (policy-calibrated.toml).
  t.push_back({.name = "reference",
               .scalar = "f32",
               .golden_policy = "policy-calibrated.toml",
               .gate_calibrated = true,
               .host_bytes_per_value = 4,
               .description = "the CPU reference model in f32 (reference/lab/)",
               .factory = [](const Config& c, uint64_t s) { return make_reference_backend(c, s, false); }});
  t.push_back({.name = "reference-f64",
               .scalar = "f64",
               .golden_policy = "policy.toml",
               .gate_calibrated = false,
               .host_bytes_per_value = 8,
               .description = "the CPU reference model in f64, the writer of the golden files (reference/lab/)",
               .factory = [](const Config& c, uint64_t s) { return make_reference_backend(c, s, true); }});
  // The CUDA model (optimized/lab/): on the device, so no host memory estimate.
  const std::string cuda_off = "this build has no CUDA (configure with -DCED_ENABLE_CUDA=ON)";
  BackendEntry cuda{
      .name = "cuda",
      .scalar = "f32",
      .golden_policy = "policy-calibrated.toml",
      .gate_calibrated = true,
      .host_bytes_per_value = 0,
      .description = "the optimized CUDA model, f32 throughout, cuBLAS without TF32 (optimized/lab/)",
      .not_built = cuda_off};
  BackendEntry bf16{
      .name = "cuda-bf16",
      .scalar = "bf16",
      .golden_policy = "policy-bf16.toml",
      .gate_calibrated = true,
      .host_bytes_per_value = 0,
      .description = "the optimized CUDA model with bf16 projections and f32 accumulation (optimized/lab/)",
      .not_built = cuda_off};
#ifdef CED_HAVE_CUDA
  cuda.factory = cuda_factory(CudaPrecision::F32);
  bf16.factory = cuda_factory(CudaPrecision::BF16);
  cuda.available = bf16.available = cuda_device_reason;
  cuda.not_built = bf16.not_built = "";
#endif
  t.push_back(cuda);
  t.push_back(bf16);
  // The v41 family's reference (models/v41/): its scalar type is the regime's, f64 the widest.
  BackendEntry v41{
      .name = "v41-reference",
      .scalar = "f64",
      .golden_policy = "",
      .gate_calibrated = true,
      .host_bytes_per_value = 8,
      .description =
          "the CPU reference of the released DeepSeek-V4.1-Flash, regimes release | bf16 | f64 (models/v41/)",
      .family = "v41",
      .v41_factory = [](const v41::V41Config& c, const SafetensorsFile& w, v41::V41Regime r) {
        return std::make_unique<v41::V41Model>(c, w, r);
      }};
  t.push_back(v41);
  return t;
}

}  // namespace

std::string BackendEntry::unavailable_reason() const {
  if (family == "v41") return v41_factory ? std::string() : std::string("not built");
  if (!factory) return not_built.empty() ? "not built" : "not built: " + not_built;
  return available ? available() : std::string();
}

const std::vector<BackendEntry>& backend_table() {
  static const std::vector<BackendEntry> t = build_table();
  return t;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> n;
  for (const auto& e : backend_table()) n.push_back(e.name);
  return n;
}

std::vector<const BackendEntry*> backend_table_of_family(const std::string& family) {
  std::vector<const BackendEntry*> t;
  for (const auto& e : backend_table())
    if (e.family == family) t.push_back(&e);
  return t;
}

std::vector<std::string> backend_names_of_family(const std::string& family) {
  std::vector<std::string> n;
  for (const auto& e : backend_table())
    if (e.family == family) n.push_back(e.name);
  return n;
}

const BackendEntry& backend_entry(const std::string& name) {
  for (const auto& e : backend_table())
    if (e.name == name) return e;
  std::string names;
  for (const auto& n : backend_names()) names += (names.empty() ? "" : ", ") + n;
  throw InputError(fmt::format("--backend: '{}' is not one of {}", name, names));
}

namespace {

// The entry of `name` for a config of `family`: InputError for an unknown name or one of another
// family, NotSupported when it cannot run here.
const BackendEntry& runnable_entry(const std::string& name, const std::string& family, const std::string& config) {
  const BackendEntry& e = backend_entry(name);
  if (e.family != family)
    throw InputError(
        fmt::format("--backend {}: it computes the {} model family; config {} is a {} config (its "
                    "backends: {})",
                    name, e.family, config, family, fmt::join(backend_names_of_family(family), ", ")));
  if (const std::string why = e.unavailable_reason(); !why.empty())
    throw NotSupported(fmt::format("backend {}: {}", name, why));
  return e;
}

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& name, const Config& c, uint64_t weight_seed) {
  return runnable_entry(name, "lab", c.name).factory(c, weight_seed);
}

std::unique_ptr<v41::V41Model> make_v41_backend(const std::string& name, const v41::V41Config& c,
                                                const SafetensorsFile& weights, v41::V41Regime regime) {
  return runnable_entry(name, "v41", c.name).v41_factory(c, weights, regime);
}

void check_fits_in_memory(const Config& c, int64_t n_positions, const std::string& backend) {
  const BackendEntry& e = backend_entry(backend);
  if (e.host_bytes_per_value == 0 || e.family != "lab") return;
  const double need = estimate_run_bytes(c, n_positions, e.host_bytes_per_value);
  const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (need > 0.8 * have)
    throw InputError(fmt::format(
        "config {}: a {} run of {} positions needs about {:.1f} GiB (weights and caches), this machine has {:.1f} GiB; "
        "use `ced oracle --config {}` for its analytic figures",
        c.name, backend, n_positions, need / (1 << 30), have / (1 << 30), c.name));
}

}  // namespace ced
