#pragma once
// `ced export` (docs/spec.md §9.4, §10): every weight tensor of docs/spec.md §2.2,
// and optionally the prompt tokens, as safetensors or as an HDF5 file with
// /weights (docs/spec.md §9.1). The Python package's ced.weights and ced.export
// are this code.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "models/lab/config.hpp"

namespace ced {

struct WeightsExport {
  Config config;
  uint64_t weight_seed = 0;
  std::string dtype = "f32";  // "f32" | "f64" | "bf16"
  int64_t n_tokens = 0;       // > 0: also the first n tokens of docs/spec.md §2.3's stream (tensor `tokens`)
  uint64_t token_seed = 0;
  std::string generator;      // the program that wrote the file
};

// Format version of the safetensors metadata (key format_version).
inline constexpr int64_t kSafetensorsFormatVersion = 1;

// The bf16 bits of a generated value: the double rounded to the nearest float,
// then to the nearest bf16 (both round to nearest even) — the rounding the
// cuda-bf16 backend applies to its f32 weights (optimized/lab/device_math.cuh
// bf16_bits_rn). NaN does not occur in generated weights.
uint16_t bf16_bits_of(double value);

// The config as a JSON object: every key of docs/spec.md §1 and "name".
std::string config_json(const Config& c);

// Every tensor of weight_specs, named and shaped as docs/spec.md §2.2, in the
// export's dtype, with its metadata; InputError on a bad dtype.
SafetensorsFile weights_safetensors(const WeightsExport& e);

// Writes the export atomically: format "safetensors" or "h5"; InputError.
void write_weights_export(const std::filesystem::path& path, const WeightsExport& e, const std::string& format);

}  // namespace ced
