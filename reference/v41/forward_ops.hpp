#pragma once
// The v41 forward's building blocks (docs/v41.md §8), shared by its files and tested one by one
// (unit-tests/v41_forward_test.cpp). Every value is held in a double; the regime decides where it is
// rounded. Under bf16 an op's result is rounded to fp32 after every +, -, *, /, sqrt (exact emulation
// of fp32 arithmetic: a double holds the exact result of any of these on fp32 operands closely enough
// that rounding it to fp32 gives the fp32 result), and a tensor model.py holds in bf16 is rounded to
// bf16 where model.py writes it. Under f64 neither rounding happens.
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "reference/v41/forward.hpp"
#include "reference/v41/forward_weights.hpp"
#include "models/v41/numerics.hpp"

namespace ced::v41::fwd {

struct Arith {
  bool emulate = false;  // bf16 and release regimes: fp32 ops, bf16 tensors
  bool release = false;  // release regime: FP8/FP4 linears quantize their input, block-scaled products

  explicit Arith(V41Regime r) : emulate(r != V41Regime::f64), release(r == V41Regime::release) {}
  double r(double x) const { return emulate ? static_cast<double>(static_cast<float>(x)) : x; }  // an fp32 op
  double bf(double x) const { return emulate ? static_cast<double>(round_bf16(static_cast<float>(x))) : x; }
  double add(double a, double b) const { return r(a + b); }
  double sub(double a, double b) const { return r(a - b); }
  double mul(double a, double b) const { return r(a * b); }
  double div(double a, double b) const { return r(a / b); }
  double sqrt(double x) const { return emulate ? std::sqrt(static_cast<float>(x)) : std::sqrt(x); }
  double exp(double x) const { return emulate ? std::exp(static_cast<float>(x)) : std::exp(x); }
  double log1p(double x) const { return emulate ? std::log1p(static_cast<float>(x)) : std::log1p(x); }
  double cos(double x) const { return emulate ? std::cos(static_cast<float>(x)) : std::cos(x); }
  double sin(double x) const { return emulate ? std::sin(static_cast<float>(x)) : std::sin(x); }
  // torch's rsqrt on CPU: 1 / sqrt(x), two roundings.
  double rsqrt(double x) const { return div(1.0, sqrt(x)); }
  // torch's sigmoid and silu: 1 / (1 + exp(-x)) and x / (1 + exp(-x)).
  double sigmoid(double x) const { return div(1.0, add(1.0, exp(-x))); }
  double silu(double x) const { return div(x, add(1.0, exp(-x))); }
  // torch's softplus (beta 1, threshold 20): x above 20, log1p(exp(x)) otherwise.
  double softplus(double x) const { return x > 20.0 ? x : log1p(exp(x)); }
  // A python float constant as torch applies it to an fp32 tensor: rounded to fp32 first.
  double c(double x) const { return r(x); }
};

// ---- linear algebra (fixed orders: every reduction runs in index order, one thread per output row)

// Parallel regions (linear, sparse_attn, the index scores) open only past this much work; each
// output row belongs to one thread, so no result depends on the thread count.
inline constexpr int64_t kParallelWork = 1 << 16;

// Y[M, Nout] = X[M, K] · W[Nout, K]ᵀ, each dot product summed in K order with fp32 (bf16) or double
// (f64) partials; out_bf16: the result is a bf16 tensor (rounded once at the end). Under bf16 every
// value of X and W is an fp32 value (as every tensor of the forward is), so the sums run in fp32
// arithmetic itself: the same bits as the double-then-round of Arith.
void linear(const Arith& a, std::span<const double> X, int64_t M, int64_t K, std::span<const double> W,
            int64_t Nout, std::span<double> Y, bool out_bf16);

// Y = X · Wᵀ for a stored linear: in the release regime, when W is FP8 or FP4 in the file, X is
// act_quant'ed per 32 (codes and scales, §3.1) and each output is Σ over 32-blocks of K, in K order,
// of (Σ_block a_code·w_code, an fp32 sum in K order) · a_scale · w_scale, accumulated in fp32; else
// `linear`. out_bf16 as there.
void linear_w(const Arith& a, std::span<const double> X, int64_t M, const V41Linear& w, std::span<double> Y,
              bool out_bf16);

// Fills w.packed for the regime's kernels (linear_w on a linear not packed for it packs a copy for
// the call); and every linear of a layer that runs through linear_w (not wo_a and gate, which run
// through `linear` on their values).
void pack_linear(const Arith& a, V41Linear& w);
void pack_layer_linears(const Arith& a, V41LayerWeights& w);

// RMSNorm over rows of n: x * rsqrt(mean(x²) + eps) * w, one bf16 rounding (model.py's RMSNorm with
// a bf16 input). The mean is the sequential sum of squares divided by n.
void rmsnorm(const Arith& a, std::span<double> x, int64_t n, std::span<const double> w, double eps);
// ss[r] = Σ_i x[r, i]² over the rows of n (as many as ss holds), each sum in i order with one
// rounding per op: RMSNorm's and hc_mixes' sums of squares.
void row_sum_squares(const Arith& a, std::span<const double> x, int64_t n, std::span<double> ss);

// ---- rotary embedding (docs/v41.md §8.4)

// The rotary table of a layer: cos and sin [N, rope_head_dim / 2], precompute_freqs_cis in fp32
// (bf16 regime) or double: f_i = 1 / theta^(2i / d); with original_seq_len > 0 the YaRN ramp;
// angle = pos · f_i.
struct RopeTable {
  int64_t half = 0;
  std::vector<double> cos, sin;  // [N, half]
};
RopeTable rope_table(const Arith& a, int64_t rope_head_dim, int64_t N, int64_t original_seq_len, double theta,
                     double factor, int64_t beta_fast, int64_t beta_slow);
// A layer's table, positions 0 .. N - 1: YaRN and compress_rope_theta on compressed layers (docs/v41.md
// §8.4); the planted one_rope_theta gives every layer rope_theta without YaRN.
RopeTable layer_rope(const Arith& a, const V41Config& c, const LayerPlan& lp, int64_t N, V41Fault fault = V41Fault::none);
// Rotate the last 2·half values of a vector in place as adjacent complex pairs by position pos's
// entry (inverse: by its conjugate), rounding to bf16 (the tensor is bf16).
void apply_rope(const Arith& a, double* x, int64_t d, const RopeTable& t, int64_t pos, bool inverse);

// ---- quantization points (docs/v41.md §3, §8.1): bf16 regime = the fp32 functions; f64 = in double

void qdq_fp8_32(const Arith& a, std::span<double> x, int64_t K);       // window KV
void qdq_fp4_32(const Arith& a, std::span<double> x, int64_t K);       // index queries and keys
void qdq_fp4_e4m3_16(const Arith& a, std::span<double> x, int64_t K);  // compressed latent

// ---- torch's CPU top-k (docs/v41.md §8.6)

// The indices torch.topk(values, k, largest=True, sorted) returns on a CPU: the (value, index) pairs
// in index order, then partial_sort when 64·k <= n, else nth_element at k - 1 (then, when sorted, a
// sort of the first k - 1), with NaN above everything. Ties go where that algorithm puts them.
std::vector<int64_t> torch_topk(std::span<const double> values, int64_t k, bool sorted, bool as_fp32);

// ---- mHC (docs/v41.md §8.3)

struct HcMix {
  std::vector<double> pre, post, comb;  // [N, hc], [N, hc], [N, hc, hc]
};
// mixes = (X · fnᵀ) · rsqrt(mean(X²) + norm_eps) over the flattened [hc·dim] row, then the split:
// pre = σ(m·s0 + b) + eps, post = 2σ(m·s1 + b), comb = Sinkhorn(row-softmax(m·s2 + b) + eps).
HcMix hc_mixes(const Arith& a, std::span<const double> X, int64_t N, int64_t hc, int64_t dim,
               std::span<const double> fn, std::span<const double> scale, std::span<const double> base,
               double norm_eps, int64_t iters, double hc_eps);
// The split alone, for one row of (2 + hc)·hc mixes.
void hc_split_sinkhorn(const Arith& a, const double* mixes, int64_t hc, std::span<const double> scale,
                       std::span<const double> base, int64_t iters, double eps, double* pre, double* post,
                       double* comb);
// y[N, dim] = bf16(Σ_i pre_i · X_i) in stream order.
std::vector<double> hc_pre(const Arith& a, std::span<const double> X, std::span<const double> pre, int64_t N,
                           int64_t hc, int64_t dim);
// out_j = bf16(post_j · y + Σ_i comb[i, j] · R_i), the sum in stream order.
std::vector<double> hc_post(const Arith& a, std::span<const double> y, std::span<const double> R,
                            std::span<const double> post, std::span<const double> comb, int64_t N, int64_t hc,
                            int64_t dim);

// ---- attention pieces (docs/v41.md §8.5, §8.6)

// The window indices of a prefill from 0: [N, min(N, W)], query i sees max(0, i - W + 1) .. i, -1 after.
std::vector<int32_t> window_topk_idxs(int64_t N, int64_t W);
// The probe's window lists [N, W] for rows at positions first .. first + N - 1: the positions a full run's
// window holds, those below max(first, floor) as kProbeKey (the NaN key), those before 0 as -1.
constexpr int32_t kProbeKey = -2;
std::vector<int32_t> probe_window_idxs(int64_t N, int64_t W, int64_t first, int64_t floor);
// sparse_attn: q [N, H, d], kv [rows, d], sink [H], idxs [N, k] (-1 = none): online softmax over the
// index list in blocks of 64, running max from -1e30, probabilities to bf16 before P·V (bf16 regime),
// the sink in the denominator only. out [N, H, d] bf16.
void sparse_attn(const Arith& a, std::span<const double> q, int64_t N, int64_t H, int64_t d,
                 std::span<const double> kv, std::span<const double> sink, std::span<const int32_t> idxs,
                 int64_t k, double softmax_scale, std::span<double> out);
// Ratio-r pooling of the compressor (r > 1): per group of r tokens and channel, softmax of the scores
// over the r tokens and the weighted sum, in fp32; the trailing N % r tokens wait. kv, score: [N, d]
// fp32 values. Returns [N / r, d], rounded to bf16 (kv.to(dtype)).
std::vector<double> compress_pool(const Arith& a, std::span<const double> kv, std::span<const double> score,
                                  int64_t N, int64_t d, int64_t ratio);
// select_candidate_blocks for one query row: score [T] (-inf where unreachable), visible = the
// query's compress length; block max over block_size (padded with -inf), the block holding visible-1
// pinned at +inf, the top min(topk_blocks, n_blocks) blocks kept when > -inf. mask [T].
// ties: the rule of equal block scores (V41TopkTies), the index scores' own.
void candidate_blocks(std::span<const double> score, int64_t visible, int64_t topk_blocks, int64_t block_size,
                      bool as_fp32, std::span<uint8_t> mask, V41TopkTies ties = V41TopkTies::torch);

// ---- MoE (docs/v41.md §9.1)

// The gate of one token: scores = sqrt(softplus(logits / gate_temp)), top-k of scores + bias, weights
// = the unbiased scores of the chosen, / (their sum + 1e-20) when norm_topk_prob, × route_scale.
// experts: the chosen ids in torch's top-k order (`ties`: lowest_index breaks an exact tie lower expert first,
// the planted router_ties_lowest_index); weights alongside.
void gate_weights(const Arith& a, std::span<const double> logits, std::span<const double> bias, int64_t topk,
                  double gate_temp, bool norm_topk_prob, double route_scale, const std::string& score_func,
                  std::span<int64_t> experts, std::span<double> weights, V41TopkTies ties = V41TopkTies::torch);
// The clamped SwiGLU of one row: h = silu(min(g, limit)) · clamp(u, ±limit) (limit > 0), × weight
// when weight is given; fp32. g, u: [n] in, h: [n] out (not yet rounded).
void swiglu(const Arith& a, std::span<const double> g, std::span<const double> u, double limit, const double* weight,
            std::span<double> h);

// ---- the sublayers over a layer's weights (attention.cpp, moe.cpp, engram.cpp)

struct LayerCtx {
  const V41Config& c;
  const LayerPlan& lp;
  const V41LayerWeights& w;
  const Arith& a;
  const RopeTable& rope;  // the layer's table, positions 0 .. N - 1
  int64_t N;
  V41Fault fault = V41Fault::none;  // a planted negative control (forward.hpp)
  V41Options options = {};          // the switches of what the release leaves open (forward.hpp)
  bool capture = true;              // copy the large captures (V41Model::set_captures)
  V41LayerCache* cache = nullptr;   // a prefill seeding the decode buffers (forward.hpp)
  // CED replay (docs/v41.md §13): the rows are positions first .. first + N - 1 (a decoder layer on the
  // replayed tail; the compressed KV and index keys in `shared` cover every group of the prompt), and
  // window keys of positions below window_floor are not attended. 0 and 0: a prefill from position 0.
  int64_t first = 0, window_floor = 0;
  // A kv source replayed on a tail (the all-layers tail): the compressed KV and index keys of every group,
  // written by the prefill side over every row; the compressor and the index-key projection are skipped.
  const V41LayerCache* sources = nullptr;
  // The dependency probe (V41Model::set_floor_probe): each window key a floor leaves out is read as NaN.
  bool floor_probe = false;
};

// Y = X · Wᵀ of a stored linear (linear_w) into a new [M, w.out].
std::vector<double> linear_out(const LayerCtx& L, std::span<const double> x, int64_t M, const V41Linear& w,
                               bool out_bf16);
// Rotates each of `heads` vectors of width d per row of x at the position pos_of(row).
template <typename Pos>
void rope_rows(const LayerCtx& L, std::vector<double>& x, int64_t rows, int64_t heads, int64_t d, Pos pos_of,
               bool inverse) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) apply_rope(L.a, x.data() + (r * heads + h) * d, d, L.rope, pos_of(r), inverse);
}
// The index scores of one query against n keys: out[j] = Σ_h bf16(relu(bf16(dot_hj)) · w_h), the head sum
// in fp32, then bf16 (none of the three bf16 roundings with --index-scores fp32). dots: the query's per-head
// dot products [n_heads, n] (dot_hj at dots[h · n + j]); w: its n_heads weights.
void index_scores(const LayerCtx& L, const double* dots, int64_t n, const double* w, double* out);
// The published selection of one query row from its masked scores [T]: the top min(index_topk, T)
// (select_topk), in position order, each + offset, or -1 past the query's `visible` groups. out: [k].
void select_row(const LayerCtx& L, std::span<const double> score, int64_t visible, int64_t offset,
                std::span<int32_t> out);
// The weights_proj(x) · (index_head_dim^-0.5 · index_n_heads^-0.5) of the indexer: [M, index_n_heads] bf16.
std::vector<double> index_weights(const LayerCtx& L, std::span<const double> x, int64_t M);

// The grouped output projection of sparse_attn's output o [N, H, hd] (after the inverse RoPE): [N, dim].
std::vector<double> grouped_output(const LayerCtx& L, std::span<const double> o, int64_t N);
// model.py Attention.forward of one decode step (start_pos = state.pos) on x [1, dim]: the window ring,
// the compressor's group, the indexer on every key so far, the candidate pool of this step, and
// sparse_attn over [ring | compressed rows]. L.rope covers positions 0 .. state.pos.
std::vector<double> attention_decode(const LayerCtx& L, std::span<const double> x, V41DecodeState& state,
                                     V41LayerCapture& cap);

// The indices of the k largest values (unsorted order aside, as torch_topk): with torch ties, exactly
// torch_topk; with lowest_index ties, the k largest with equal values taken lower index first, in
// descending value order.
std::vector<int64_t> select_topk(std::span<const double> values, int64_t k, bool as_fp32, V41TopkTies ties);

// model.py Attention.forward on x [N, dim] (attn_norm's output, bf16); reads and publishes the shared
// state; records what it publishes in cap. Returns [N, dim].
std::vector<double> attention_forward(const LayerCtx& L, std::span<const double> x, V41SharedAttention& shared,
                                      V41LayerCapture& cap);
// A kv source's sources alone on x [N, dim] (attn_norm's output), into *L.cache: the compressor (its group
// state seeded), the compressed KV and, for an owner, the index keys; the attention's other work skipped.
void write_sources(const LayerCtx& L, std::span<const double> x);
// model.py MoE.forward on x [N, dim] (ffn_norm's output). Returns [N, dim] bf16; cap.experts.
std::vector<double> moe_forward(const LayerCtx& L, std::span<const double> x, V41LayerCapture& cap);
// model.py Engram.forward on the streams [N, hc, dim] in place; hash_ids [N, cols].
void engram_forward(const LayerCtx& L, std::span<double> streams, std::span<const int64_t> hash_ids);

}  // namespace ced::v41::fwd
