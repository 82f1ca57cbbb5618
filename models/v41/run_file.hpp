#pragma once
// The v41 run file (docs/v41.md §12): one prefill of a v41 model as HDF5, with every layer's
// captures. `ced run --out` writes ours; scripts/v41_official_golden.py writes the official code's in
// the same layout (the golden files, golden/v41/), so the gate reads both with one reader.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "models/v41/config.hpp"
#include "models/v41/run_types.hpp"

namespace ced::v41 {

inline constexpr const char* kV41RunFormat = "ced-v41-run";
inline constexpr int64_t kV41RunFormatVersion = 1;

// Decode steps after the prefill (docs/v41.md §12.2): /decode in the file.
struct V41DecodeRecord {
  std::vector<int64_t> tokens;           // [K] the tokens of the steps, after the prefill's /tokens
  // [n_layers] the decode's seed: every layer's window ring and compressor group after the prefill
  // (its compressed KV and index keys are the prefill's captures).
  std::vector<V41LayerCache> seed;
  std::vector<V41ForwardResult> steps;   // [K] each of N = 1: its layers' captures, final, logits
};

struct V41RunFile {
  std::string generator;       // what wrote it ("ced run (ced-harness 0.x)", "DeepSeek inference/model.py ...")
  V41Config config;            // stored as the flat inference/config.json text
  V41Regime regime = V41Regime::release;
  V41Options options;          // the switches it ran with (absent in a file: the official defaults)
  std::string weights_digest;  // v41_weights_digest of the checkpoint it ran
  std::optional<uint64_t> weight_seed;  // when the checkpoint is `ced export --weight-seed S`'s
  std::map<std::string, std::string> provenance;  // /provenance's attributes (versions, hashes, threads)
  std::vector<int64_t> tokens;                    // [N]
  // layers[l]: the captures present in the file (absent ones empty; topk 0 without a selection);
  // final_collapsed, final_normed, logits [N, vocab].
  V41ForwardResult result;
  std::vector<double> logits_last;  // [vocab] the writer's own last-position logits, when it has them
  // rope tables by name (swa_cos, swa_sin, compressed_cos, compressed_sin), [N, rope_head_dim / 2]
  std::map<std::string, std::vector<double>> rope;
  std::optional<V41DecodeRecord> decode;  // with decode steps
};

// Writes atomically (a temporary file renamed into place). Values are stored as float32 under the
// bf16 and release regimes (every one is an fp32 or bf16 value there: exact) and as float64 under f64.
void write_v41_run_file(const std::filesystem::path& path, const V41RunFile& f);

// Reads strictly: the format and version, the config (validated), the regime, every dataset's shape
// against the config and N; a dataset stored as "bf16" (uint16 bits, attribute encoding = "bf16") is
// decoded. InputError naming the file and the object.
V41RunFile read_v41_run_file(const std::filesystem::path& path);
// A user's file (io/untrusted.hpp): whether its /format is a v41 run file's, probed in a forked child (false
// when the child cannot read it); and the file read and validated in a forked child, the parent reading only
// the child's copy written by write_v41_run_file.
bool is_untrusted_v41_run_file(const std::filesystem::path& path);
V41RunFile read_untrusted_v41_run_file(const std::filesystem::path& path);

}  // namespace ced::v41
