#pragma once
// The v41 prefill (docs/v41.md §8): what the release's inference/model.py computes for one prompt
// from position 0, for a V41Config and the weights in the release's tensor names, dtypes and layouts,
// under a named numeric regime. Every layer can be captured, and run alone on given input streams
// (teacher forcing), so that a comparison with the official code is made layer by layer.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.hpp"
#include "models/v41/config.hpp"
#include "models/v41/plan.hpp"

namespace ced::v41 {
namespace fwd {
struct LayerCtx;
}

// docs/v41.md §8.1. f64: the official maths and its quantization points (window KV FP8, latent FP4
// per 16, index q/k FP4 per 32) in double, nothing else rounded. bf16: the official dtype="bf16"
// run: weights dequantized to bf16 (fp32 where model.py keeps them fp32), bf16 activations between
// ops, fp32 arithmetic inside them, the same quantization points.
// release: the official dtype="fp8" run: as bf16, and every FP8/FP4 linear's input FP8-quantized per
// 32 (act_quant) with the product block-scaled (fp32 partials per 32 along K, scaled and summed in K
// order), the weights as stored.
enum class V41Regime { f64, bf16, release };
const std::vector<std::string>& v41_regime_names();  // "f64", "bf16", "release"
const char* v41_regime_name(V41Regime r);
V41Regime v41_regime_from_name(std::string_view name);  // InputError naming the known ones

// What the release leaves open (docs/v41.md §8.7), with the official code's behaviour as default.
enum class V41TopkTies { torch, lowest_index };  // equal index scores: torch's CPU top-k | lower position first
enum class V41IndexScores { bf16, fp32 };        // the index score's three bf16 roundings kept | none
// Which index keys a decode step scores against (docs/v41.md §8.8). model.py republishes an owner's
// keys only on a step that completes its group, so on the other steps a ratio-2 indexer reads the keys
// the last publisher left (another layer's, of another ratio): `official`. Ports that mend it score
// every indexer against its own owner's keys on every step: `owner`. Prefill is the same either way.
enum class V41DecodeIndexK { official, owner };
struct V41Options {
  V41TopkTies topk_ties = V41TopkTies::torch;
  V41IndexScores index_scores = V41IndexScores::bf16;
  V41DecodeIndexK decode_index_k = V41DecodeIndexK::official;
};
V41TopkTies v41_topk_ties_from_name(std::string_view name);        // "torch" | "lowest-index"; InputError
V41IndexScores v41_index_scores_from_name(std::string_view name);  // "bf16" | "fp32"; InputError
V41DecodeIndexK v41_decode_index_k_from_name(std::string_view name);  // "official" | "owner"; InputError
const char* v41_topk_ties_name(V41TopkTies t);
const char* v41_index_scores_name(V41IndexScores s);
const char* v41_decode_index_k_name(V41DecodeIndexK k);

// Negative controls (docs/v41.md §12.4): bugs the ports really had, planted on demand so that a test can
// show the gate catching each at its layer. Never set outside those tests.
enum class V41Fault {
  none,
  v4_q_norm,                  // V4's per-head RMS norm of q left in after wq_b
  one_rope_theta,             // rope_theta without YaRN on every layer, compressed ones included
  unrotated_compressed_keys,  // the compressed KV published without its RoPE
  unclamped_shared_expert,    // the shared expert's SwiGLU without swiglu_limit
  mhc_same_sublayer,          // each sublayer collapsed with its own fresh pre, not the previous one's
  decode_group_rope_at_step,  // decode: a completed group's latent and index key rotated at the step's
                              // position, not at its first token's (start_pos + 1 - ratio)
  decode_fresh_compressor,    // decode: the compressor's partial group started empty, the prefill's
                              // trailing tokens of it dropped (a lost hand-off of kv_state)
  ced_ring_slot_of_row,       // ced: a tail's window ring seeded at slot r mod W of its row r, not at
                              // (offset + r) mod W of its position
  ced_floor_on_row_index,     // ced: the window floor compared with a tail row's index, not its position
  ced_cut_floor_flipped,      // ced: the cut layer's window floored where the convention keeps it whole,
                              // and whole where it floors it
  resume_start_off_by_one,    // resume: the encoder's window rebuilt from H - W + 1, not H - W (a hit not
                              // aligned to a block, counted from the wrong end)
  ced_replayed_row_ulp,       // ced: the tail's last row leaves every tail layer and the head one ulp (of
                              // double) above its value, every span and floor right: not a port's bug,
                              // a tail whose bits are off where they must be exact
};
const std::vector<std::string>& v41_fault_names();  // "none", "v4-q-norm", ... (the enum's order)
V41Fault v41_fault_from_name(std::string_view name);  // InputError naming the known ones

// How token ids become Engram hash ids (docs/v41.md §9.2): the tokenizer's compressed token map
// [vocab_size] and, per Engram layer, its max_ngram_size odd multipliers (engram.py derives them
// from NumPy's default_rng(10007 * layer)). Empty when the config has no Engram layers.
struct V41EngramHashing {
  std::vector<int64_t> token_map;                 // [vocab_size] -> [0, engram_compressed_vocab_size)
  std::vector<std::vector<int64_t>> multipliers;  // [engram layers][max_ngram_size]
};
// The stub tokenizer's map (id -> id / 2) that the official oracle's tiny and wide presets use.
std::vector<int64_t> v41_halving_token_map(const V41Config& c);
// The multipliers engram.py derives for each Engram layer (NumPy's default_rng(10007 · layer), its
// bounded int64 draw, · 2 + 1): [engram layers][max_ngram_size].
std::vector<std::vector<int64_t>> v41_engram_multipliers(const V41Config& c);

// What the attention layers hand down the stack (model.py's SharedAttentionRuntime): the latest
// published compressed KV and index keys (kv sources), selection (index sources) and candidate pool.
struct V41SharedAttention {
  int64_t ratio = 0;               // the ratio of the published compressed KV
  int64_t compress_rows = 0;       // N / ratio
  std::vector<double> compress_kv; // [compress_rows, head_dim], after RoPE and FP4 QDQ
  std::vector<double> index_k;     // [compress_rows, index_head_dim], after RoPE and FP4 QDQ
  int64_t topk = 0;                // columns of topk_idxs
  std::vector<int32_t> topk_idxs;  // [N, topk], offset by N (the window rows); -1 = none
  std::vector<uint8_t> candidates; // [N, compress_rows] of the candidate source; empty before it
};

// One block's captures (docs/v41.md §9.3). Streams are [N, hc_mult, dim] in row-major order.
struct V41LayerCapture {
  int64_t layer = 0;
  std::vector<double> engram_in;    // streams before Engram (Engram layers only)
  std::vector<int64_t> hash_ids;    // [N, (max_ngram_size - 1) * engram_n_heads] (Engram layers)
  std::vector<double> in;           // streams entering the block, after Engram
  std::vector<double> pre_mix;      // [N, hc] the collapse weights the block's attention receives
  std::vector<double> attn_pre, attn_post, attn_comb;  // [N, hc], [N, hc], [N, hc, hc]
  std::vector<double> ffn_pre, ffn_post, ffn_comb;     // ffn_pre is the next block's pre_mix
  int64_t topk = 0;
  std::vector<int32_t> topk_idxs;   // [N, topk] index sources: the selection published
  std::vector<double> index_score;  // [N, N / ratio] index sources: the masked score the top-k read
  std::vector<double> compress_kv, index_k;  // kv sources: what they published
  std::vector<uint8_t> candidates;  // the candidate source: [N, N / ratio]
  std::vector<double> attn_x, attn_out;  // [N, dim] the attention's input (attn_norm's output), its output
  std::vector<double> ffn_x, ffn_out;    // [N, dim] the MoE's input (ffn_norm's output), its output
  std::vector<double> latent;            // [N / ratio, head_dim] kv sources: the compressor's RoPE-free latent
  std::vector<double> attn_q;            // [N, n_heads, head_dim] sparse_attn's query (after RoPE)
  std::vector<double> attn_kv;           // [N + N / ratio, head_dim] its rows: window KV, then compressed KV
  std::vector<int32_t> attn_idx;         // [N, k] its index lists: window, then compressed (offset by N)
  std::vector<double> attn_o;            // [N, n_heads, head_dim] its output (before the inverse RoPE)
  std::vector<int32_t> experts;          // [N, n_activated_experts] the routed experts, ascending
  std::vector<double> expert_weights;    // [N, n_activated_experts] their route weights, alongside
  std::vector<double> out;          // streams leaving the block
};

struct V41ForwardResult {
  int64_t N = 0;
  int64_t first_row = 0;  // the position of the first row of logits and final (a CED replay's tail)
  std::vector<V41LayerCapture> layers;  // [n_layers]
  std::vector<double> final_collapsed;  // [N, dim] the last collapse (bf16 values in bf16)
  std::vector<double> final_normed;     // [N, dim] after norm
  std::vector<double> logits;           // [N, vocab_size] every position (fp32 values in bf16)
};

// How an engine cuts the rows of a CED prefill (docs/v41.md §13.1), as data. The cut layer is the first
// whose rows are cut to the tail: E (the last kv source) in every serving engine, 0 in the all-layers
// tail. Layers below it run on every row; the cut layer runs on every row for its sources (collapse,
// norm, compressor, index keys) and, unless its window is floored, its window keys, and is then cut;
// the layers above it run on the tail, their windows floored at its first row. With the all-layers
// tail, a first pass runs the prompt's layers up to E on every row (the prefill side) and the replay's
// kv sources read the compressed KV and index keys it wrote, their compressors skipped.
struct V41ReplayConvention {
  const char* name;          // "sglang", "trtllm", "vllm", "atom", "ascend"
  bool all_layers;           // the tail starts at layer 0 (sources from the prefill side), else at E
  bool floor_first_layer;    // the cut layer's window floored at the tail (its window keys of the tail only)
  bool speculative_tail;     // the bounded tail is W + k rows for k speculative tokens (else W)
  const char* source;        // the engine code it follows
};
const std::vector<V41ReplayConvention>& v41_replay_conventions();
const V41ReplayConvention& v41_replay_convention(std::string_view name);  // InputError naming the known
// The layers whose windows are floored: from the cut layer (or the one after it) to the last.
int64_t v41_floored_layers(const V41Plan& p, const V41ReplayConvention& c);
// The fewest replayed rows for which the last position is exact: 1 + F (W - 1), F the floored layers.
int64_t v41_exact_span(const V41Plan& p, const V41ReplayConvention& c);
// The fewest for which the next decode step is exact too: F (W - 1) (its own row is the step's).
int64_t v41_exact_decode_span(const V41Plan& p, const V41ReplayConvention& c);
// The bounded replay's rows: W, or W + speculative for a convention whose tail holds the drafts.
int64_t v41_bounded_tail(const V41Plan& p, const V41ReplayConvention& c, int64_t speculative);

// What one layer keeps between a prefill and its decode steps (model.py's per-layer buffers).
struct V41LayerCache {
  std::vector<double> window;       // [W, head_dim] the window KV ring: position p at slot p % W (zeros unwritten)
  std::vector<double> kv_state;     // [ratio, head_dim] kv sources of ratio > 1: the group being filled, its
  std::vector<double> score_state;  // fp32 wkv and wgate rows at slot p % ratio (score -inf unwritten)
  std::vector<double> compress_kv;  // [rows, head_dim] kv sources: every compressed row so far (RoPE, FP4)
  std::vector<double> index_k;      // [rows, index_head_dim] index-key owners: every index key so far
};

// The state a decode step reads and extends: the caches, the token history (Engram's n-grams reach
// back) and model.py's shared_attn, whose compressed KV and index keys are the cache of the layer
// that last published them (a pointer in model.py: here that layer's number).
struct V41DecodeState {
  int64_t pos = 0;                    // tokens consumed: the next step's start_pos
  std::vector<int64_t> tokens;        // [pos] every token so far
  std::vector<V41LayerCache> layers;  // [n_layers]
  int64_t compress_kv_from = -1, index_k_from = -1;
  int64_t topk = 0;                   // this step's published selection: [1, topk], offset by W
  std::vector<int32_t> topk_idxs;
  std::vector<uint8_t> candidates;    // [1, (pos + 1) / ratio] of the candidate source, this step
};

struct V41LayerWeights;

// What a prefix cache holds of a prompt's first `tokens` tokens (docs/v41.md §13.8): each kv source's
// compressed KV and each index-key owner's keys, of the groups complete within them; the window KV and the
// group being filled are not kept (the engines evict them).
struct V41PrefixHit {
  int64_t tokens = 0;
  std::vector<V41LayerCache> layers;  // [n_layers]: compress_kv, index_k (empty where a layer has none)
};

// How an engine rebuilds the encoder's windows after a prefix-cache hit at H (docs/v41.md §13.8), as data.
// Every rule recomputes the hit's last W tokens (the window) through every layer, their windows floored at
// the first of them, and the tokens of a ratio-2 group pending at the hit (TensorRT-LLM's re-included raw
// token; the cache has no group state); the cached groups are read-only.
struct V41EncoderReplayRule {
  const char* name;          // "vllm", "trtllm", "sglang"
  bool adopts_short_hits;    // a hit of fewer than W tokens is used (else the prompt runs cold)
  bool even_boundary;        // the hit is cut to an even length (no ratio-2 group pending at it)
  const char* source;        // the engine code it follows
};
const std::vector<V41EncoderReplayRule>& v41_encoder_replay_rules();
const V41EncoderReplayRule& v41_encoder_replay_rule(std::string_view name);  // InputError naming the known
// Where a resume after a hit at H starts: the hit adopted and the first recomputed row. rebuilt: the window
// rows recomputed before the hit (W in every engine; any K >= 0 for a sweep).
struct V41Resume {
  int64_t hit = 0, start = 0;
};
V41Resume v41_resume(const V41Plan& p, const V41EncoderReplayRule& rule, int64_t H, int64_t rebuilt);
// The fewest rows rebuilt before a hit at H for which the resume is the cold run, bitwise: each kv source k's
// groups from the hit on (from a pending group's first token) are computed from rows whose inputs at layer
// k read k (W - 1) rows before them; the largest over the kv sources (2540 on the release, as many as the
// decoder's floored layers would make it, from the encoder's depth instead).
int64_t v41_encoder_replay_span(const V41Plan& p, int64_t H);

// What a CED prefill's layers below its cut leave, every row (V41Model::ced_encoding): the same for every
// replay length under conventions of one cut, so a search or a sweep over replays computes it once.
struct V41CedEncoding {
  int64_t N = 0, cut = 0;              // the prompt's rows; the first layer cut to the tail (E, or 0)
  int64_t first = 0;                   // a resumed prompt's first recomputed row (its rows from it on)
  const V41PrefixHit* hit = nullptr;   // a resumed prompt's cached groups
  bool all_layers = false;             // made for the all-layers tail (its prefill side's sources below)
  std::vector<int64_t> tokens, hashes; // the prompt; its Engram hash ids, every layer
  std::vector<double> h, pre;          // the cut layer's input streams [N, hc, dim] and pre_mix [N, hc]
  V41SharedAttention shared;           // what the layers below the cut published
  std::vector<V41LayerCache> sources;  // all-layers: each kv source's compressed KV, index keys, group state
  std::vector<V41LayerCapture> layers; // the layers below the cut
  std::vector<V41LayerCache> caches;   // with decode: [n_layers], the layers below the cut's filled
};

// The weights of one config, dequantized once (docs/v41.md §8.2), and the forward over them.
class V41Model {
 public:
  // The config must be valid and not analytic_only; every tensor the layout implies must be
  // present with its dtype and shape (InputError naming the first that is not). Tensors the
  // forward does not read (gate.bias_vl) may be present.
  V41Model(const V41Config& config, const SafetensorsFile& weights, V41Regime regime);
  ~V41Model();
  V41Model(V41Model&&) noexcept;

  const V41Config& config() const { return config_; }
  const V41Plan& plan() const { return plan_; }
  V41Regime regime() const { return regime_; }
  // The head's weights (the final RMSNorm's [dim], the output projection's [vocab, dim]), for the gate's
  // bounds of the head (docs/sound-bounds.md §7).
  std::span<const double> final_norm_weight() const { return norm_; }
  std::span<const double> head_weight() const { return head_; }
  // A layer's router (its gate's [n_routed_experts, dim] weight and its bias), for the gate's router bounds.
  std::span<const double> gate_weight(int64_t layer) const;
  std::span<const double> gate_bias(int64_t layer) const;
  // The switches of what the release leaves open, for every later forward.
  void set_options(const V41Options& o) { options_ = o; }
  const V41Options& options() const { return options_; }
  // Whether a forward keeps every capture (the default; run files and the gate read them) or only the
  // small ones (selections, experts, the mixes, each layer's output on the last row only): a run that
  // writes none skips copying the rest.
  void set_captures(bool all) { captures_ = all; }
  // Plants a negative control (V41Fault) in every later forward; none removes it.
  void set_fault(V41Fault f) { fault_ = f; }
  // The dependency probe of a CED replay (docs/v41.md §13.3): every window key a floor leaves out is read
  // as a NaN key instead of skipped, so a position's logits are finite exactly when its cone was replayed.
  void set_floor_probe(bool on) { floor_probe_ = on; }
  V41Fault fault() const { return fault_; }

  // Hash ids for the prompt: [N, n_engram_layers, (max_ngram_size - 1) * engram_n_heads].
  std::vector<int64_t> engram_hash_ids(std::span<const int64_t> tokens, const V41EngramHashing& h) const;
  // Engram layer number `index` (0 for the first Engram layer)'s columns of those: [N, cols].
  std::vector<int64_t> engram_layer_hash_ids(std::span<const int64_t> ids, int64_t N, int64_t index) const;

  // The whole prefill. tokens: [N] in [0, vocab_size). hashing: needed when Engram is on. With a
  // state, it is seeded for decode steps after the prompt (model.py's buffers after a prefill).
  V41ForwardResult forward(std::span<const int64_t> tokens, const V41EngramHashing& hashing,
                           V41DecodeState* state = nullptr) const;

  // A CED prefill (docs/v41.md §13): the encoder layers on every row, layer E's sources on every row,
  // the decoder layers on the last `replay` rows under the convention. The result's logits and final
  // rows are the tail's (first_row = N - replay, or 0); its layers' captures hold the rows each ran.
  // With a state, it is seeded for decode steps after the prompt, from the rows each layer ran.
  V41ForwardResult forward_ced(std::span<const int64_t> tokens, const V41EngramHashing& hashing, int64_t replay,
                               const V41ReplayConvention& convention, V41DecodeState* state = nullptr) const;
  // The layers below the convention's cut, once (with `decode`, their decode buffers too), and any
  // number of replays on it: forward_ced(encoding, R, convention) is forward_ced(tokens, R, convention)
  // bitwise.
  V41CedEncoding ced_encoding(std::span<const int64_t> tokens, const V41EngramHashing& hashing,
                              const V41ReplayConvention& convention, bool decode = false) const;
  V41ForwardResult forward_ced(const V41CedEncoding& encoding, int64_t replay, const V41ReplayConvention& convention,
                               V41DecodeState* state = nullptr) const;
  // The prefix cache of the first H tokens from the state a prefill (or a ced prefill: its layers up to the cut
  // are the prefill's) of at least H tokens seeded; the groups are causal, so these are the cache's bits.
  V41PrefixHit prefix_hit(const V41DecodeState& state, int64_t H) const;
  // A prompt resumed after a prefix-cache hit (docs/v41.md §13.8): the rows from the rule's start on (with
  // `rebuilt` window rows before the hit) through every layer below the convention's cut, or through every
  // layer without one (a full prefill), their windows floored at the start; each kv source reads the cached
  // groups and computes those after them; then the cut and the layers above it as forward_ced, on the last
  // `replay` rows (all the recomputed ones at most). The result's first_row is its first logits row.
  V41ForwardResult forward_resume(std::span<const int64_t> tokens, const V41EngramHashing& hashing,
                                  const V41PrefixHit& hit, const V41EncoderReplayRule& rule, int64_t rebuilt,
                                  int64_t replay, const V41ReplayConvention* convention,
                                  V41DecodeState* state = nullptr) const;
  // The prefill side's source-only write of layer `layer` (a kv source): its collapse with the previous
  // sublayer's pre_mix, attn_norm, compressor and index keys over every row, and nothing after them.
  // Its compress_kv and index_k (when it owns them) and, with a ratio > 1, its kv_state and score_state
  // are what a prefill leaves in the layer's cache.
  V41LayerCache source_write(int64_t layer, std::span<const double> streams, std::span<const double> pre_mix,
                             int64_t N) const;

  // One decode step (model.py Transformer.forward with start_pos = state.pos, one token) on a state a
  // prefill seeded: a result of N = 1 (its layers' captures, logits [1, vocab]); the state advances.
  V41ForwardResult decode_step(int64_t token, const V41EngramHashing& hashing, V41DecodeState& state) const;
  // One block of a decode step fed the given streams [1, hc, dim] and pre_mix [1, hc] (teacher forcing),
  // at position state.pos, reading and extending the state; the caller appends the token to
  // state.tokens before the first layer and advances state.pos after the last.
  V41LayerCapture decode_layer(int64_t layer, std::span<const double> streams, std::span<const double> pre_mix,
                               std::span<const int64_t> hash_ids, V41DecodeState& state) const;
  // The attention of a decode step alone, on x [1, dim] (attn_norm's output), extending the state.
  std::vector<double> attention_step(int64_t layer, std::span<const double> x, V41DecodeState& state,
                                     V41LayerCapture& cap) const;
  // model.py's shared_attn pointers after a prefill of state.pos tokens (a state built from another's
  // caches, as the gate does from the official's): the last kv source, the last owner whose keys exist.
  void seed_decode_pointers(V41DecodeState& state) const;
  // The hash ids of the newest token of state.tokens: [n_engram_layers, cols].
  std::vector<int64_t> engram_step_hash_ids(const V41DecodeState& state, const V41EngramHashing& hashing) const;

  // The embedding, expanded to hc_mult identical streams: [N, hc, dim]; and the one-hot pre_mix.
  std::vector<double> embed(std::span<const int64_t> tokens) const;
  std::vector<double> initial_pre_mix(int64_t N) const;

  // One block fed the given streams (before its Engram, if it has one) and pre_mix, reading and
  // updating the shared attention state. hash_ids: [N, cols] this layer's (empty without Engram).
  // cache: when given, the layer's decode buffers are seeded from this prefill.
  V41LayerCapture run_layer(int64_t layer, std::span<const double> streams, std::span<const double> pre_mix,
                            int64_t N, std::span<const int64_t> hash_ids, V41SharedAttention& shared,
                            V41LayerCache* cache = nullptr) const;

  // The two sublayers alone (for a comparison fed another's sublayer inputs): the attention on x
  // [N, dim] (attn_norm's output), reading and updating shared; the MoE on x (ffn_norm's output).
  std::vector<double> attention(int64_t layer, std::span<const double> x, int64_t N, V41SharedAttention& shared,
                                V41LayerCapture& cap) const;
  std::vector<double> moe(int64_t layer, std::span<const double> x, int64_t N, V41LayerCapture& cap) const;
  // Two ops of the attention alone (op-level forcing, docs/sound-bounds.md §13): sparse_attn on a given query
  // q [N, n_heads, head_dim], rows kv [rows, head_dim] and index lists idx [N, k]; the output projection (the
  // inverse RoPE, wo_a by groups, wo_b) on a given sparse_attn output o [N, n_heads, head_dim]. [N, .., ..].
  std::vector<double> attention_core(int64_t layer, std::span<const double> q, std::span<const double> kv,
                                     std::span<const int32_t> idx, int64_t N) const;
  // (rows at positions first .. first + N - 1: a decode step's one row at its position).
  std::vector<double> attention_output(int64_t layer, std::span<const double> o, int64_t N, int64_t first = 0) const;
  // A layer's weights, for the gate's bounds.
  const V41LayerWeights& layer_weights(int64_t layer) const { return *layers_.at(static_cast<size_t>(layer)); }

  // The final collapse with the last block's ffn_pre, norm and head: logits [N, vocab].
  void head(std::span<const double> streams, std::span<const double> pre_mix, int64_t N,
            V41ForwardResult& out) const;
  // norm and head alone, on a given final collapse [N, dim].
  void head_collapsed(std::span<const double> collapsed, int64_t N, V41ForwardResult& out) const;

 private:
  // The prefill (S = 0) or a CED replay of the rows from S on (docs/v41.md §13) under a convention;
  // with a state, the decode buffers seeded.
  V41ForwardResult run_stack(std::span<const int64_t> tokens, const V41EngramHashing& hashing, int64_t S,
                             const V41ReplayConvention* convention, V41DecodeState* state) const;
  // run_layer on rows at positions first .. first + N - 1 with the window floored at `floor`; a kv source
  // on a tail reads `sources` (the prefill side's compressed KV and index keys) instead of computing them.
  V41LayerCapture run_rows(int64_t layer, std::span<const double> streams, std::span<const double> pre_mix, int64_t N,
                           std::span<const int64_t> hash_ids, V41SharedAttention& shared, V41LayerCache* cache,
                           int64_t first, int64_t floor, const V41LayerCache* sources = nullptr) const;
  // The layers below `cut` on every row (with the all-layers tail's prefill side; with their caches).
  // A resumed prompt's rows from `first`, its kv sources reading `hit`.
  V41CedEncoding encode_below(std::span<const int64_t> tokens, const V41EngramHashing& hashing, int64_t cut,
                              bool prefill_side, bool caches, const V41PrefixHit* hit, int64_t first) const;
  // The cached groups a layer of a resumed encoding reads (none elsewhere).
  const V41LayerCache* hit_sources(const V41CedEncoding& enc, const LayerPlan& lp) const;
  // The cut layer and those above it on an encoding, the tail from row S (S = 0: every row).
  V41ForwardResult replay_tail(V41CedEncoding enc, int64_t S, const V41ReplayConvention* convention,
                               V41DecodeState* state) const;
  // Without every capture, a layer's output streams [hc, dim] of the last row only.
  void keep_last_row(V41LayerCapture& cap, const std::vector<double>& streams) const;
  // A layer's Engram hash ids [rows, cols] for the rows from S (empty without Engram).
  std::vector<int64_t> layer_hash_ids(const V41CedEncoding& enc, const LayerPlan& lp, int64_t S) const;
  // The all-layers tail's prefill side: layers 0 .. E - 1 on every row (encode_below to E), then layer E's
  // source-only write; each kv source's cache (compressed KV, index keys, group state).
  std::vector<V41LayerCache> prefill_side_sources(std::span<const int64_t> tokens,
                                                  const V41EngramHashing& hashing) const;
  template <typename Attend>
  V41LayerCapture block(const fwd::LayerCtx& L, std::span<const double> streams, std::span<const double> pre_mix,
                        std::span<const int64_t> hash_ids, Attend attend) const;

  V41Config config_;
  V41Plan plan_;
  V41Regime regime_;
  V41Fault fault_ = V41Fault::none;
  V41Options options_;
  bool captures_ = true;
  bool floor_probe_ = false;
  std::vector<double> embed_, norm_, head_;
  std::vector<std::unique_ptr<V41LayerWeights>> layers_;
};

}  // namespace ced::v41
