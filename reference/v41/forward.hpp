#pragma once
// The v41 prefill (docs/v41.md §8): what the release's inference/model.py computes for one prompt
// from position 0, for a V41Config and the weights in the release's tensor names, dtypes and layouts,
// under a named numeric regime. Every layer can be captured, and run alone on given input streams
// (teacher forcing), so that a comparison with the official code is made layer by layer.
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "io/safetensors.hpp"
#include "models/v41/run_types.hpp"

namespace ced::v41 {
namespace fwd {
struct LayerCtx;
}

struct V41LayerWeights;

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
  // The planted prefix_cache_keyed_by_length: the first hit of each length, served to every later resume of it.
  struct StaleHits {
    std::mutex mutex;
    std::map<int64_t, V41PrefixHit> by_length;
  };
  std::shared_ptr<StaleHits> stale_hits_ = std::make_shared<StaleHits>();
};

}  // namespace ced::v41
