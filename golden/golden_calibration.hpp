#pragma once
// The stored calibration of the golden set (docs/spec.md §8): the error the f32
// reference makes against each golden f64 tensor, measured once by
// `ced golden calibrate` (and by `ced golden regenerate`) and kept in
// `calibration.toml` beside the golden files. Every gate of a backend other
// than reference-f64 scales its self-calibrating bounds from this file, never
// from the run it is judging: a bound taken from the candidate's own error
// grows with that error, so it could not fail.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "compare/policy.hpp"

namespace ced::golden {

struct FileCalibration {
  uint64_t bytes = 0;    // size of the golden file it was measured on
  uint64_t fnv1a64 = 0;  // FNV-1a of its bytes: a regenerated file invalidates the entry
  std::map<std::string, Calibration> tensors;  // "runs/<run>/logits", "runs/<run>/layers/<l>/out"
};
struct GoldenCalibration {
  std::map<std::string, FileCalibration> files;  // by file name ("tiny.h5")
};

constexpr const char* kCalibrationFile = "calibration.toml";

// Reruns every golden run of dir on the f32 reference and measures its error
// against the stored tensors (calibrate_runs).
GoldenCalibration measure_golden_calibration(const std::filesystem::path& dir, bool verbose);
// Written atomically to dir/calibration.toml.
void write_golden_calibration(const std::filesystem::path& dir, const GoldenCalibration& cal);
// InputError (naming `ced golden calibrate`) when missing or malformed: a key
// missing, of the wrong type, or unknown at any level (the top, a [[file]], a
// tensor entry), with its line.
GoldenCalibration read_golden_calibration(const std::filesystem::path& dir);
// The entry of one golden file; InputError when absent or measured on other bytes.
const FileCalibration& calibration_of_file(const GoldenCalibration& cal, const std::filesystem::path& golden_file);

// Size and FNV-1a of a file's bytes.
std::pair<uint64_t, uint64_t> file_fingerprint(const std::filesystem::path& path);

}  // namespace ced::golden
