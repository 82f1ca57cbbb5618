#pragma once
// The v41 family's checkpoints in the release's layout (docs/v41.md §11): the tensor schema a config
// implies, the in-memory checkpoint, random weights with the release's statistics, and the folder
// (config.json, inference/config.json, sharded safetensors + index, the stub tokenizer) written and
// read strictly.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "models/v41/config.hpp"
#include "models/v41/run_types.hpp"
#include "models/v41/plan.hpp"

namespace ced::v41 {

// weights: release names, dtypes, bytes; sorted by name.
struct V41Checkpoint {
  V41Config config;
  SafetensorsFile weights;
};

// ---- the schema (docs/v41.md §11.1) --------------------------------------------------------------

// How a tensor's bytes encode values.
enum class V41Format {
  Fp8Tiles,  // F8_E4M3 [out, in], scale F8_E8M0 [ceil(out/32), ceil(in/32)]: dense linears, wo_a, engram.wkv
  Fp8Rows,   // F8_E4M3 [rows, d], scale F8_E8M0 [rows, d/32]: the Engram tables
  Fp4K32,    // I8 [out, in/2] packed e2m1 (low nibble the even element), scale F8_E8M0 [out, in/32]: routed experts
  Bf16,      // norms, embed, head, gate, compressor wkv/wgate, indexer wk/weights_proj, engram q/k_weight
  F32,       // hc_*, attn_sink, gate bias / bias_vl
  Scale,     // F8_E8M0: the scale of the weight named in `scale_of`
};
const char* v41_format_name(V41Format f);

struct V41TensorSpec {
  std::string name;             // the release's name: "layers.3.attn.wq_a.weight"
  std::string dtype;            // safetensors dtype: F8_E4M3 | F8_E8M0 | I8 | BF16 | F32
  std::vector<int64_t> shape;   // as stored
  V41Format format = V41Format::Bf16;
  std::string scale;            // a quantized weight's `.scale` tensor; empty otherwise
  std::string scale_of;         // a scale's weight; empty otherwise
};

// Every tensor of the release's layout for c (validated; plan = make_v41_plan(c)), scales
// included, sorted by name; with dspark_block_size > 0 the DSpark stages' mtp.* tensors too. Only
// the release's format is modelled: dtype fp8 with fp4 experts and no vision (vision_n_layers 0);
// anything else is an InputError "v41 checkpoint: NAME: why".
std::vector<V41TensorSpec> v41_schema(const V41Config& c, const V41Plan& p);
inline std::vector<V41TensorSpec> v41_schema(const V41Config& c) { return v41_schema(c, make_v41_plan(c)); }

// ---- random weights (docs/v41.md §11.2) ----------------------------------------------------------

// The schema's tensors filled with random values of the release's statistics (norm-weight means by
// owner, projection std = gain / sqrt(fan_in), embedding RMS 0.12), quantized as the release stores
// them. Each tensor has its own stream, seeded by (seed, name): a function of the seed alone, the
// same bytes on every platform.
V41Checkpoint make_v41_random_checkpoint(const V41Config& c, uint64_t seed);

// ---- the Engram token map (docs/v41.md §11.3) ----------------------------------------------------

// The stub tokenizer's token map that every v41 checkpoint folder carries: id -> id / 2, so the
// compressed vocabulary has ceil(vocab_size / 2) ids.
std::vector<int64_t> v41_engram_token_map(const V41Config& c);
// tokenizer.json's text: a byte-level BPE whose id 2k decodes to "tok{k}" and 2k+1 to "  TOK{k}".
std::string v41_stub_tokenizer_json(const V41Config& c);
// How a checkpoint folder's token ids become Engram hash ids: the stub token map above and engram.py's
// multipliers (forward.hpp); empty without Engram layers.
V41EngramHashing v41_checkpoint_hashing(const V41Config& c);
// With Engram on, engram_compressed_vocab_size must be the stub map's ceil(vocab_size / 2).
void check_v41_token_map_size(const V41Config& c, const std::string& origin);
// tokenizer.json's text must parse to v41_stub_tokenizer_json(c); the refusal names the first
// differing JSON pointer.
void check_v41_stub_tokenizer(const std::string& text, const std::string& origin, const V41Config& c);

// ---- the folder (docs/v41.md §11.4, §11.5) --------------------------------------------------------

struct V41WriteOptions {
  // A shard holds consecutive groups (the embedding, each layer without its Engram table, each
  // DSpark stage, the final norm and head) up to this many bytes; each Engram table has a shard of
  // its own.
  int64_t shard_bytes = int64_t(5) * 1000 * 1000 * 1000;
};

// Writes config.json, inference/config.json, model-0000k-of-0000n.safetensors,
// model.safetensors.index.json, and (with Engram) tokenizer.json and tokenizer_config.json, each
// file atomically. `dir` must not exist or be empty. The checkpoint must match its schema.
// Returns the files written, relative to dir.
std::vector<std::string> write_v41_checkpoint(const std::filesystem::path& dir, const V41Checkpoint& ckpt,
                                              const V41WriteOptions& options = {});

// Reads a folder strictly: both config files (they must agree), the index, every shard it names
// and nothing else; the union of the shards must be exactly the config's schema (no tensor missing
// or extra, each with its dtype, shape and 32-blocks), total_size must be the tensors' bytes, and
// with Engram tokenizer.json must be the stub tokenizer. Any fault: InputError, one line
// "v41 checkpoint: FILE: TENSOR-OR-KEY: why".
V41Checkpoint read_v41_checkpoint(const std::filesystem::path& dir);

// Why t does not match spec, "" when it does: its dtype, its shape, or (for a scale) its 32-blocks
// against its weight's shape, found in schema.
std::string v41_tensor_mismatch(const std::vector<V41TensorSpec>& schema, const V41TensorSpec& spec,
                                const SafetensorsTensor& t);
// The checkpoint's tensors against its config's schema: the same set of names, each matching
// (v41_tensor_mismatch). InputError "v41 checkpoint: ORIGIN: TENSOR: why".
void check_v41_weights(const V41Checkpoint& ckpt, const std::string& origin);

// ---- scaled weights for the negative controls (docs/v41.md §12.4) ------------------------------------

// Multiplies a quantized weight by 2^k exactly, by adding k to every E8M0 byte of its scale (InputError
// when `weight` has no .scale tensor or a byte would leave [0, 254]). The clamp of SwiGLU acts only on
// pre-activations above swiglu_limit, which the random weights never reach: a control of the clamp
// needs an expert this hot (`ced export --boost`, the golden file *-hot.h5).
void boost_v41_weight(V41Checkpoint& ckpt, const std::string& weight, int k);
// The same from its text "TENSOR=K" (K a nonzero integer), as `ced export --boost` and a golden file's
// provenance write it; InputError "--boost: ..." for another form. Prints nothing.
void apply_v41_boost(V41Checkpoint& ckpt, const std::string& spec);

// ---- footprint and digest (docs/v41.md §11.7) -------------------------------------------------------

// The text model's size for a config, from its schema alone (no vision, no DSpark stages): for a
// refusal before any tensor is read or made.
struct V41Footprint {
  int64_t parameters = 0;    // FP4 codes counted two per byte, scales not counted
  int64_t stored_bytes = 0;  // the shards' tensor bytes
};
V41Footprint v41_footprint(const V41Config& c);
// InputError with the figures for a config the reference cannot hold here (v41-flash always: it is
// analytic_only).
void check_v41_fits_in_memory(const V41Config& c);
// FNV-1a 64 over every tensor's name, dtype, shape (int64 little-endian) and bytes, in name order, as
// 16 hex digits: the same tensors give the same digest whatever the sharding.
std::string v41_weights_digest(const SafetensorsFile& f);

}  // namespace ced::v41
