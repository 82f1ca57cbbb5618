// The CUDA backend: device weights, cuBLAS projections and the run
// orchestration of SPEC §4–§6 (full, ced, resume, decode). The kernels are in
// kernels.cu, the per-element maths in device_math.cuh. Compiled by the host
// compiler; nothing here includes reference/.
//
// Layout: every activation is row-major with one row per position. Buffers
// that live for the whole run (hidden states X, local entries, global entries,
// compressor rows, selections, pools) are indexed by absolute position
// ("abs rows"); scratch buffers by the row inside the evaluated range [a, b).
#include "optimized/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "model/error.hpp"
#include "model/plan.hpp"
#include "model/weights.hpp"
#include "optimized/cuda_check.hpp"
#include "optimized/device_math.cuh"
#include "optimized/kernels.hpp"

namespace ced {

const char* cuda_precision_name(CudaPrecision p) { return p == CudaPrecision::BF16 ? "bf16" : "f32"; }

CudaPrecision parse_cuda_precision(const std::string& s) {
  if (s == "f32") return CudaPrecision::F32;
  if (s == "bf16") return CudaPrecision::BF16;
  throw InputError(fmt::format("CUDA precision: '{}' is not one of f32, bf16", s));
}

bool cuda_device_available() {
  try {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // clear it; nothing else of ours ran
      return false;
    }
    return n > 0;
  } catch (...) {
    return false;
  }
}

namespace {

// ---------------------------------------------------------------------------
// Device memory

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(int64_t n) { allocate(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  void allocate(int64_t n) {
    release();
    if (n > 0) {
      CED_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes(n)));
      n_ = n;
    }
  }
  // Every byte = v (0xFF: NaN for floats, −1 for int32).
  void fill_bytes(int v) {
    if (n_ > 0) CED_CUDA_CHECK(cudaMemset(p_, v, bytes(n_)));
  }
  void upload(const T* host, int64_t count, int64_t offset = 0) {
    bounds(count, offset);
    if (count > 0) CED_CUDA_CHECK(cudaMemcpy(p_ + offset, host, bytes(count), cudaMemcpyHostToDevice));
  }
  void download(T* host, int64_t count, int64_t offset = 0) const {
    bounds(count, offset);
    if (count > 0) CED_CUDA_CHECK(cudaMemcpy(host, p_ + offset, bytes(count), cudaMemcpyDeviceToHost));
  }
  T* get() const { return p_; }
  int64_t size() const { return n_; }

 private:
  static size_t bytes(int64_t n) { return static_cast<size_t>(n) * sizeof(T); }
  void bounds(int64_t count, int64_t offset) const {
    if (count < 0 || offset < 0 || offset + count > n_)
      throw std::logic_error(fmt::format("CUDA backend: copy of {} elements at {} outside a buffer of {}", count,
                                         offset, n_));
  }
  void release() noexcept {
    if (p_) (void)cudaFree(p_);  // nothing useful to do with an error while releasing
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  int64_t n_ = 0;
};

// A weight matrix W [rows = in, cols = out], f32 or bf16 (by precision).
struct DevMat {
  int64_t rows = 0, cols = 0;
  DeviceBuffer<float> f32;
  DeviceBuffer<uint16_t> bf16;
};
struct DevExpert {
  DevMat w1, w3;  // [d, moe_dim]
  DevMat w2;      // [moe_dim, d]
};
struct DevLayer {
  DeviceBuffer<float> attn_norm, ffn_norm;  // [d]
  DevMat wq_a;                              // [d, q_lora_rank]
  DeviceBuffer<float> q_norm;               // [q_lora_rank]
  DevMat wq_b;                              // [q_lora_rank, n_heads·head_dim]
  DevMat wkv;                               // [d, head_dim]
  DeviceBuffer<float> kv_norm;              // [head_dim]
  DeviceBuffer<float> attn_sink;            // [n_heads]
  DevMat comp_wkv, comp_wgate;              // [d, head_dim] (Full; wgate for r >= 2)
  DeviceBuffer<float> comp_norm;            // [head_dim]
  DevMat idx_wk;                            // [head_dim, index_head_dim]
  DeviceBuffer<float> idx_knorm;            // [index_head_dim]
  DevMat idx_wq;                            // [q_lora_rank, index_n_heads·index_head_dim]
  DevMat idx_wweights;                      // [d, index_n_heads]
  std::vector<DevMat> wo_a;                 // o_groups × [(n_heads/o_groups)·head_dim, o_lora_rank]
  DevMat wo_b;                              // [o_groups·o_lora_rank, d]
  DevMat router;                            // [d, n_routed_experts]
  DeviceBuffer<float> router_bias;          // [n_routed_experts]
  std::vector<DevExpert> experts, shared;
};
struct DevWeights {
  DeviceBuffer<float> embed;  // [V, d], f32 in both precisions (a row gather, not a product)
  std::vector<DevLayer> layers;
  DeviceBuffer<float> final_norm;  // [d]
  DevMat lm_head;                  // [d, V]
};

bool is_matrix(const TensorSpec& t) { return t.shape.size() == 2 && t.kind != TensorKind::Embed; }

// Bytes the weights take on the device.
double weight_bytes(const std::vector<TensorSpec>& specs, CudaPrecision prec) {
  double b = 0;
  for (const auto& t : specs)
    b += static_cast<double>(t.numel()) * ((is_matrix(t) && prec == CudaPrecision::BF16) ? 2.0 : 4.0);
  return b;
}

// SPEC §2 weights, generated on the host tensor by tensor (values rounded to
// f32 as generate_weights<float> does) and uploaded once.
DevWeights upload_weights(const Config& c, const Plan& plan, uint64_t seed, CudaPrecision prec) {
  DevWeights w;
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (auto& lw : w.layers) {
    lw.wo_a.resize(static_cast<size_t>(c.o_groups));
    lw.experts.resize(static_cast<size_t>(c.n_routed_experts));
    lw.shared.resize(static_cast<size_t>(c.n_shared_experts));
  }
  for (const TensorSpec& t : weight_specs(c, plan)) {
    const std::vector<double> v = generate_tensor(t, seed);
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
    auto vec = [&](DeviceBuffer<float>& dst) {
      dst.allocate(t.numel());
      dst.upload(f.data(), t.numel());
    };
    auto mat = [&](DevMat& dst) {
      dst.rows = t.shape[0];
      dst.cols = t.shape[1];
      if (prec == CudaPrecision::F32) {
        vec(dst.f32);
      } else {
        DeviceBuffer<float> tmp(t.numel());
        tmp.upload(f.data(), t.numel());
        dst.bf16.allocate(t.numel());
        cuda::f32_to_bf16(tmp.get(), dst.cols, dst.bf16.get(), dst.rows, dst.cols);
        CED_CUDA_CHECK(cudaDeviceSynchronize());
      }
    };
    DevLayer* lw = t.layer >= 0 ? &w.layers[size_t(t.layer)] : nullptr;
    const size_t ix = t.index >= 0 ? size_t(t.index) : 0;
    switch (t.kind) {
      case TensorKind::Embed: vec(w.embed); break;
      case TensorKind::AttnNorm: vec(lw->attn_norm); break;
      case TensorKind::FfnNorm: vec(lw->ffn_norm); break;
      case TensorKind::WqA: mat(lw->wq_a); break;
      case TensorKind::QNorm: vec(lw->q_norm); break;
      case TensorKind::WqB: mat(lw->wq_b); break;
      case TensorKind::Wkv: mat(lw->wkv); break;
      case TensorKind::KvNorm: vec(lw->kv_norm); break;
      case TensorKind::AttnSink: vec(lw->attn_sink); break;
      case TensorKind::CompWkv: mat(lw->comp_wkv); break;
      case TensorKind::CompWgate: mat(lw->comp_wgate); break;
      case TensorKind::CompNorm: vec(lw->comp_norm); break;
      case TensorKind::IdxWk: mat(lw->idx_wk); break;
      case TensorKind::IdxKnorm: vec(lw->idx_knorm); break;
      case TensorKind::IdxWq: mat(lw->idx_wq); break;
      case TensorKind::IdxWweights: mat(lw->idx_wweights); break;
      case TensorKind::WoA: mat(lw->wo_a[ix]); break;
      case TensorKind::WoB: mat(lw->wo_b); break;
      case TensorKind::Router: mat(lw->router); break;
      case TensorKind::RouterBias: vec(lw->router_bias); break;
      case TensorKind::ExpertW1: mat(lw->experts[ix].w1); break;
      case TensorKind::ExpertW3: mat(lw->experts[ix].w3); break;
      case TensorKind::ExpertW2: mat(lw->experts[ix].w2); break;
      case TensorKind::SharedW1: mat(lw->shared[ix].w1); break;
      case TensorKind::SharedW3: mat(lw->shared[ix].w3); break;
      case TensorKind::SharedW2: mat(lw->shared[ix].w2); break;
      case TensorKind::FinalNorm: vec(w.final_norm); break;
      case TensorKind::LmHead: mat(w.lm_head); break;
    }
  }
  return w;
}

// ---------------------------------------------------------------------------
// Projections y = x W through cuBLAS.
//
// Every product runs in tiles of exactly kTile rows, staged through fixed,
// aligned buffers, so each cuBLAS call for a given weight has the same shape,
// leading dimensions and alignment whatever the number of rows or where they
// sit: cuBLAS then runs the same kernel, and a row's result does not depend on
// the other rows evaluated in the same call (batch invariance). cuBLAS is
// deterministic run to run on one stream with the same GPU model.

struct CublasHandle {
  cublasHandle_t h = nullptr;
  CublasHandle() { CED_CUDA_CHECK(cublasCreate(&h)); }
  ~CublasHandle() {
    if (h) (void)cublasDestroy(h);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
};

class Projector {
 public:
  static constexpr int64_t kTile = 128;

  Projector(CudaPrecision prec, int64_t max_in, int64_t max_out) : bf16_(prec == CudaPrecision::BF16) {
    // F32: pedantic math (IEEE f32 products, no TF32). BF16: bf16 inputs with f32 compute (CUBLAS_COMPUTE_32F).
    CED_CUDA_CHECK(cublasSetMathMode(handle_.h, bf16_ ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH));
    CED_CUDA_CHECK(cublasSetPointerMode(handle_.h, CUBLAS_POINTER_MODE_HOST));
    xs_.allocate(kTile * max_in);
    ys_.allocate(kTile * max_out);
    xs_.fill_bytes(0);
    ys_.fill_bytes(0);
    if (bf16_) {
      xb_.allocate(kTile * max_in);
      xb_.fill_bytes(0);
    }
  }

  // Y[n, W.cols] (row stride ldy) = X[n, W.rows] (row stride ldx) · W.
  void operator()(const float* X, int64_t ldx, int64_t n, const DevMat& W, float* Y, int64_t ldy) {
    const int64_t in = W.rows, out = W.cols;
    const float alpha = 1.0f, beta = 0.0f;
    const size_t fs = sizeof(float);
    for (int64_t i0 = 0; i0 < n; i0 += kTile) {
      const int64_t rows = std::min(kTile, n - i0);
      // Column-major view: Y^T [out, kTile] = W^T [out, in] · X^T [in, kTile].
      if (bf16_) {
        cuda::f32_to_bf16(X + i0 * ldx, ldx, xb_.get(), rows, in);
        CED_CUDA_CHECK(cublasGemmEx(handle_.h, CUBLAS_OP_N, CUBLAS_OP_N, int(out), int(kTile), int(in), &alpha,
                                    W.bf16.get(), CUDA_R_16BF, int(out), xb_.get(), CUDA_R_16BF, int(in), &beta,
                                    ys_.get(), CUDA_R_32F, int(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      } else {
        CED_CUDA_CHECK(cudaMemcpy2D(xs_.get(), size_t(in) * fs, X + i0 * ldx, size_t(ldx) * fs, size_t(in) * fs,
                                    size_t(rows), cudaMemcpyDeviceToDevice));
        CED_CUDA_CHECK(cublasSgemm(handle_.h, CUBLAS_OP_N, CUBLAS_OP_N, int(out), int(kTile), int(in), &alpha,
                                   W.f32.get(), int(out), xs_.get(), int(in), &beta, ys_.get(), int(out)));
      }
      CED_CUDA_CHECK(cudaMemcpy2D(Y + i0 * ldy, size_t(ldy) * fs, ys_.get(), size_t(out) * fs, size_t(out) * fs,
                                  size_t(rows), cudaMemcpyDeviceToDevice));
    }
  }

 private:
  bool bf16_;
  CublasHandle handle_;
  DeviceBuffer<float> xs_, ys_;  // [kTile, max_in], [kTile, max_out]
  DeviceBuffer<uint16_t> xb_;    // [kTile, max_in] bf16
};

// ---------------------------------------------------------------------------
// One run's device state and the SPEC §3 layer.

struct Source {  // a kv source's global entries (SPEC §3.3)
  int64_t layer = -1, ratio = 0, cap = 0;  // cap: entries the run can complete (Ntot / r)
  DeviceBuffer<float> entries;             // [cap, head_dim]  g_j (roped)
  DeviceBuffer<float> keys;                // [cap, index_head_dim]  ik_j (roped)
  DeviceBuffer<float> cbuf, zbuf;          // [Ntot, head_dim]  c_t, z_t per token (r >= 2)
};

struct HostCapture {
  std::vector<int64_t> positions;
  std::vector<double> out;    // [P_l, d]
  std::vector<int64_t> topk;  // [P_l, index_topk]
};

class Runner {
 public:
  Runner(const Config& c, const Plan& plan, const DevWeights& w, Projector& proj, const std::vector<int32_t>& tokens,
         bool capture)
      : plan_(plan), w_(w), proj_(proj), capture_(capture) {
    ntot_ = static_cast<int64_t>(tokens.size());
    d_ = c.d_model;
    hd_ = c.head_dim;
    H_ = c.n_heads;
    rd_ = c.rope_dim;
    half_ = rd_ / 2;
    qr_ = c.q_lora_rank;
    HI_ = c.index_n_heads;
    dI_ = c.index_head_dim;
    K_ = c.index_topk;
    bs_ = std::max<int64_t>(1, c.candidate_block_size);
    ctb_ = std::max<int64_t>(1, c.candidate_topk_blocks);
    G_ = c.o_groups;
    olr_ = c.o_lora_rank;
    R_ = c.n_routed_experts;
    A_ = c.n_routed_experts > 0 ? c.n_active_experts : 0;
    moe_ = c.moe_dim;
    V_ = c.vocab_size;
    W_ = c.window;
    eps_ = static_cast<float>(c.rms_eps);
    rsf_ = static_cast<float>(c.routed_scaling_factor);
    scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd_)));
    iw_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dI_ * HI_)));
    const int64_t L = plan.L, n = std::max<int64_t>(1, ntot_);
    first_.assign(size_t(L), -1);

    tokens_.allocate(ntot_);
    tokens_.upload(tokens.data(), ntot_);
    // RoPE tables [Ntot, rope_dim/2]: angles in double, rounded once.
    std::vector<float> cs(size_t(ntot_ * half_)), sn(size_t(ntot_ * half_));
    for (int64_t p = 0; p < ntot_; ++p)
      for (int64_t i = 0; i < half_; ++i) {
        const double th = cuda::rope_angle(p, i, rd_, c.rope_theta);
        cs[size_t(p * half_ + i)] = static_cast<float>(std::cos(th));
        sn[size_t(p * half_ + i)] = static_cast<float>(std::sin(th));
      }
    cos_.allocate(ntot_ * half_);
    sin_.allocate(ntot_ * half_);
    cos_.upload(cs.data(), ntot_ * half_);
    sin_.upload(sn.data(), ntot_ * half_);

    // Persistent state. Floats start as NaN so that a read of anything never
    // written shows in the outputs; selections and pools start as −1.
    auto nan_buf = [](DeviceBuffer<float>& b, int64_t count) {
      b.allocate(count);
      b.fill_bytes(0xFF);
    };
    nan_buf(X_, ntot_ * d_);
    local_.resize(size_t(L));
    topk_.resize(size_t(L));
    sources_.resize(size_t(L));
    for (int64_t l = 0; l < L; ++l) {
      const LayerPlan& lp = plan[l];
      nan_buf(local_[size_t(l)], ntot_ * hd_);
      if (lp.index_source) {
        topk_[size_t(l)].allocate(ntot_ * K_);
        topk_[size_t(l)].fill_bytes(0xFF);
      }
      if (lp.role == Role::Full) {
        Source& S = sources_[size_t(l)];
        S.layer = l;
        S.ratio = lp.ratio;
        S.cap = cuda::n_complete_entries(ntot_, lp.ratio);
        nan_buf(S.entries, S.cap * hd_);
        nan_buf(S.keys, S.cap * dI_);
        if (lp.ratio >= 2) {
          nan_buf(S.cbuf, ntot_ * hd_);
          nan_buf(S.zbuf, ntot_ * hd_);
        }
      }
    }
    if (c.candidate_source_layer >= 0) {
      pool_.allocate(ntot_ * ctb_);
      pool_.fill_bytes(0xFF);
    }

    // Scratch, [n rows, ...] for the largest evaluated range.
    nan_buf(xhat_, n * d_);
    nan_buf(qa_, n * qr_);
    nan_buf(qlat_, n * qr_);
    nan_buf(q_, n * H_ * hd_);
    nan_buf(o_, n * H_ * hd_);
    nan_buf(iq_, n * HI_ * dI_);
    nan_buf(iw_, n * HI_);
    nan_buf(u_, n * G_ * olr_);
    nan_buf(y_, n * d_);
    nan_buf(fhat_, n * d_);
    nan_buf(acc_, n * d_);
    nan_buf(h1_, n * moe_);
    nan_buf(h3_, n * moe_);
    if (R_ > 0) {
      nan_buf(rlog_, n * R_);
      nan_buf(rs_, n * R_);
      nan_buf(rw_, n * A_);
      chosen_.allocate(n * A_);
      chosen_.fill_bytes(0xFF);
    }
    // Index scores [chunk, ld_s]: at most kScoreBudget floats, ≤ 65535 queries a chunk.
    ld_s_ = n;
    chunk_ = std::clamp<int64_t>(kScoreBudget / ld_s_, 1, std::min<int64_t>(65535, n));
    nan_buf(scores_, chunk_ * ld_s_);
    ld_b_ = std::max<int64_t>(1, cuda::pool_n_blocks(n, bs_));
    if (c.candidate_source_layer >= 0) nan_buf(bscores_, chunk_ * ld_b_);
    logit_rows_ = std::min<int64_t>(n, kLogitRows);
    nan_buf(lbuf_, logit_rows_ * V_);
    if (capture_) captures_.resize(size_t(L));
  }

  // The first position layer l is evaluated at: its window never starts earlier (SPEC §4–§6).
  void set_first(int64_t l, int64_t pos) { first_[size_t(l)] = pos; }

  // X_0 = embed[tokens] at positions [a, b).
  void embed(int64_t a, int64_t b) { cuda::embed_rows(tokens_.get(), w_.embed.get(), X_.get(), a, b - a, d_); }

  // SPEC §3: layer l at positions [a, b). Global entries of a Full encoder
  // layer are written only at positions >= write_from (SPEC §6: cached below P).
  void layer(int64_t l, int64_t a, int64_t b, int64_t write_from) {
    const LayerPlan& lp = plan_[l];
    const DevLayer& lw = w_.layers[size_t(l)];
    const int64_t n = b - a;
    if (n <= 0) return;
    if (first_[size_t(l)] < 0 || a < first_[size_t(l)] || b > ntot_)
      throw std::logic_error(fmt::format("CUDA backend: layer {} evaluated at [{}, {}) before its first position {}",
                                         l, a, b, first_[size_t(l)]));
    float* Xa = X_.get() + a * d_;
    // x̂ = RMSNorm(X_p) ⊙ attn_norm                                    [n, d]
    cuda::rmsnorm_rows(Xa, d_, lw.attn_norm.get(), xhat_.get(), d_, n, d_, eps_);
    // §3.3 global entries of a Full encoder layer (decoder sources: source_only)
    if (lp.role == Role::Full && !lp.reads_xhat_E) write_source(l, xhat_.get(), a, b, write_from);
    // §3.1 query: q_lat = RMSNorm(x̂ wq_a) ⊙ q_norm; q = RoPE(q_lat wq_b)   [n, H·hd]
    proj_(xhat_.get(), d_, n, lw.wq_a, qa_.get(), qr_);
    cuda::rmsnorm_rows(qa_.get(), qr_, lw.q_norm.get(), qlat_.get(), qr_, n, qr_, eps_);
    proj_(qlat_.get(), qr_, n, lw.wq_b, q_.get(), H_ * hd_);
    cuda::rope_rows(q_.get(), H_ * hd_, n, H_, hd_, rd_, a, 1, cos_.get(), sin_.get(), false);
    // §3.2 local entry k_p = RoPE(RMSNorm(x̂ wkv) ⊙ kv_norm, p)          [Ntot, hd] abs
    float* loc = local_[size_t(l)].get() + a * hd_;
    proj_(xhat_.get(), d_, n, lw.wkv, loc, hd_);
    cuda::rmsnorm_rows(loc, hd_, lw.kv_norm.get(), loc, hd_, n, hd_, eps_);
    cuda::rope_rows(loc, hd_, n, 1, hd_, rd_, a, 1, cos_.get(), sin_.get(), false);
    // §3.4 selection (Reuse layers take idx_src's)
    const float* entries = nullptr;
    const int32_t* sel = nullptr;
    if (lp.ratio > 0) {
      if (lp.index_source) select(l, a, b);
      entries = sources_[size_t(lp.kv_src)].entries.get();
      sel = topk_[size_t(lp.idx_src)].get();
    }
    // §3.5 attention over local window + selected global entries + sink    [n, H·hd]
    cuda::attention(q_.get(), n, a, first_[size_t(l)], W_, local_[size_t(l)].get(), entries, sel, K_,
                    lw.attn_sink.get(), H_, hd_, rd_, cos_.get(), sin_.get(), scale_, o_.get());
    // §3.6 grouped output: u_g = concat(o_h in g) wo_a.g; attn_out = concat(u_g) wo_b
    const int64_t group_width = (H_ / G_) * hd_;
    for (int64_t g = 0; g < G_; ++g)
      proj_(o_.get() + g * group_width, H_ * hd_, n, lw.wo_a[size_t(g)], u_.get() + g * olr_, G_ * olr_);
    proj_(u_.get(), G_ * olr_, n, lw.wo_b, y_.get(), d_);
    cuda::add_inplace(Xa, y_.get(), n * d_);
    // §3.7 FFN
    ffn(lw, Xa, n);
    if (capture_) capture(l, a, b);
  }

  // SPEC §4 step 2: every decoder kv source's entries and index keys from
  // x̂_E = RMSNorm(H_E) ⊙ layers.E.attn_norm at positions [a, b) (>= write_from).
  void source_only(int64_t a, int64_t b, int64_t write_from) {
    if (plan_.decoder_kv_sources.empty() || b <= a) return;
    const int64_t n = b - a;
    cuda::rmsnorm_rows(X_.get() + a * d_, d_, w_.layers[size_t(plan_.E)].attn_norm.get(), xhat_.get(), d_, n, d_,
                       eps_);
    for (int64_t sl : plan_.decoder_kv_sources) write_source(sl, xhat_.get(), a, b, write_from);
  }

  // logits = (RMSNorm(X_L) ⊙ final_norm) lm_head at positions [a, b) into out rows row0 ...
  void logits(int64_t a, int64_t b, MatD& out, int64_t row0) {
    std::vector<float> host;
    for (int64_t i0 = a; i0 < b; i0 += logit_rows_) {
      const int64_t m = std::min(logit_rows_, b - i0);
      cuda::rmsnorm_rows(X_.get() + i0 * d_, d_, w_.final_norm.get(), xhat_.get(), d_, m, d_, eps_);
      proj_(xhat_.get(), d_, m, w_.lm_head, lbuf_.get(), V_);
      host.resize(size_t(m * V_));
      lbuf_.download(host.data(), m * V_);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t v = 0; v < V_; ++v) out(row0 + (i0 - a) + i, v) = host[size_t(i * V_ + v)];
    }
  }

  // SPEC §6: the persisted cache of the first P tokens (all of them written).
  PersistedCache extract_cache(int64_t P, const std::string& dtype) const {
    PersistedCache pc;
    pc.prefix_len = P;
    pc.dtype = dtype;
    for (int64_t sl : plan_.kv_sources) {
      const Source& S = sources_[size_t(sl)];
      SourceCache sc;
      sc.layer = sl;
      sc.ratio = S.ratio;
      sc.n_tokens = P;
      const int64_t ne = cuda::n_complete_entries(P, S.ratio);
      sc.entries = download_rows(S.entries, 0, ne, hd_);
      sc.index_keys = download_rows(S.keys, 0, ne, dI_);
      const int64_t np = S.ratio >= 2 ? P - ne * S.ratio : 0;
      sc.pending_c = S.ratio >= 2 ? download_rows(S.cbuf, ne * S.ratio, np, hd_) : MatD(0, hd_);
      sc.pending_z = S.ratio >= 2 ? download_rows(S.zbuf, ne * S.ratio, np, hd_) : MatD(0, hd_);
      pc.sources.push_back(std::move(sc));
    }
    return pc;
  }

  // SPEC §6: global entries, index keys and pending compressor rows of a
  // persisted cache (already checked against the config).
  void load_cache(const PersistedCache& pc) {
    const int64_t P = pc.prefix_len;
    for (const SourceCache& sc : pc.sources) {
      Source& S = sources_[size_t(sc.layer)];
      const int64_t ne = cuda::n_complete_entries(P, S.ratio);
      upload_rows(S.entries, 0, sc.entries);
      upload_rows(S.keys, 0, sc.index_keys);
      if (S.ratio >= 2) {
        upload_rows(S.cbuf, ne * S.ratio, sc.pending_c);
        upload_rows(S.zbuf, ne * S.ratio, sc.pending_z);
      }
    }
  }

  std::vector<LayerCapture> take_captures() {
    std::vector<LayerCapture> out;
    for (int64_t l = 0; l < plan_.L; ++l) {
      HostCapture& hc = captures_[size_t(l)];
      LayerCapture lc;
      lc.layer = l;
      lc.positions = hc.positions;
      const int64_t P = static_cast<int64_t>(hc.positions.size());
      lc.out = Eigen::Map<const MatD>(hc.out.data(), P, d_);
      lc.has_topk = plan_[l].ratio > 0;
      if (lc.has_topk) {
        lc.topk.resize(P, K_);
        for (int64_t i = 0; i < P * K_; ++i) lc.topk.data()[i] = hc.topk[size_t(i)];
      }
      out.push_back(std::move(lc));
    }
    return out;
  }

 private:
  static constexpr int64_t kScoreBudget = int64_t(1) << 25;  // floats of index scores per chunk (128 MiB)
  static constexpr int64_t kLogitRows = 256;                 // lm_head rows per product

  // SPEC §3.3: the global entries and index keys of kv source sl from x̂ rows
  // of positions [a, b) (xhat [b − a, d]), at positions >= write_from.
  void write_source(int64_t sl, const float* xhat, int64_t a, int64_t b, int64_t write_from) {
    Source& S = sources_[size_t(sl)];
    const DevLayer& lw = w_.layers[size_t(sl)];
    const int64_t r = S.ratio;
    const int64_t wa = std::max(a, write_from);
    if (wa >= b) return;
    const float* xw = xhat + (wa - a) * d_;
    const int64_t nw = b - wa;
    if (r == 1) {
      // lat_t = RMSNorm(x̂_t comp_wkv) ⊙ comp_norm, position t
      proj_(xw, d_, nw, lw.comp_wkv, S.entries.get() + wa * hd_, hd_);
      finish_entries(S, lw, wa, nw);
    } else {
      // c_t = x̂_t comp_wkv, z_t = x̂_t comp_wgate; block j once its r tokens exist
      proj_(xw, d_, nw, lw.comp_wkv, S.cbuf.get() + wa * hd_, hd_);
      proj_(xw, d_, nw, lw.comp_wgate, S.zbuf.get() + wa * hd_, hd_);
      const int64_t j0 = wa / r, j1 = cuda::n_complete_entries(b, r);
      if (j1 > j0) {
        cuda::compress_blocks(S.cbuf.get(), S.zbuf.get(), j0, j1 - j0, r, hd_, S.entries.get() + j0 * hd_);
        finish_entries(S, lw, j0, j1 - j0);
      }
    }
  }

  // Entries j0 .. j0+nj−1 hold the pre-norm latents: lat_j = RMSNorm(.) ⊙ comp_norm;
  // ik_j = RoPE(RMSNorm(lat_j idx_wk) ⊙ idx_knorm, j·r); g_j = RoPE(lat_j, j·r).
  void finish_entries(Source& S, const DevLayer& lw, int64_t j0, int64_t nj) {
    float* E = S.entries.get() + j0 * hd_;
    float* IK = S.keys.get() + j0 * dI_;
    cuda::rmsnorm_rows(E, hd_, lw.comp_norm.get(), E, hd_, nj, hd_, eps_);
    proj_(E, hd_, nj, lw.idx_wk, IK, dI_);
    cuda::rmsnorm_rows(IK, dI_, lw.idx_knorm.get(), IK, dI_, nj, dI_, eps_);
    cuda::rope_rows(IK, dI_, nj, 1, dI_, rd_, j0 * S.ratio, S.ratio, cos_.get(), sin_.get(), false);
    cuda::rope_rows(E, hd_, nj, 1, hd_, rd_, j0 * S.ratio, S.ratio, cos_.get(), sin_.get(), false);
  }

  // SPEC §3.4 at index source l, positions [a, b): uses x̂ (xhat_) and q_lat (qlat_).
  void select(int64_t l, int64_t a, int64_t b) {
    const LayerPlan& lp = plan_[l];
    const DevLayer& lw = w_.layers[size_t(l)];
    const Source& S = sources_[size_t(lp.kv_src)];
    const int64_t n = b - a, r = lp.ratio;
    // iq = RoPE per index head (q_lat idx_wq)        [n, HI·dI]
    proj_(qlat_.get(), qr_, n, lw.idx_wq, iq_.get(), HI_ * dI_);
    cuda::rope_rows(iq_.get(), HI_ * dI_, n, HI_, dI_, rd_, a, 1, cos_.get(), sin_.get(), false);
    // w = (x̂ idx_wweights) · (dI·HI)^−1/2            [n, HI]
    proj_(xhat_.get(), d_, n, lw.idx_wweights, iw_.get(), HI_);
    cuda::scale_inplace(iw_.get(), n * HI_, iw_scale_);
    int32_t* pool = pool_.get();
    for (int64_t c0 = 0; c0 < n; c0 += chunk_) {
      const int64_t nq = std::min(chunk_, n - c0), p0 = a + c0;
      cuda::index_scores(iq_.get() + c0 * HI_ * dI_, iw_.get() + c0 * HI_, nq, p0, S.keys.get(), r, HI_, dI_,
                         scores_.get(), ld_s_);
      if (lp.candidate_source)
        cuda::candidate_pool(scores_.get(), ld_s_, nq, p0, r, bs_, ctb_, bscores_.get(), ld_b_, pool);
      cuda::select_topk(scores_.get(), ld_s_, nq, p0, r, K_, lp.selects_in_pool ? pool : nullptr, bs_, ctb_,
                        topk_[size_t(l)].get());
    }
  }

  // SPEC §3.7: X += Σ_chosen weight_e SwiGLU_e(f̂) + Σ_shared SwiGLU_s(f̂).
  // Routed experts run densely over all n rows; a row adds only its chosen ones.
  void ffn(const DevLayer& lw, float* Xa, int64_t n) {
    cuda::rmsnorm_rows(Xa, d_, lw.ffn_norm.get(), fhat_.get(), d_, n, d_, eps_);
    CED_CUDA_CHECK(cudaMemset(acc_.get(), 0, size_t(n * d_) * sizeof(float)));
    if (R_ > 0) {
      proj_(fhat_.get(), d_, n, lw.router, rlog_.get(), R_);
      cuda::route(rlog_.get(), lw.router_bias.get(), n, R_, A_, rsf_, rs_.get(), chosen_.get(), rw_.get());
      for (int64_t e = 0; e < R_; ++e) {
        swiglu(lw.experts[size_t(e)], n);
        cuda::add_routed(acc_.get(), y_.get(), chosen_.get(), rw_.get(), e, A_, n, d_);
      }
    }
    for (const DevExpert& s : lw.shared) {
      swiglu(s, n);
      cuda::add_inplace(acc_.get(), y_.get(), n * d_);
    }
    cuda::add_inplace(Xa, acc_.get(), n * d_);
  }

  // y_ = (silu(f̂ w1) ⊙ (f̂ w3)) w2     [n, d]
  void swiglu(const DevExpert& ex, int64_t n) {
    proj_(fhat_.get(), d_, n, ex.w1, h1_.get(), moe_);
    proj_(fhat_.get(), d_, n, ex.w3, h3_.get(), moe_);
    cuda::swiglu_inplace(h1_.get(), h3_.get(), n * moe_);
    proj_(h1_.get(), moe_, n, ex.w2, y_.get(), d_);
  }

  void capture(int64_t l, int64_t a, int64_t b) {
    HostCapture& hc = captures_[size_t(l)];
    const int64_t n = b - a;
    std::vector<float> xs(size_t(n * d_));
    X_.download(xs.data(), n * d_, a * d_);
    for (int64_t p = a; p < b; ++p) hc.positions.push_back(p);
    hc.out.insert(hc.out.end(), xs.begin(), xs.end());
    const LayerPlan& lp = plan_[l];
    if (lp.ratio > 0) {
      std::vector<int32_t> ts(size_t(n * K_));
      topk_[size_t(lp.idx_src)].download(ts.data(), n * K_, a * K_);
      hc.topk.insert(hc.topk.end(), ts.begin(), ts.end());
    }
  }

  static MatD download_rows(const DeviceBuffer<float>& buf, int64_t row0, int64_t rows, int64_t cols) {
    std::vector<float> h(size_t(rows * cols));
    buf.download(h.data(), rows * cols, row0 * cols);
    MatD m(rows, cols);
    for (int64_t i = 0; i < rows * cols; ++i) m.data()[i] = h[size_t(i)];
    return m;
  }

  static void upload_rows(DeviceBuffer<float>& buf, int64_t row0, const MatD& m) {
    std::vector<float> h(size_t(m.size()));
    for (int64_t i = 0; i < m.size(); ++i) h[size_t(i)] = static_cast<float>(m.data()[i]);
    buf.upload(h.data(), m.size(), row0 * m.cols());
  }

  const Plan& plan_;
  const DevWeights& w_;
  Projector& proj_;
  bool capture_;
  int64_t ntot_ = 0, d_ = 0, hd_ = 0, H_ = 0, rd_ = 0, half_ = 0, qr_ = 0, HI_ = 0, dI_ = 0, K_ = 0, bs_ = 1,
          ctb_ = 1, G_ = 0, olr_ = 0, R_ = 0, A_ = 0, moe_ = 0, V_ = 0, W_ = 0;
  float eps_ = 0, rsf_ = 0, scale_ = 0, iw_scale_ = 0;
  std::vector<int64_t> first_;  // [L] first evaluated position of each layer

  DeviceBuffer<int32_t> tokens_;            // [Ntot]
  DeviceBuffer<float> cos_, sin_;           // [Ntot, rope_dim/2]
  DeviceBuffer<float> X_;                   // [Ntot, d] abs: the residual stream
  std::vector<DeviceBuffer<float>> local_;  // L × [Ntot, head_dim] abs: local (SWA) entries
  std::vector<DeviceBuffer<int32_t>> topk_; // L × [Ntot, index_topk] abs (index sources): S_l(p)
  std::vector<Source> sources_;             // L (Full layers): global entries
  DeviceBuffer<int32_t> pool_;              // [Ntot, candidate_topk_blocks] abs: pool block ids

  DeviceBuffer<float> xhat_, qa_, qlat_, q_, o_, iq_, iw_, u_, y_, fhat_, acc_, h1_, h3_;
  DeviceBuffer<float> rlog_, rs_, rw_;  // [n, R], [n, R], [n, A]
  DeviceBuffer<int32_t> chosen_;        // [n, A]
  DeviceBuffer<float> scores_;          // [chunk, ld_s]
  DeviceBuffer<float> bscores_;         // [chunk, ld_b]
  DeviceBuffer<float> lbuf_;            // [logit_rows, V]
  int64_t ld_s_ = 1, chunk_ = 1, ld_b_ = 1, logit_rows_ = 1;
  std::vector<HostCapture> captures_;
};

// ---------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Config& c, uint64_t seed, CudaPrecision prec) : cfg_(c), prec_(prec) {
    validate(cfg_);
    plan_ = make_plan(cfg_);
    if (!cuda_device_available()) throw NotSupported("CUDA backend: no CUDA device is available");
    CED_CUDA_CHECK(cudaSetDevice(0));
    const int64_t smem_floats = cfg_.window + cfg_.index_topk + cfg_.head_dim;
    if (smem_floats * 4 > 48 * 1024)
      throw NotSupported(fmt::format("CUDA backend: attention needs window + index_topk + head_dim = {} floats of "
                                     "shared memory, more than 48 KiB",
                                     smem_floats));
    const auto specs = weight_specs(cfg_, plan_);
    size_t free_b = 0, total_b = 0;
    CED_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double need = weight_bytes(specs, prec_);
    if (need > 0.9 * static_cast<double>(free_b))
      throw NotSupported(fmt::format("CUDA backend: config '{}' needs {:.2f} GiB of weights on the device ({}), "
                                     "{:.2f} GiB free of {:.2f} GiB",
                                     cfg_.name, need / 1073741824.0, cuda_precision_name(prec_),
                                     static_cast<double>(free_b) / 1073741824.0,
                                     static_cast<double>(total_b) / 1073741824.0));
    int64_t max_in = 1, max_out = 1;
    for (const auto& t : specs)
      if (is_matrix(t)) {
        max_in = std::max(max_in, t.shape[0]);
        max_out = std::max(max_out, t.shape[1]);
      }
    proj_ = std::make_unique<Projector>(prec_, max_in, max_out);
    w_ = upload_weights(cfg_, plan_, seed, prec_);
    CED_CUDA_CHECK(cudaDeviceSynchronize());
  }

  std::string name() const override { return "cuda"; }
  std::string dtype() const override { return cuda_precision_name(prec_); }

  RunResult run(const RunRequest& req) override {
    validate_request(cfg_, req);
    if (req.fault != Fault::None)
      throw NotSupported(fmt::format("CUDA backend: fault injection '{}' is not supported (the negative controls "
                                     "run on the reference)",
                                     fault_name(req.fault)));
    if (req.poison_truncated)
      throw NotSupported("CUDA backend: the poison_truncated dependency probe is not supported");
    const int64_t N = req.n_prompt, steps = req.decode_steps, ntot = N + steps, L = plan_.L, E = plan_.E;
    const auto t0 = std::chrono::steady_clock::now();

    RunResult res = result_for(*this, req, plan_);  // FLOP counts stay zero: counting is the oracle's job

    // First evaluated position of the encoder and of the decoder layers, and
    // the first position whose global entries this run writes.
    int64_t enc_first = 0, dec_first = 0, write_from = 0;
    std::shared_ptr<const PersistedCache> cache;
    if (req.mode == Mode::Ced) {
      const int64_t B = std::min(N, res.n_replay);  // SPEC §4
      dec_first = N - B;
    } else if (req.mode == Mode::Resume) {
      const int64_t P = req.prefix_len;  // SPEC §6
      const int64_t span = req.resume_replay == -1 ? plan_.W : req.resume_replay;
      const int64_t s_r = std::max<int64_t>(0, P - span);
      const int64_t B = std::min(N, res.n_replay);
      enc_first = s_r;
      dec_first = std::max(N - B, s_r);
      write_from = P;
      res.prefix_len = P;
      if (req.cache_in) {
        check_cache(*req.cache_in, P);
        cache = req.cache_in;
      } else {
        cache = std::make_shared<const PersistedCache>(prefix_cache(req.tokens, P));
      }
    }
    res.replay_start = dec_first;

    const std::vector<int32_t> tokens(req.tokens.begin(), req.tokens.begin() + ntot);
    Runner rn(cfg_, plan_, w_, *proj_, tokens, req.capture_layers);
    if (cache) rn.load_cache(*cache);
    for (int64_t l = 0; l < L; ++l) rn.set_first(l, l < E ? enc_first : dec_first);

    // Prompt: encoder, source-only write, decoder (SPEC §4; §6 for resume).
    rn.embed(enc_first, N);
    for (int64_t l = 0; l < E; ++l) rn.layer(l, enc_first, N, write_from);
    rn.source_only(enc_first, N, write_from);
    for (int64_t l = E; l < L; ++l) rn.layer(l, dec_first, N, write_from);

    const int64_t logit_first = req.logits == LogitsScope::All ? dec_first : N - 1;
    const int64_t n_prompt_rows = N - logit_first;
    res.logits.resize(n_prompt_rows + steps, cfg_.vocab_size);
    for (int64_t p = logit_first; p < ntot; ++p) res.positions.push_back(p);
    rn.logits(logit_first, N, res.logits, 0);

    if (req.want_cache)
      res.cache = req.mode == Mode::Resume ? std::make_shared<PersistedCache>(*cache)
                                           : std::make_shared<PersistedCache>(rn.extract_cache(N, dtype()));

    CED_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t1 = std::chrono::steady_clock::now();
    res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    // SPEC §5 decode: one position at a time through all layers, with caches.
    for (int64_t p = N; p < ntot; ++p) {
      rn.embed(p, p + 1);
      for (int64_t l = 0; l < E; ++l) rn.layer(l, p, p + 1, write_from);
      rn.source_only(p, p + 1, write_from);
      for (int64_t l = E; l < L; ++l) rn.layer(l, p, p + 1, write_from);
      rn.logits(p, p + 1, res.logits, n_prompt_rows + (p - N));
    }
    CED_CUDA_CHECK(cudaDeviceSynchronize());
    res.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    if (req.capture_layers) res.layers = rn.take_captures();
    return res;
  }

 private:
  // SPEC §6: the cache of the first P tokens, from the encoder over [0, P)
  // and the source-only write (no decoder, no local entries kept).
  PersistedCache prefix_cache(const std::vector<int32_t>& all_tokens, int64_t P) {
    const std::vector<int32_t> tokens(all_tokens.begin(), all_tokens.begin() + P);
    Runner rn(cfg_, plan_, w_, *proj_, tokens, false);
    for (int64_t l = 0; l < plan_.L; ++l) rn.set_first(l, 0);
    rn.embed(0, P);
    for (int64_t l = 0; l < plan_.E; ++l) rn.layer(l, 0, P, 0);
    rn.source_only(0, P, 0);
    return rn.extract_cache(P, dtype());
  }

  // A persisted cache given in the request must be the one of this config and prefix.
  void check_cache(const PersistedCache& pc, int64_t P) const {
    auto bad = [](const std::string& why) { throw InputError("persisted cache: " + why); };
    if (pc.prefix_len != P) bad(fmt::format("prefix length {} != --prefix {}", pc.prefix_len, P));
    if (pc.sources.size() != plan_.kv_sources.size())
      bad(fmt::format("{} sources, the config has {} kv sources", pc.sources.size(), plan_.kv_sources.size()));
    for (size_t i = 0; i < pc.sources.size(); ++i) {
      const SourceCache& sc = pc.sources[i];
      const int64_t l = plan_.kv_sources[i], r = plan_[l].ratio;
      const int64_t ne = cuda::n_complete_entries(P, r), np = r >= 2 ? P - ne * r : 0;
      if (sc.layer != l || sc.ratio != r || sc.n_tokens != P)
        bad(fmt::format("source {} is layer {} ratio {} over {} tokens; expected layer {} ratio {} over {}", i,
                        sc.layer, sc.ratio, sc.n_tokens, l, r, P));
      auto shape = [&](const MatD& m, int64_t rows, int64_t cols, const char* what) {
        if (m.rows() != rows || (rows > 0 && m.cols() != cols))
          bad(fmt::format("layer {} {}: [{}, {}], expected [{}, {}]", l, what, m.rows(), m.cols(), rows, cols));
      };
      shape(sc.entries, ne, cfg_.head_dim, "entries");
      shape(sc.index_keys, ne, cfg_.index_head_dim, "index_keys");
      shape(sc.pending_c, np, cfg_.head_dim, "pending_c");
      shape(sc.pending_z, np, cfg_.head_dim, "pending_z");
    }
  }

  Config cfg_;
  Plan plan_;
  CudaPrecision prec_;
  std::unique_ptr<Projector> proj_;
  DevWeights w_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Config& config, uint64_t weight_seed, CudaPrecision precision) {
  return std::make_unique<CudaBackend>(config, weight_seed, precision);
}

}  // namespace ced
