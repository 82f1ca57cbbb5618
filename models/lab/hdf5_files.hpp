#pragma once
// docs/spec.md §9: the harness's HDF5 files. A run file holds the config, the token
// stream with its seeds, optionally the §2 weights, and any number of named
// runs (each a RunResult, optionally with per-layer captures and its
// persisted cache). A cache file holds one persisted cache (docs/spec.md §6).
//
// Writes are atomic: a temporary file in the target's directory, then a
// rename, so a failed write leaves no file (and an old file untouched).
// Every failure, reading or writing, is an InputError with one line naming
// the file and the object:  cannot read 'g.h5': /runs/full/logits: is missing
// Not thread-safe (the HDF5 library is the serial build).
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "io/file_identity.hpp"
#include "models/lab/config.hpp"
#include "model/run.hpp"

namespace ced {

// The format and its version are the harness's one file format's (io/file_identity.hpp), family "lab". Version 2
// added the index scores of captured selections (docs/spec.md §9.1); version 1 files (without them) are still
// read; version 3 added the root's family.
inline constexpr int64_t kOldestFormatVersion = 1;
// The one command that rewrites golden files (named by the version error).
inline constexpr std::string_view kRegenerateCommand = "ced golden regenerate";

struct NamedRun {
  std::string name;  // /runs/<name>: not empty, no '/', not "."
  RunResult result;
};

struct RunFile {
  std::string generator;  // root attr: the program and command that wrote the file
  // root attr: what reading found (a write always writes kFileFormatVersion)
  int64_t format_version = kFileFormatVersion;
  Config config;          // /config (Config::name round-trips as attr "name")
  std::vector<int32_t> tokens;  // /inputs/tokens [N + decode_steps] of the longest run
  uint64_t weight_seed = 0;
  uint64_t token_seed = 0;
  // The tokens were given, not generated; when false they must equal
  // make_tokens(token_seed, V, tokens.size()) (checked both ways).
  bool tokens_explicit = false;
  // "" = no /weights; "f32" | "f64" | "bf16": write every tensor of weight_specs
  // generated from weight_seed. Reading sets it; the tensors stay in the
  // file (read_weight).
  std::string weights_dtype;
  std::vector<NamedRun> runs;  // in file order

  const NamedRun* find_run(std::string_view name) const;  // nullptr if absent
};

// Logits, captures and caches are stored as float for "f32" and "bf16" runs,
// as double for "f64" — and as double whenever a value would not survive the
// float (nothing is ever rounded on the way to disk).
void write_run_file(const std::filesystem::path& path, const RunFile& f);
// Validates everything against the config: ced::validate, token range,
// shapes, positions; each run's tokens must be present.
RunFile read_run_file(const std::filesystem::path& path);
// The same without the runs (config, tokens, seeds, generator).
RunFile read_run_file_header(const std::filesystem::path& path);
std::vector<std::string> list_runs(const std::filesystem::path& path);
// One run, validated against the file's config and tokens.
RunResult read_run(const std::filesystem::path& path, const std::string& run);

struct WeightTensor {
  std::vector<int64_t> shape;
  std::vector<double> values;  // row-major
};
// /weights/<name> (§2 name) of a file written with weights_dtype.
WeightTensor read_weight(const std::filesystem::path& path, const std::string& name);

// A persisted cache on its own, with what identifies it: the config, the
// weight seed and the prompt prefix it was computed from (so `--cache-in` can
// refuse a cache that belongs to another model or prompt). The prefix is
// stored as /inputs/tokens int32 [P] with attrs weight_seed, token_seed,
// tokens_explicit, as in a run file (docs/spec.md §9); a cache file without it
// (written before the prefix was recorded) is refused with a message saying
// how to write it again.
struct CacheFile {
  std::string generator;
  Config config;
  uint64_t weight_seed = 0;
  uint64_t token_seed = 0;
  bool tokens_explicit = false;  // as RunFile::tokens_explicit
  std::vector<int32_t> tokens;   // the first cache.prefix_len tokens of the prompt
  PersistedCache cache;  // /cache
};
void write_cache_file(const std::filesystem::path& path, const CacheFile& f);
CacheFile read_cache_file(const std::filesystem::path& path);

}  // namespace ced

namespace ced {

// A table of numeric columns (the replay-error sweep): /table/<column> float64
// [rows], root attrs format, format_version, generator, and `attrs` as
// strings. Written atomically.
struct TableFile {
  std::string generator;
  Config config;
  std::vector<std::pair<std::string, std::string>> attrs;
  std::vector<std::pair<std::string, std::vector<double>>> columns;  // equal lengths
  // More tables beside /table (`ced replay-budget`): /<group>/<column>, each
  // group's columns of equal lengths.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::vector<double>>>>> groups;
};
void write_table_file(const std::filesystem::path& path, const TableFile& t);
// Reads root attrs format and generator (format_version 1 up to this
// build's), /config, those of the string attrs named in `attr_names` and of
// the groups named in `group_names` that the file has (the caller checks
// what it needs), and /table when present; columns in file order.
TableFile read_table_file(const std::filesystem::path& path, const std::vector<std::string>& attr_names,
                          const std::vector<std::string>& group_names);

// A user's file (io/untrusted.hpp: read and validated in a forked child, this process reading the child's copy;
// models/lab/untrusted_files.cpp). read_table_file's arguments for a table (the shards of `ced merge`).
RunFile read_untrusted_run_file(const std::filesystem::path& path);
CacheFile read_untrusted_cache_file(const std::filesystem::path& path);
TableFile read_untrusted_table_file(const std::filesystem::path& path, const std::vector<std::string>& attr_names,
                                    const std::vector<std::string>& group_names);

}  // namespace ced
