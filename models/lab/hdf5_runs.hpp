#pragma once
// docs/spec.md §9 /runs/<run> and §6 persisted-cache groups. Internal to io/: the
// public entry points are in hdf5_file.hpp. Every check throws InputError
// naming the object; the same checks run before a write and after a read.
#include <hdf5.h>

#include <cstdint>
#include <string>

#include "models/lab/config.hpp"
#include "model/run.hpp"

namespace ced::h5 {

// "f32" | "f64" | "bf16"; InputError naming `obj` otherwise.
void check_dtype(const std::string& obj, const std::string& dtype);

// A run against the config and the n_tokens of /inputs/tokens.
void check_run(const std::string& path, const RunResult& r, const Config& c, int64_t n_tokens);
void write_run(hid_t file, const std::string& path, const RunResult& r, const Config& c, int64_t n_tokens);
// format_version 1 files have no index scores (docs/spec.md §9.1): they are not looked for.
RunResult read_run(hid_t file, const std::string& path, const Config& c, int64_t n_tokens, int64_t format_version);

// A persisted cache: one source per kv source of the plan, ascending.
void check_cache(const std::string& path, const PersistedCache& cache, const Config& c);
void write_cache(hid_t file, const std::string& path, const PersistedCache& cache, const Config& c);
PersistedCache read_cache(hid_t file, const std::string& path, const Config& c);

}  // namespace ced::h5
