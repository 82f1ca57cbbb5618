// The optimized model's layer engine (engine.hpp): the steps of docs/spec.md §3 as
// kernel launches and projections, in the order of reference/lab/engine.cpp.
#include "optimized/lab/engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include "optimized/lab/device_math.cuh"
#include "optimized/lab/kernels.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

Engine::Engine(const Config& c, const Plan& plan, const DevWeights& w, Projector& proj, const std::vector<int32_t>& tokens,
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
  topk_scores_.resize(size_t(L));
  sources_.resize(size_t(L));
  for (int64_t l = 0; l < L; ++l) {
    const LayerPlan& lp = plan[l];
    nan_buf(local_[size_t(l)], ntot_ * hd_);
    if (lp.index_source) {
      topk_[size_t(l)].allocate(ntot_ * K_);
      topk_[size_t(l)].fill_bytes(0xFF);
      nan_buf(topk_scores_[size_t(l)], ntot_ * (K_ + 1));
    }
    if (lp.role == Role::Full) {
      SourceState& S = sources_[size_t(l)];
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


void Engine::set_first(int64_t l, int64_t pos) { first_[size_t(l)] = pos; }

void Engine::embed(int64_t a, int64_t b) { cuda::embed_rows(tokens_.get(), w_.embed.get(), X_.get(), a, b - a, d_); }

const float* Engine::normalised_input(int64_t l, int64_t a, int64_t b) {
  cuda::rmsnorm_rows(X_.get() + a * d_, d_, w_.layers[size_t(l)].attn_norm.get(), xhat_.get(), d_, b - a, d_, eps_);
  return xhat_.get();
}

void Engine::layer(int64_t l, int64_t a, int64_t b, int64_t write_from) {
  const LayerPlan& lp = plan_[l];
  const DevLayer& lw = w_.layers[size_t(l)];
  const int64_t n = b - a;
  if (n <= 0) return;
  if (first_[size_t(l)] < 0 || a < first_[size_t(l)] || b > ntot_)
    throw std::logic_error(fmt::format("CUDA backend: layer {} evaluated at [{}, {}) before its first position {}",
                                       l, a, b, first_[size_t(l)]));
  float* Xa = X_.get() + a * d_;
  // x̂ = RMSNorm(X_p) ⊙ attn_norm                                    [n, d]
  const float* xhat = normalised_input(l, a, b);
  // §3.3 global entries of a Full encoder layer (decoder sources: source_only_write)
  if (lp.role == Role::Full && !lp.reads_xhat_E) append_tokens(l, a, xhat, b, write_from);
  // §3.1 query: q_lat = RMSNorm(x̂ wq_a) ⊙ q_norm; q = RoPE(q_lat wq_b)   [n, H·hd]
  proj_(xhat, d_, n, lw.wq_a, qa_.get(), qr_);
  cuda::rmsnorm_rows(qa_.get(), qr_, lw.q_norm.get(), qlat_.get(), qr_, n, qr_, eps_);
  proj_(qlat_.get(), qr_, n, lw.wq_b, q_.get(), H_ * hd_);
  cuda::rope_rows(q_.get(), H_ * hd_, n, H_, hd_, rd_, a, 1, cos_.get(), sin_.get(), false);
  // §3.2 local entry k_p = RoPE(RMSNorm(x̂ wkv) ⊙ kv_norm, p)          [Ntot, hd] abs
  float* loc = local_[size_t(l)].get() + a * hd_;
  proj_(xhat, d_, n, lw.wkv, loc, hd_);
  cuda::rmsnorm_rows(loc, hd_, lw.kv_norm.get(), loc, hd_, n, hd_, eps_);
  cuda::rope_rows(loc, hd_, n, 1, hd_, rd_, a, 1, cos_.get(), sin_.get(), false);
  // §3.4 selection (Reuse layers take idx_src's)
  if (lp.ratio > 0 && lp.index_source) select(l, a, xhat, qlat_.get(), b);
  // §3.5 attention over local window + selected global entries + sink    [n, H·hd]
  attend(l, a, q_.get(), o_.get(), b);
  // §3.6 grouped output: u_g = concat(o_h in g) wo_a.g; attn_out = concat(u_g) wo_b
  const int64_t group_width = (H_ / G_) * hd_;
  for (int64_t g = 0; g < G_; ++g)
    proj_(o_.get() + g * group_width, H_ * hd_, n, lw.wo_a[size_t(g)], u_.get() + g * olr_, G_ * olr_);
  proj_(u_.get(), G_ * olr_, n, lw.wo_b, y_.get(), d_);
  cuda::add_inplace(Xa, y_.get(), n * d_);
  // §3.7 FFN
  ffn(l, Xa, n);
  if (capture_) capture(l, a, b);
}

void Engine::source_only_write(int64_t a, const float* xhat_E, int64_t b, int64_t write_from) {
  for (int64_t sl : plan_.decoder_kv_sources) append_tokens(sl, a, xhat_E, b, write_from);
}

void Engine::logits(int64_t a, int64_t b, MatD& out, int64_t row0) {
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

PersistedCache Engine::export_cache(const std::string& dtype, int64_t P) const {
  PersistedCache pc;
  pc.prefix_len = P;
  pc.dtype = dtype;
  for (int64_t sl : plan_.kv_sources) {
    const SourceState& S = sources_[size_t(sl)];
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

void Engine::import_cache(const PersistedCache& pc) {
  const int64_t P = pc.prefix_len;
  for (const SourceCache& sc : pc.sources) {
    SourceState& S = sources_[size_t(sc.layer)];
    const int64_t ne = cuda::n_complete_entries(P, S.ratio);
    upload_rows(S.entries, 0, sc.entries);
    upload_rows(S.keys, 0, sc.index_keys);
    if (S.ratio >= 2) {
      upload_rows(S.cbuf, ne * S.ratio, sc.pending_c);
      upload_rows(S.zbuf, ne * S.ratio, sc.pending_z);
    }
  }
}

std::vector<LayerCapture> Engine::take_captures() {
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
      // rows of [k scores, left-out score] (select_topk); the k-th is the last chosen one
      lc.has_scores = true;
      lc.topk_scores.resize(P, K_);
      lc.kth_score.assign(size_t(P), std::numeric_limits<double>::quiet_NaN());
      lc.left_out_score.resize(size_t(P));
      for (int64_t i = 0; i < P; ++i) {
        const float* row = hc.topk_scores.data() + i * (K_ + 1);
        for (int64_t x = 0; x < K_; ++x) {
          lc.topk_scores(i, x) = double(row[x]);
          if (lc.topk(i, x) >= 0) lc.kth_score[size_t(i)] = double(row[x]);
        }
        lc.left_out_score[size_t(i)] = double(row[K_]);
      }
    }
    out.push_back(std::move(lc));
  }
  return out;
}

void Engine::append_tokens(int64_t l, int64_t a, const float* xhat, int64_t b, int64_t write_from) {
  SourceState& S = sources_[size_t(l)];
  const DevLayer& lw = w_.layers[size_t(l)];
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
void Engine::finish_entries(SourceState& S, const DevLayer& lw, int64_t j0, int64_t nj) {
  float* E = S.entries.get() + j0 * hd_;
  float* IK = S.keys.get() + j0 * dI_;
  cuda::rmsnorm_rows(E, hd_, lw.comp_norm.get(), E, hd_, nj, hd_, eps_);
  proj_(E, hd_, nj, lw.idx_wk, IK, dI_);
  cuda::rmsnorm_rows(IK, dI_, lw.idx_knorm.get(), IK, dI_, nj, dI_, eps_);
  cuda::rope_rows(IK, dI_, nj, 1, dI_, rd_, j0 * S.ratio, S.ratio, cos_.get(), sin_.get(), false);
  cuda::rope_rows(E, hd_, nj, 1, hd_, rd_, j0 * S.ratio, S.ratio, cos_.get(), sin_.get(), false);
}

void Engine::select(int64_t l, int64_t a, const float* xhat, const float* q_lat, int64_t b) {
  const LayerPlan& lp = plan_[l];
  const DevLayer& lw = w_.layers[size_t(l)];
  const SourceState& S = sources_[size_t(lp.kv_src)];
  const int64_t n = b - a, r = lp.ratio;
  // iq = RoPE per index head (q_lat idx_wq)        [n, HI·dI]
  proj_(q_lat, qr_, n, lw.idx_wq, iq_.get(), HI_ * dI_);
  cuda::rope_rows(iq_.get(), HI_ * dI_, n, HI_, dI_, rd_, a, 1, cos_.get(), sin_.get(), false);
  // w = (x̂ idx_wweights) · (dI·HI)^−1/2            [n, HI]
  proj_(xhat, d_, n, lw.idx_wweights, iw_.get(), HI_);
  cuda::scale_inplace(iw_.get(), n * HI_, iw_scale_);
  int32_t* pool = pool_.get();
  for (int64_t c0 = 0; c0 < n; c0 += chunk_) {
    const int64_t nq = std::min(chunk_, n - c0), p0 = a + c0;
    cuda::index_scores(iq_.get() + c0 * HI_ * dI_, iw_.get() + c0 * HI_, nq, p0, S.keys.get(), r, HI_, dI_,
                       scores_.get(), ld_s_);
    if (lp.candidate_source)
      cuda::candidate_pool(scores_.get(), ld_s_, nq, p0, r, bs_, ctb_, bscores_.get(), ld_b_, pool);
    cuda::select_topk(scores_.get(), ld_s_, nq, p0, r, K_, lp.selects_in_pool ? pool : nullptr, bs_, ctb_,
                      topk_[size_t(l)].get(), topk_scores_[size_t(l)].get());
  }
}

void Engine::attend(int64_t l, int64_t a, const float* q, float* heads_out, int64_t b) {
  const LayerPlan& lp = plan_[l];
  const float* entries = nullptr;
  const int32_t* sel = nullptr;
  if (lp.ratio > 0) {
    entries = sources_[size_t(lp.kv_src)].entries.get();
    sel = topk_[size_t(lp.idx_src)].get();
  }
  cuda::attention(q, b - a, a, first_[size_t(l)], W_, local_[size_t(l)].get(), entries, sel, K_,
                  w_.layers[size_t(l)].attn_sink.get(), H_, hd_, rd_, cos_.get(), sin_.get(), scale_, heads_out);
}

// X += Σ_chosen weight_e SwiGLU_e(f̂) + Σ_shared SwiGLU_s(f̂).
// Routed experts run densely over all n rows; a row adds only its chosen ones.
void Engine::ffn(int64_t l, float* Xa, int64_t n) {
  const DevLayer& lw = w_.layers[size_t(l)];
  cuda::rmsnorm_rows(Xa, d_, lw.ffn_norm.get(), fhat_.get(), d_, n, d_, eps_);
  acc_.zero(n * d_);
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

void Engine::swiglu(const DevExpert& ex, int64_t n) {
  proj_(fhat_.get(), d_, n, ex.w1, h1_.get(), moe_);
  proj_(fhat_.get(), d_, n, ex.w3, h3_.get(), moe_);
  cuda::swiglu_inplace(h1_.get(), h3_.get(), n * moe_);
  proj_(h1_.get(), moe_, n, ex.w2, y_.get(), d_);
}

void Engine::capture(int64_t l, int64_t a, int64_t b) {
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
    std::vector<float> ss(size_t(n * (K_ + 1)));
    topk_scores_[size_t(lp.idx_src)].download(ss.data(), n * (K_ + 1), a * (K_ + 1));
    hc.topk_scores.insert(hc.topk_scores.end(), ss.begin(), ss.end());
  }
}

MatD Engine::download_rows(const DeviceBuffer<float>& buf, int64_t row0, int64_t rows, int64_t cols) {
  std::vector<float> h(size_t(rows * cols));
  buf.download(h.data(), rows * cols, row0 * cols);
  MatD m(rows, cols);
  for (int64_t i = 0; i < rows * cols; ++i) m.data()[i] = h[size_t(i)];
  return m;
}

void Engine::upload_rows(DeviceBuffer<float>& buf, int64_t row0, const MatD& m) {
  std::vector<float> h(size_t(m.size()));
  for (int64_t i = 0; i < m.size(); ++i) h[size_t(i)] = static_cast<float>(m.data()[i]);
  buf.upload(h.data(), m.size(), row0 * m.cols());
}

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
