// docs/v41.md §8: the v41 prefill (model.py Transformer.forward and Block.forward, start_pos 0).
#include "reference/v41/forward.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "model/error.hpp"
#include "reference/v41/forward_ops.hpp"
#include "reference/v41/forward_weights.hpp"

namespace ced::v41 {

namespace {
// A layer's activations are tens of MiB (v41-wide's queries and attention output at N = 1024 are
// 32 MiB each as doubles), above glibc's mmap threshold (at most 32 MiB when it adapts): each was
// mapped fresh and unmapped on free, so every layer faulted its pages in again and the kernel zeroed
// them (a tenth of a one-thread v41-wide prefill). Blocks up to 1 GiB now come from the heap and
// freed memory stays with the process for reuse. Set once, for the whole process; it changes which
// memory is reused, never a value (a glibc that refuses the setting keeps its own).
void keep_freed_memory() {
#ifdef __GLIBC__
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
#endif
}
}  // namespace

V41Model::V41Model(const V41Config& config, const SafetensorsFile& weights, V41Regime regime)
    : config_(config), regime_(regime) {
  keep_freed_memory();
  validate_v41(config_);
  if (config_.analytic_only)
    throw InputError(fmt::format("v41 forward: {} is analytic only; nothing runs it", config_.name));
  plan_ = make_v41_plan(config_);
  const int64_t V = config_.vocab_size, D = config_.dim;
  embed_ = load_v41_tensor(weights, "embed.weight", {V, D});
  norm_ = load_v41_tensor(weights, "norm.weight", {D});
  head_ = load_v41_tensor(weights, "head.weight", {V, D});
  for (const LayerPlan& lp : plan_.layers)
    layers_.push_back(std::make_unique<V41LayerWeights>(load_v41_layer_weights(config_, lp, weights)));
  for (auto& l : layers_) fwd::pack_layer_linears(fwd::Arith(regime_), *l);
}

V41Model::~V41Model() = default;
V41Model::V41Model(V41Model&&) noexcept = default;

std::vector<double> V41Model::embed(std::span<const int64_t> tokens) const {
  const int64_t N = static_cast<int64_t>(tokens.size()), hc = config_.hc_mult, D = config_.dim;
  std::vector<double> h(static_cast<size_t>(N * hc * D));
  for (int64_t t = 0; t < N; ++t) {
    const int64_t id = tokens[static_cast<size_t>(t)];
    if (id < 0 || id >= config_.vocab_size)
      throw InputError(fmt::format("v41 forward: token {} at position {} is outside [0, {})", id, t, config_.vocab_size));
    for (int64_t i = 0; i < hc; ++i) std::copy_n(embed_.begin() + id * D, D, h.begin() + (t * hc + i) * D);
  }
  return h;
}

std::vector<double> V41Model::initial_pre_mix(int64_t N) const {
  std::vector<double> p(static_cast<size_t>(N * config_.hc_mult), 0.0);
  for (int64_t t = 0; t < N; ++t) p[static_cast<size_t>(t * config_.hc_mult)] = 1.0;  // one-hot on stream 0
  return p;
}

std::vector<int64_t> V41Model::engram_hash_ids(std::span<const int64_t> tokens, const V41EngramHashing& hsh) const {
  const V41Config& c = config_;
  const int64_t N = static_cast<int64_t>(tokens.size()), nl = static_cast<int64_t>(c.engram_layer_ids.size());
  const int64_t ng = c.engram_max_ngram_size, nh = c.engram_n_heads, cols = (ng - 1) * nh;
  if (nl == 0) return {};
  if (static_cast<int64_t>(hsh.token_map.size()) != c.vocab_size || static_cast<int64_t>(hsh.multipliers.size()) != nl)
    throw InputError(fmt::format("v41 engram: the hashing needs a token map of {} ids and multipliers for {} layers "
                                 "(got {} and {})",
                                 c.vocab_size, nl, hsh.token_map.size(), hsh.multipliers.size()));
  const auto primes = v41_engram_primes(c);
  const int64_t pad = hsh.token_map[static_cast<size_t>(c.engram_pad_id)];
  std::vector<int64_t> ids(static_cast<size_t>(N * nl * cols));
  for (int64_t t = 0; t < N; ++t) {
    // The ids at shifts 0 .. ng - 1; a shift before the start is blocked, and so is every older one.
    std::vector<int64_t> tok(static_cast<size_t>(ng));
    for (int64_t s = 0; s < ng; ++s) tok[static_cast<size_t>(s)] = t < s ? pad : hsh.token_map[static_cast<size_t>(tokens[static_cast<size_t>(t - s)])];
    for (int64_t l = 0; l < nl; ++l) {
      const auto& mult = hsh.multipliers[static_cast<size_t>(l)];
      const auto& pr = primes[static_cast<size_t>(l)];
      // XOR the multiplied ids one shift at a time: after shift n - 1, the n-gram's hash; each
      // (n-gram, head) column takes it modulo its prime, plus the column's offset (the primes before it).
      uint64_t rolling = static_cast<uint64_t>(tok[0]) * static_cast<uint64_t>(mult[0]);
      int64_t offset = 0;
      for (int64_t n = 1; n < ng; ++n) {
        rolling ^= static_cast<uint64_t>(tok[static_cast<size_t>(n)]) * static_cast<uint64_t>(mult[static_cast<size_t>(n)]);
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t p = pr[static_cast<size_t>((n - 1) * nh + h)];
          ids[static_cast<size_t>((t * nl + l) * cols + (n - 1) * nh + h)] =
              static_cast<int64_t>(rolling % static_cast<uint64_t>(p)) + offset;
          offset += p;
        }
      }
    }
  }
  return ids;
}

// One block (model.py Block.forward): Engram, the attention's mixes and its collapse with the previous
// sublayer's pre (staggered), the attention `attend`, the FFN's mixes, its collapse with this attention's
// pre, the MoE. The prefill and a decode step differ only in `attend`.
template <typename Attend>
V41LayerCapture V41Model::block(const fwd::LayerCtx& L, std::span<const double> streams,
                                std::span<const double> pre_mix, std::span<const int64_t> hash_ids,
                                Attend attend) const {
  const V41Config& c = config_;
  const V41LayerWeights& w = L.w;
  const fwd::Arith& a = L.a;
  const int64_t N = L.N, hc = c.hc_mult, D = c.dim;
  if (static_cast<int64_t>(streams.size()) != N * hc * D || static_cast<int64_t>(pre_mix.size()) != N * hc)
    throw InputError(fmt::format("v41 layer {}: streams must be [N, {}, {}] and pre_mix [N, {}] for N = {}", L.lp.layer,
                                 hc, D, hc, N));
  V41LayerCapture cap;
  cap.layer = L.lp.layer;
  std::vector<double> x(streams.begin(), streams.end());
  if (L.lp.engram) {
    if (captures_) cap.engram_in = x;
    cap.hash_ids.assign(hash_ids.begin(), hash_ids.end());
    fwd::engram_forward(L, x, hash_ids);
  }
  if (captures_) cap.in = x;
  cap.pre_mix.assign(pre_mix.begin(), pre_mix.end());

  fwd::HcMix am = fwd::hc_mixes(a, x, N, hc, D, w.hc_attn_fn, w.hc_attn_scale, w.hc_attn_base, c.norm_eps,
                                c.hc_sinkhorn_iters, c.hc_eps);
  const bool same_sublayer = fault_ == V41Fault::mhc_same_sublayer;
  std::vector<double> y = fwd::hc_pre(a, x, same_sublayer ? std::span<const double>(am.pre) : pre_mix, N, hc, D);
  fwd::rmsnorm(a, y, D, w.attn_norm, c.norm_eps);
  if (captures_) cap.attn_x = y;
  y = attend(y, cap);
  if (captures_) cap.attn_out = y;
  // The planted mhc-comb-transposed applies each token's [hc, hc] matrix as its transpose (a copy made only
  // then; each sublayer's hc_post reads it before the next is made).
  std::vector<double> transposed;
  auto applied = [&](const std::vector<double>& comb) -> std::span<const double> {
    if (fault_ != V41Fault::mhc_comb_transposed) return comb;
    transposed.resize(comb.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < hc; ++i)
        for (int64_t j = 0; j < hc; ++j)
          transposed[static_cast<size_t>((n * hc + i) * hc + j)] = comb[static_cast<size_t>((n * hc + j) * hc + i)];
    return transposed;
  };
  x = fwd::hc_post(a, y, x, am.post, applied(am.comb), N, hc, D);

  fwd::HcMix fm = fwd::hc_mixes(a, x, N, hc, D, w.hc_ffn_fn, w.hc_ffn_scale, w.hc_ffn_base, c.norm_eps,
                                c.hc_sinkhorn_iters, c.hc_eps);
  y = fwd::hc_pre(a, x, same_sublayer ? fm.pre : am.pre, N, hc, D);
  fwd::rmsnorm(a, y, D, w.ffn_norm, c.norm_eps);
  if (captures_) cap.ffn_x = y;
  y = fwd::moe_forward(L, y, cap);
  if (captures_) cap.ffn_out = y;
  cap.out = fwd::hc_post(a, y, x, fm.post, applied(fm.comb), N, hc, D);

  cap.attn_pre = std::move(am.pre);
  cap.attn_post = std::move(am.post);
  cap.attn_comb = std::move(am.comb);
  cap.ffn_pre = std::move(fm.pre);
  cap.ffn_post = std::move(fm.post);
  cap.ffn_comb = std::move(fm.comb);
  return cap;
}

V41LayerCapture V41Model::run_layer(int64_t layer, std::span<const double> streams, std::span<const double> pre_mix,
                                    int64_t N, std::span<const int64_t> hash_ids, V41SharedAttention& shared,
                                    V41LayerCache* cache) const {
  return run_rows(layer, streams, pre_mix, N, hash_ids, shared, cache, 0, 0);
}

V41LayerCapture V41Model::run_rows(int64_t layer, std::span<const double> streams, std::span<const double> pre_mix,
                                   int64_t N, std::span<const int64_t> hash_ids, V41SharedAttention& shared,
                                   V41LayerCache* cache, int64_t first, int64_t floor,
                                   const V41LayerCache* sources) const {
  const LayerPlan& lp = plan_[layer];
  const fwd::Arith a(regime_);
  const fwd::RopeTable rope = fwd::layer_rope(a, config_, lp, first + N, fault_);
  fwd::LayerCtx L{config_, lp, *layers_[static_cast<size_t>(layer)], a, rope, N, fault_, options_, captures_};
  L.cache = cache;
  L.first = first;
  L.window_floor = floor;
  L.sources = sources;
  L.floor_probe = floor_probe_;
  V41LayerCapture cap = block(L, streams, pre_mix, hash_ids, [&](std::span<const double> y, V41LayerCapture& c) {
    return fwd::attention_forward(L, y, shared, c);
  });
  cap.first_row = first;
  return cap;
}

V41LayerCapture V41Model::decode_layer(int64_t layer, std::span<const double> streams,
                                       std::span<const double> pre_mix, std::span<const int64_t> hash_ids,
                                       V41DecodeState& state) const {
  if (static_cast<int64_t>(state.layers.size()) != config_.n_layers)
    throw InputError("v41 decode: the state was not seeded by a prefill of this model");
  const fwd::Arith a(regime_);
  const fwd::RopeTable none;  // the attention step makes its own
  const fwd::LayerCtx L{config_, plan_[layer], *layers_[static_cast<size_t>(layer)], a, none, 1, fault_, options_, captures_};
  return block(L, streams, pre_mix, hash_ids, [&](std::span<const double> y, V41LayerCapture& cap) {
    return attention_step(layer, y, state, cap);
  });
}

std::vector<double> V41Model::attention(int64_t layer, std::span<const double> x, int64_t N,
                                        V41SharedAttention& shared, V41LayerCapture& cap) const {
  const fwd::Arith a(regime_);
  const LayerPlan& lp = plan_[layer];
  const fwd::RopeTable rope = fwd::layer_rope(a, config_, lp, N, fault_);
  const fwd::LayerCtx L{config_, lp, *layers_[static_cast<size_t>(layer)], a, rope, N, fault_, options_, captures_};
  return fwd::attention_forward(L, x, shared, cap);
}

std::vector<double> V41Model::attention_core(int64_t layer, std::span<const double> q, std::span<const double> kv,
                                             std::span<const int32_t> idx, int64_t N) const {
  const fwd::Arith a(regime_);
  const int64_t H = config_.n_heads, hd = config_.head_dim;
  if (N < 0 || q.size() != static_cast<size_t>(N * H * hd) || kv.size() % static_cast<size_t>(hd) != 0 ||
      (N > 0 && idx.size() % static_cast<size_t>(N) != 0))
    throw InputError(fmt::format("v41 attention_core: q {} values for N {}, kv {} (rows of {}), idx {}", q.size(), N,
                                 kv.size(), hd, idx.size()));
  const int64_t k = N > 0 ? static_cast<int64_t>(idx.size()) / N : 0, rows = static_cast<int64_t>(kv.size()) / hd;
  for (int32_t i : idx)
    if (i < -1 || i >= rows) throw InputError(fmt::format("v41 attention_core: index {} outside [-1, {})", i, rows));
  std::vector<double> o(q.size());
  fwd::sparse_attn(a, q, N, H, hd, kv, layers_.at(static_cast<size_t>(layer))->attn_sink, idx, k,
                   std::pow(static_cast<double>(hd), -0.5), o);
  return o;
}

std::vector<double> V41Model::attention_output(int64_t layer, std::span<const double> o, int64_t N, int64_t first) const {
  const fwd::Arith a(regime_);
  const int64_t H = config_.n_heads, hd = config_.head_dim;
  if (N < 0 || o.size() != static_cast<size_t>(N * H * hd))
    throw InputError(fmt::format("v41 attention_output: {} values for N {} of [{}, {}]", o.size(), N, H, hd));
  const LayerPlan& lp = plan_[layer];
  if (first < 0) throw InputError(fmt::format("v41 attention_output: first position {}", first));
  const fwd::RopeTable rope = fwd::layer_rope(a, config_, lp, first + N, fault_);
  const fwd::LayerCtx L{config_, lp, *layers_[static_cast<size_t>(layer)], a, rope, N, fault_, options_, captures_};
  std::vector<double> x(o.begin(), o.end());
  fwd::rope_rows(L, x, N, H, hd, [first](int64_t t) { return first + t; }, true);
  return fwd::grouped_output(L, x, N);
}

std::span<const double> V41Model::gate_weight(int64_t layer) const {
  return layers_.at(static_cast<size_t>(layer))->gate.w;
}
std::span<const double> V41Model::gate_bias(int64_t layer) const {
  return layers_.at(static_cast<size_t>(layer))->gate_bias;
}

std::vector<double> V41Model::moe(int64_t layer, std::span<const double> x, int64_t N, V41LayerCapture& cap) const {
  const fwd::Arith a(regime_);
  const fwd::RopeTable none;
  const fwd::LayerCtx L{config_, plan_[layer], *layers_[static_cast<size_t>(layer)], a, none, N, fault_, options_, captures_};
  return fwd::moe_forward(L, x, cap);
}

void V41Model::head(std::span<const double> streams, std::span<const double> pre_mix, int64_t N,
                    V41ForwardResult& out) const {
  const fwd::Arith a(regime_);
  head_collapsed(fwd::hc_pre(a, streams, pre_mix, N, config_.hc_mult, config_.dim), N, out);
}

void V41Model::head_collapsed(std::span<const double> collapsed, int64_t N, V41ForwardResult& out) const {
  const fwd::Arith a(regime_);
  const int64_t D = config_.dim, V = config_.vocab_size;
  out.final_collapsed.assign(collapsed.begin(), collapsed.end());
  out.final_normed = out.final_collapsed;
  fwd::rmsnorm(a, out.final_normed, D, norm_, config_.norm_eps);
  out.logits.resize(static_cast<size_t>(N * V));
  fwd::linear(a, out.final_normed, N, D, head_, V, out.logits, false);  // fp32 head, fp32 logits
}

std::vector<int64_t> V41Model::engram_layer_hash_ids(std::span<const int64_t> ids, int64_t N, int64_t index) const {
  const int64_t nl = static_cast<int64_t>(config_.engram_layer_ids.size());
  const int64_t cols = (config_.engram_max_ngram_size - 1) * config_.engram_n_heads;
  std::vector<int64_t> out(static_cast<size_t>(N * cols));
  for (int64_t t = 0; t < N; ++t)
    std::copy_n(ids.begin() + (t * nl + index) * cols, cols, out.begin() + t * cols);
  return out;
}

V41ForwardResult V41Model::forward(std::span<const int64_t> tokens, const V41EngramHashing& hashing,
                                   V41DecodeState* state) const {
  return run_stack(tokens, hashing, 0, nullptr, state);
}

void V41Model::keep_last_row(V41LayerCapture& cap, const std::vector<double>& streams) const {
  const auto row = static_cast<std::ptrdiff_t>(config_.hc_mult * config_.dim);
  cap.out.assign(streams.end() - row, streams.end());
}

V41ForwardResult V41Model::run_stack(std::span<const int64_t> tokens, const V41EngramHashing& hashing, int64_t S,
                                     const V41ReplayConvention* conv, V41DecodeState* state) const {
  // The first layer cut to the tail: none in a prefill (the encoding is every layer).
  const int64_t cut = S == 0 ? plan_.L : conv->all_layers ? 0 : plan_.E;
  return replay_tail(encode_below(tokens, hashing, cut, S > 0 && conv->all_layers, state != nullptr, nullptr, 0), S, conv,
                     state);
}

V41CedEncoding V41Model::ced_encoding(std::span<const int64_t> tokens, const V41EngramHashing& hashing,
                                      const V41ReplayConvention& convention, bool decode) const {
  return encode_below(tokens, hashing, convention.all_layers ? 0 : plan_.E, convention.all_layers, decode, nullptr, 0);
}

V41CedEncoding V41Model::encode_below(std::span<const int64_t> tokens, const V41EngramHashing& hashing, int64_t cut,
                                      bool prefill_side, bool caches, const V41PrefixHit* hit, int64_t first) const {
  V41CedEncoding enc;
  enc.N = static_cast<int64_t>(tokens.size());
  if (enc.N == 0) throw InputError("v41 forward: an empty prompt");
  enc.cut = cut;
  enc.first = first;
  enc.all_layers = prefill_side;
  enc.hit = hit;
  enc.tokens.assign(tokens.begin(), tokens.end());
  enc.hashes = engram_hash_ids(tokens, hashing);
  enc.h = embed(tokens.subspan(static_cast<size_t>(first)));
  enc.pre = initial_pre_mix(enc.N - first);
  // The all-layers tail: the prefill side's pass writes every kv source's compressed KV and index keys
  // up to E over every row (layer E's by the source-only write); the replay's kv sources read them.
  if (prefill_side) enc.sources = prefill_side_sources(tokens, hashing);
  if (caches) enc.caches.resize(plan_.layers.size());
  for (int64_t l = 0; l < cut; ++l) {
    const LayerPlan& lp = plan_[l];
    // A resumed prompt's rows from `first`, their windows floored there; its kv sources read the cached groups.
    V41LayerCapture cap = run_rows(l, enc.h, enc.pre, enc.N - first, layer_hash_ids(enc, lp, first), enc.shared,
                                   caches ? &enc.caches[static_cast<size_t>(l)] : nullptr, first, first,
                                   hit_sources(enc, lp));
    enc.h = captures_ ? cap.out : std::move(cap.out);
    if (!captures_) keep_last_row(cap, enc.h);
    enc.pre = cap.ffn_pre;
    enc.layers.push_back(std::move(cap));
  }
  return enc;
}

std::vector<int64_t> V41Model::layer_hash_ids(const V41CedEncoding& enc, const LayerPlan& lp, int64_t S) const {
  if (!lp.engram) return {};
  const auto& ids = config_.engram_layer_ids;
  const int64_t index = std::find(ids.begin(), ids.end(), lp.layer) - ids.begin();
  std::vector<int64_t> out = engram_layer_hash_ids(enc.hashes, enc.N, index);
  // A tail layer's rows: the n-grams ending at positions S ..
  out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(out.size() / static_cast<size_t>(enc.N)) * S);
  return out;
}

V41ForwardResult V41Model::forward_ced(const V41CedEncoding& enc, int64_t replay, const V41ReplayConvention& convention,
                                       V41DecodeState* state) const {
  if (replay < 1) throw InputError(fmt::format("v41 ced: the replay must keep at least one row (got {})", replay));
  if (enc.cut != (convention.all_layers ? 0 : plan_.E) || enc.all_layers != convention.all_layers)
    throw InputError(fmt::format("v41 ced: the encoding was made for another cut than convention {}'s", convention.name));
  if (state && enc.caches.empty()) throw InputError("v41 ced: decode steps need an encoding made with its caches");
  return replay_tail(enc, std::max<int64_t>(0, enc.N - replay), &convention, state);
}

const V41LayerCache* V41Model::hit_sources(const V41CedEncoding& enc, const LayerPlan& lp) const {
  return enc.hit && lp.owns_compressor ? &enc.hit->layers[static_cast<size_t>(lp.layer)] : nullptr;
}

V41ForwardResult V41Model::replay_tail(V41CedEncoding enc, int64_t S, const V41ReplayConvention* conv,
                                       V41DecodeState* state) const {
  const int64_t N = enc.N, R = N - S, cut = enc.cut, F = enc.first;
  if (S < F)
    throw InputError(fmt::format("v41 ced: a replay of {} rows reaches before the resumed prompt's first recomputed "
                                 "row {} (N = {})", R, F, N));
  const bool floor_cut = S > F && (conv->floor_first_layer != (fault_ == V41Fault::ced_cut_floor_flipped));
  // The planted ced-replayed-row-ulp (a negative control of the bitwise clauses): on a tail (rows dropped),
  // the last row's first value leaves each tail layer and the head one ulp of double up; the spans and
  // floors are untouched, so only a check that compares the tail's bits can see it.
  const bool ulp_off = fault_ == V41Fault::ced_replayed_row_ulp && S > F;
  auto nudge_last_row = [](std::vector<double>& v, int64_t row) {
    double& x = v[v.size() - static_cast<size_t>(row)];
    x = std::nextafter(x, std::numeric_limits<double>::infinity());
  };
  V41ForwardResult out;
  out.N = N;
  out.first_row = S;
  out.layers = std::move(enc.layers);
  std::vector<double> h = std::move(enc.h), pre = std::move(enc.pre);
  V41SharedAttention shared = std::move(enc.shared);
  if (state) {
    *state = V41DecodeState{};
    state->pos = N;
    state->tokens = enc.tokens;
    state->layers = std::move(enc.caches);
    state->layers.resize(plan_.layers.size());
  }
  const int64_t hc = config_.hc_mult, D = config_.dim;
  for (int64_t l = cut; l < plan_.L; ++l) {
    const LayerPlan& lp = plan_[l];
    V41LayerCache* cache = state ? &state->layers[static_cast<size_t>(l)] : nullptr;
    V41LayerCapture cap;
    if (l == cut) {
      // Every row, for the sources (and, unfloored, the window keys); the rows before the tail are dropped
      // after it, and what it published is cut to the tail: its selection re-offset by the tail's rows.
      // (A resumed prompt's rows from F.)
      cap = run_rows(l, h, pre, N - F, layer_hash_ids(enc, lp, F), shared, cache, F, floor_cut ? S : F,
                     hit_sources(enc, lp));
      if (ulp_off) nudge_last_row(cap.out, hc * D);
      const int64_t drop = S - F;
      h.assign(cap.out.begin() + drop * hc * D, cap.out.end());
      pre.assign(cap.ffn_pre.begin() + drop * hc, cap.ffn_pre.end());
      const int64_t k = shared.topk,
                    T = shared.candidates.empty() ? 0 : static_cast<int64_t>(shared.candidates.size()) / (N - F);
      std::vector<int32_t> sel(shared.topk_idxs.begin() + drop * k, shared.topk_idxs.end());
      for (int32_t& i : sel)
        if (i >= 0) i -= static_cast<int32_t>(drop);
      shared.topk_idxs = std::move(sel);
      if (T > 0) shared.candidates.erase(shared.candidates.begin(), shared.candidates.begin() + drop * T);
    } else {
      // Above the cut the tail's rows, floored at its first; a kv source there reads the prefill side's.
      const V41LayerCache* src = lp.owns_compressor && !enc.sources.empty() ? &enc.sources[static_cast<size_t>(l)] : nullptr;
      cap = run_rows(l, h, pre, R, layer_hash_ids(enc, lp, S), shared, cache, S, S, src);
      if (ulp_off) nudge_last_row(cap.out, hc * D);
      h = captures_ ? cap.out : std::move(cap.out);
      if (!captures_) keep_last_row(cap, h);
      pre = cap.ffn_pre;
    }
    out.layers.push_back(std::move(cap));
  }
  if (state) seed_decode_pointers(*state);
  head(h, pre, R, out);
  if (ulp_off) nudge_last_row(out.logits, config_.vocab_size);
  return out;
}

std::vector<V41LayerCache> V41Model::prefill_side_sources(std::span<const int64_t> tokens,
                                                          const V41EngramHashing& hashing) const {
  // The prefill's layers below E on every row, their caches kept, then layer E's source-only write.
  V41CedEncoding side = encode_below(tokens, hashing, plan_.E, false, true, nullptr, 0);
  std::vector<V41LayerCache> sources = std::move(side.caches);
  sources[static_cast<size_t>(plan_.E)] = source_write(plan_.E, side.h, side.pre, side.N);
  return sources;
}

V41LayerCache V41Model::source_write(int64_t layer, std::span<const double> streams, std::span<const double> pre_mix,
                                     int64_t N) const {
  const LayerPlan& lp = plan_[layer];
  if (!lp.owns_compressor)
    throw InputError(fmt::format("v41 source write: layer {} is not a kv source", layer));
  if (lp.engram)  // its streams would need the Engram first; no engine cuts at an Engram layer
    throw InputError(fmt::format("v41 source write: layer {} has Engram", layer));
  const int64_t hc = config_.hc_mult, D = config_.dim;
  if (static_cast<int64_t>(streams.size()) != N * hc * D || static_cast<int64_t>(pre_mix.size()) != N * hc)
    throw InputError(fmt::format("v41 source write: streams must be [N, {}, {}] and pre_mix [N, {}] for N = {}", hc, D,
                                 hc, N));
  const fwd::Arith a(regime_);
  const fwd::RopeTable rope = fwd::layer_rope(a, config_, lp, N, fault_);
  V41LayerCache out;
  fwd::LayerCtx L{config_, lp, *layers_[static_cast<size_t>(layer)], a, rope, N, fault_, options_, captures_};
  L.cache = &out;
  // The collapse with the previous sublayer's pre (the staggered mHC), attn_norm: the attention's input.
  std::vector<double> x = fwd::hc_pre(a, streams, pre_mix, N, hc, D);
  fwd::rmsnorm(a, x, D, layers_[static_cast<size_t>(layer)]->attn_norm, config_.norm_eps);
  fwd::write_sources(L, x);
  return out;
}

V41ForwardResult V41Model::forward_ced(std::span<const int64_t> tokens, const V41EngramHashing& hashing,
                                       int64_t replay, const V41ReplayConvention& convention,
                                       V41DecodeState* state) const {
  if (replay < 1) throw InputError(fmt::format("v41 ced: the replay must keep at least one row (got {})", replay));
  const int64_t N = static_cast<int64_t>(tokens.size());
  return run_stack(tokens, hashing, std::max<int64_t>(0, N - replay), &convention, state);
}

void V41Model::seed_decode_pointers(V41DecodeState& state) const {
  const int64_t N = state.pos;
  // model.py's shared_attn after the prompt: every kv source republished its compressed KV; an index-key
  // owner published its keys when its indexer ran (a group complete: N >= ratio).
  for (const LayerPlan& lp : plan_.layers) {
    if (lp.owns_compressor) state.compress_kv_from = lp.layer;
    if (lp.owns_index_k && N / lp.ratio > 0) state.index_k_from = lp.layer;
  }
}

std::vector<int64_t> V41Model::engram_step_hash_ids(const V41DecodeState& state, const V41EngramHashing& hashing) const {
  // The newest token's n-grams reach max_ngram_size - 1 tokens back: hash that tail, keep its last row.
  const int64_t n = static_cast<int64_t>(state.tokens.size());
  const int64_t from = std::max<int64_t>(0, n - config_.engram_max_ngram_size);
  const std::span<const int64_t> tail(state.tokens.data() + from, static_cast<size_t>(n - from));
  const std::vector<int64_t> ids = engram_hash_ids(tail, hashing);
  if (ids.empty()) return {};
  const size_t row = ids.size() / tail.size();
  return {ids.end() - static_cast<std::ptrdiff_t>(row), ids.end()};
}

std::vector<double> V41Model::attention_step(int64_t layer, std::span<const double> x, V41DecodeState& state,
                                             V41LayerCapture& cap) const {
  const LayerPlan& lp = plan_[layer];
  const fwd::Arith a(regime_);
  const fwd::RopeTable rope = fwd::layer_rope(a, config_, lp, state.pos + 1, fault_);  // positions 0 .. pos
  const fwd::LayerCtx L{config_, lp, *layers_[static_cast<size_t>(layer)], a, rope, 1, fault_, options_, captures_};
  return fwd::attention_decode(L, x, state, cap);
}

V41ForwardResult V41Model::decode_step(int64_t token, const V41EngramHashing& hashing, V41DecodeState& state) const {
  if (static_cast<int64_t>(state.layers.size()) != config_.n_layers)
    throw InputError("v41 decode: the state was not seeded by a prefill of this model");
  const std::vector<double> h0 = embed(std::span<const int64_t>(&token, 1));  // checks the id
  state.tokens.push_back(token);
  const std::vector<int64_t> hashes = engram_step_hash_ids(state, hashing);
  V41ForwardResult out;
  out.N = 1;
  std::vector<double> h = h0, pre = initial_pre_mix(1);
  int64_t engram_index = 0;
  for (const LayerPlan& lp : plan_.layers) {
    std::vector<int64_t> ids;
    if (lp.engram) ids = engram_layer_hash_ids(hashes, 1, engram_index++);
    V41LayerCapture cap = decode_layer(lp.layer, h, pre, ids, state);
    h = captures_ ? cap.out : std::move(cap.out);
    pre = cap.ffn_pre;
    out.layers.push_back(std::move(cap));
  }
  ++state.pos;
  head(h, pre, 1, out);
  return out;
}

// ---- resume after a prefix-cache hit (docs/v41.md §13.8)

namespace {
// Each layer's cached groups of the first H tokens: floor(H / ratio) of them.
std::vector<V41LayerCache> cached_groups(const V41Plan& p, const V41Config& c, const std::vector<V41LayerCache>& from,
                                         int64_t H) {
  std::vector<V41LayerCache> out(p.layers.size());
  for (const LayerPlan& lp : p.layers) {
    if (!lp.owns_compressor) continue;
    const V41LayerCache& f = from[static_cast<size_t>(lp.layer)];
    V41LayerCache& o = out[static_cast<size_t>(lp.layer)];
    const int64_t G = H / lp.ratio;
    if (static_cast<int64_t>(f.compress_kv.size()) < G * c.head_dim ||
        (lp.owns_index_k && static_cast<int64_t>(f.index_k.size()) < G * c.index_head_dim))
      throw InputError(fmt::format("v41 prefix hit: layer {} holds fewer than the {} groups of {} tokens", lp.layer, G, H));
    o.compress_kv.assign(f.compress_kv.begin(), f.compress_kv.begin() + G * c.head_dim);
    if (lp.owns_index_k) o.index_k.assign(f.index_k.begin(), f.index_k.begin() + G * c.index_head_dim);
  }
  return out;
}

}  // namespace

V41PrefixHit V41Model::prefix_hit(const V41DecodeState& state, int64_t H) const {
  if (H < 0 || H > state.pos)
    throw InputError(fmt::format("v41 prefix hit: {} tokens of a state of {}", H, state.pos));
  if (state.layers.size() != plan_.layers.size()) throw InputError("v41 prefix hit: the state was not seeded by a prefill");
  V41PrefixHit hit;
  hit.tokens = H;
  hit.layers = cached_groups(plan_, config_, state.layers, H);
  return hit;
}

V41ForwardResult V41Model::forward_resume(std::span<const int64_t> tokens, const V41EngramHashing& hashing,
                                          const V41PrefixHit& hit, const V41EncoderReplayRule& rule, int64_t rebuilt,
                                          int64_t replay, const V41ReplayConvention* convention,
                                          V41DecodeState* state) const {
  const int64_t N = static_cast<int64_t>(tokens.size());
  if (hit.tokens > N)
    throw InputError(fmt::format("v41 resume: a hit of {} tokens on a prompt of {}", hit.tokens, N));
  if (hit.layers.size() != plan_.layers.size()) throw InputError("v41 resume: the prefix hit is of another model");
  if (convention && convention->all_layers)
    throw InputError(fmt::format("v41 resume: convention {} (the all-layers tail) resumes on its prefill side, "
                                 "which is not modelled", convention->name));
  if (replay < 1) throw InputError(fmt::format("v41 ced: the replay must keep at least one row (got {})", replay));
  // The planted fault counts the rebuilt rows from the wrong end: H - W + 1.
  const bool off_by_one = fault_ == V41Fault::resume_start_off_by_one && rebuilt > 0;
  const V41Resume r = v41_resume(plan_, rule, hit.tokens, off_by_one ? rebuilt - 1 : rebuilt);
  // The planted prefix-cache contamination (MLX ports): a cache keyed by the hit's length alone serves the first
  // request's groups to every later request of that length.
  const V41PrefixHit* served = &hit;
  if (fault_ == V41Fault::prefix_cache_keyed_by_length) {
    const std::lock_guard<std::mutex> lock(stale_hits_->mutex);
    served = &stale_hits_->by_length.try_emplace(hit.tokens, hit).first->second;
  }
  V41PrefixHit used;
  used.tokens = r.hit;
  used.layers = cached_groups(plan_, config_, served->layers, r.hit);
  const int64_t cut = convention ? plan_.E : plan_.L;
  V41CedEncoding enc = encode_below(tokens, hashing, cut, false, state != nullptr, &used, r.start);
  return replay_tail(std::move(enc), convention ? std::max(r.start, N - replay) : r.start, convention, state);
}

}  // namespace ced::v41
