#pragma once
// Planted differences: from a valid run set,
// derive variants that differ from it in exactly one way, so a test can ask
// whether the judge (oracle/run_compare, oracle/policy, `ced diff`, `ced gate`)
// sees that one difference, at the place where it was planted.
//
// A plant is a value (Plant) applied to a RunFile in memory (apply) or to an
// HDF5 file on disk (write_planted: the in-memory plant written through io/,
// or, for the malformed kinds the writer refuses, the stored dataset
// rewritten in place). Every kind is listed in all_kinds(), so tests can
// enumerate them.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "models/lab/hdf5_files.hpp"

namespace ced::plant {

enum class Kind {
  // one value of a numeric tensor (logits or a layer's out)
  Scaled,    // multiplied by (1 + rel)
  NaN,
  PosInf,
  NegInf,
  NegZero,   // replaced by -0 (the original is set to +0 first on the other side: see apply)
  // structure, on the planted side
  RunRemoved,
  RunAdded,            // a copy of a run under a new name
  LayerRemoved,        // one layer's capture
  LayerAdded,          // a capture of a layer the base does not capture
  TopkRemoved,         // one layer's selection tensor
  PositionRemoved,     // one row of logits (layer < 0) or of a layer's capture
  PositionAdded,       // a row at a position the base does not store
  SelectionRowCleared, // one selection row set to -1 (nothing selected)
  SelectionChanged,    // one selection element replaced by an entry id not in its row (its score kept):
                       // at col 0 of a row of two or more, a real swap (docs/spec.md §8.3 gap >= 1)
  SelectionNearTie,    // a full row's k-th entry swapped for an entry the row does not hold, which takes
                       // over its score: a swap at the boundary whose §8.3 gap is boundary_margin()
  // malformed positions (the loaders refuse these files; in memory diff_runs refuses them)
  PositionsDuplicated,
  PositionsPermuted,
  // attributes and config
  AttributeChanged,    // attr: one of attributes()
  ConfigKeyChanged,    // key: one of config_keys()
  WeightSeedChanged,
  TokenChanged,        // one token of /inputs/tokens used by every run
};
const std::vector<Kind>& all_kinds();
const char* kind_name(Kind k);
bool is_value_kind(Kind k);       // Scaled, NaN, PosInf, NegInf, NegZero
bool is_malformed_kind(Kind k);   // PositionsDuplicated, PositionsPermuted

// The run attributes of docs/spec.md §9; judged() ones must agree between two runs.
const std::vector<std::string>& attributes();
bool attribute_judged(const std::string& attr);  // false for backend, dtype
// Config keys of docs/spec.md §1 that can change alone and leave a valid config.
std::vector<std::string> config_keys(const Config& c);

struct Plant {
  Kind kind = Kind::Scaled;
  bool on_reference = false;  // false: the run under test (A of `ced diff A B`), true: the reference (B)
  int64_t run = 0;            // index into RunFile::runs
  int64_t layer = -1;         // -1: logits; else a captured layer number
  int64_t row = 0;            // row index into the tensor's stored rows
  int64_t col = 0;
  double rel = 0;             // Scaled: relative change
  std::string attr;           // AttributeChanged: attribute; ConfigKeyChanged: key
  std::string describe() const;
};

// The base run set: a RunFile on the built-in `tiny` config with `runs`
// synthetic runs (full, ced, resume attributes in turn), logits at positions
// 1..N-1 (position 0 left free for PositionAdded), captures of layers
// 0..L-2 (the last left free for LayerAdded) with selections on the layers
// that have a compressor, values drawn from seed in [-range, range] with
// repeated values (ties) mixed in. Valid: write_run_file accepts it.
// Selections come with their scores (docs/spec.md §9.1): the entries of a row
// of n score kth + (n-1-x)·step (step in [1, 2], so rank order), a full row
// leaves an entry out at kth - margin (margin in [0.01, 0.5], below every
// step), a shorter row leaves nothing out (NaN).
RunFile make_base(uint64_t seed, int runs = 3, double range = 4.0);

// The base's margin at a plant's selection row: kth_score - left_out_score
// (NaN when the row left nothing out). A SelectionNearTie there has this gap.
double boundary_margin(const RunFile& base, const Plant& p);

// Applies p to a copy of base's side. Throws std::invalid_argument if the
// plant does not fit the base (no such run, layer, row).
RunFile apply(const RunFile& base, const Plant& p);

// The position (stored row -> position) a plant at (run, layer, row) names.
int64_t position_of(const RunFile& f, const Plant& p);

// Writes base to `clean` and the planted side to `planted` (HDF5 files). For
// the malformed kinds the planted file is first written clean and its
// positions dataset is then rewritten in place.
void write_planted(const RunFile& base, const Plant& p, const std::filesystem::path& planted);

// Overwrites an int64 1-D dataset of an existing file (no validation).
void rewrite_int_dataset(const std::filesystem::path& file, const std::string& dataset, const std::vector<int64_t>& v);
// Multiplies / replaces one element of a 2-D real dataset in place.
void rewrite_real_element(const std::filesystem::path& file, const std::string& dataset, int64_t row, int64_t col,
                          double value);

}  // namespace ced::plant
