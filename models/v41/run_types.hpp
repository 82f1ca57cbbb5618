#pragma once
// The v41 family's run vocabulary (docs/v41.md §8, §13): the numeric regimes and the release's open
// switches, the negative controls, Engram's hashing, what a forward captures and leaves (captures, caches,
// decode state, prefix hits), and CED's replay conventions and encoder-replay rules with their spans. The
// reference model (reference/v41/forward.hpp), the run file, the checkpoint reader and the gate all speak it;
// none of it computes a layer.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/v41/config.hpp"
#include "models/v41/plan.hpp"

namespace ced::v41 {


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
  mhc_comb_transposed,        // each sublayer's hc mixing matrix applied untransposed (Megatron-LM, NeMo):
                              // comb[j, i] where comb[i, j] belongs; the captured matrix is right
  index_topk_capped,          // the index top-k hard-coded to half the config's index_topk (ATOM's 1024 for
                              // 512): the rest of each selection -1, prefill and decode; invisible while a
                              // row has no more groups than the cap
  index_relu_dropped,         // the index score's ReLU left out (1Cat-vLLM): negative head scores subtract
  window_ring_drops_last,     // a prefill longer than the window seeds the decode's ring without its last
                              // row's entry (MLX ports: no N - 1 entry once the 128-slot ring wraps)
  index_cache_offset,         // decode reads the index-key cache one group late (1Cat-vLLM's byte offsets):
                              // group g's score from key g + 1, the last from an empty row
  prefix_cache_keyed_by_length,  // resume: the prefix cache keyed by the hit's length alone (MLX ports' contamination
                                 // between requests): the first request's cached groups served to every later
                                 // request with a hit of that length
  compressor_without_lengths,  // the prefill's pooling compressor (ratio > 1) given no sequence lengths (an Ascend
                               // fork): it pools no group, and the attention reads zeros for every group its
                               // positions count; invisible until a group completes
  router_ties_lowest_index,    // not a bug: the router's top-k breaks an exact tie of biased scores lower expert
                               // first, where torch's CPU top-k puts it elsewhere (vLLM's two router kernels):
                               // another correct order, which the gate must admit
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
  int64_t first_row = 0;            // the position of its first row: 0 in a prefill, the tail's first in a CED
                                    // replay's layers from the cut, a resumed prompt's first recomputed row
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

}  // namespace ced::v41
