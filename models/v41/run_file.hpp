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

// The harness's one file format (io/file_identity.hpp), family "v41". Its version 3 added the request of a CED
// or resumed prefill (V41RunRequest) and each layer's first row; the family's former "ced-v41-run" version 1
// (a full prefill, every layer on every row: the golden files) is read too.

// Decode steps after the prefill (docs/v41.md §12.2): /decode in the file.
struct V41DecodeRecord {
  std::vector<int64_t> tokens;           // [K] the tokens of the steps, after the prefill's /tokens
  // [n_layers] the decode's seed: every layer's window ring and compressor group after the prefill
  // (its compressed KV and index keys are the prefill's captures).
  std::vector<V41LayerCache> seed;
  std::vector<V41ForwardResult> steps;   // [K] each of N = 1: its layers' captures, final, logits
};

// What prefill a run file holds (docs/v41.md §12.8): a full prefill, a CED prefill (its layers from the cut
// on the tail's rows), or a prompt resumed after a prefix-cache hit; root attributes of the file.
struct V41RunRequest {
  std::string mode = "full";  // full | ced | resume
  std::string replay;         // ced, resume: the replay as given (bounded | exact | full | K); "" in full
  int64_t n_replay = 0;       // ced, resume: the rows it kept (the tail's length); 0 in full
  std::string convention;     // ced, resume with a tail: the replay convention (docs/v41.md §13.1)
  int64_t prefix_len = -1;    // resume: the hit's tokens H; -1 otherwise
  std::string rule;           // resume: the encoder-replay rule (docs/v41.md §13.8)
  int64_t rebuilt = -1;       // resume: the window rows rebuilt before the hit
  bool operator==(const V41RunRequest&) const = default;
};
// "full", or e.g. "ced (convention sglang, replay exact = 33 rows)": for messages.
std::string v41_request_summary(const V41RunRequest& r);

struct V41RunFile {
  std::string generator;       // what wrote it ("ced run (ced-harness 0.x)", "DeepSeek inference/model.py ...")
  V41Config config;            // stored as the flat inference/config.json text
  V41Regime regime = V41Regime::release;
  V41Options options;          // the switches it ran with (absent in a file: the official defaults)
  std::string weights_digest;  // v41_weights_digest of the checkpoint it ran
  std::optional<uint64_t> weight_seed;  // when the checkpoint is `ced export --weight-seed S`'s
  std::map<std::string, std::string> provenance;  // /provenance's attributes (versions, hashes, threads)
  V41RunRequest request;                          // the prefill's mode (absent in a file: full)
  std::vector<int64_t> tokens;                    // [N]
  // layers[l]: the captures present in the file (absent ones empty; topk 0 without a selection), each of
  // N - first_row rows (attribute first_row of /layers/L, absent: 0); final_collapsed, final_normed, logits
  // [N - result.first_row, ...] (root attribute first_row).
  V41ForwardResult result;
  std::vector<double> logits_last;  // [vocab] the writer's own last-position logits, when it has them
  // rope tables by name (swa_cos, swa_sin, compressed_cos, compressed_sin), [N, rope_head_dim / 2]
  std::map<std::string, std::vector<double>> rope;
  std::optional<V41DecodeRecord> decode;  // with decode steps
};

// One capture of a layer as the run file names it, for a comparison that walks every tensor: its values
// (integers as doubles), whether its rows are the layer's rows (else compressed groups or attention rows),
// and whether its values are row numbers of the run (a selection offset by the run's rows: comparable only
// between runs of the same first row).
struct V41CaptureTensor {
  std::string name;
  std::vector<double> values;
  bool per_row = true;
  bool row_numbers = false;
};
std::vector<V41CaptureTensor> v41_capture_tensors(const V41LayerCapture& c);

// Drops a layer's per-row captures before `position` (its compressed ones kept): a CED replay's cut layer with
// its window floored runs every row for its sources, but its rows before the tail are nobody's output (an engine
// runs only the sources there). first_row becomes `position`.
void v41_drop_rows_before(V41LayerCapture& c, int64_t position, int64_t N);
// That for a CED result whose convention floors its cut layer's window (the rows before result.first_row).
void v41_drop_unused_cut_rows(V41ForwardResult& r, const V41Plan& p, const V41ReplayConvention& c);

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
