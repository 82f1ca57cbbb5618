// docs/spec.md §3: one layer of the reference model.
#include "reference/lab/engine.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "model/error.hpp"
#include "reference/lab/ops.hpp"

namespace ced::ref {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();  // a score that does not exist

// Positions per block of attention's local logits and of index scoring: a
// block's queries meet the entries they share in one ordered product
// (attend(), select()). 16 keeps a block's logits (16·H rows of up to 16 + W
// entries) in L2.
constexpr int64_t kPositionBlock = 16;

// Per-thread buffers of one block of positions (attention or index scoring)
// and of one position inside it: entries gathered as rows and as columns,
// logits. Kept across calls, since fresh ones would be allocated, zeroed and
// page-faulted each time.
template <class T>
struct PositionScratch {
  std::vector<T> block_keys_t, block_logits;  // a block's entries as columns, its queries' logits
  std::vector<T> queries;                     // a block's roped index queries
  std::vector<T> values, keys_t, logits;      // one position's
};
template <class T>
PositionScratch<T>& scratch() {
  thread_local PositionScratch<T> s;
  return s;
}

}  // namespace

template <class T>
Engine<T>::Engine(const Config& c, const Plan& p, const Weights<T>& w, Fault fault, bool poison, bool capture,
                  FlopCount* flops, int64_t fault_layer)
    : c_(c), p_(p), w_(w), fault_(fault), fault_layer_(fault_layer), poison_(poison), capture_(capture), flops_(flops), eps_(T(c.rms_eps)) {
  layers.resize(size_t(p.L));
  sources.resize(size_t(p.L));
  for (int64_t l = 0; l < p.L; ++l) {
    layers[size_t(l)].local.cols = c.head_dim;
    layers[size_t(l)].capture.layer = l;
    layers[size_t(l)].capture.has_topk = p[l].ratio > 0;
    sources[size_t(l)].entries.cols = c.head_dim;
    sources[size_t(l)].index_keys.cols = c.index_head_dim;
  }
}

template <class T>
const LayerState<T>& Engine<T>::selecting(int64_t l) const {
  const LayerPlan& lp = p_[l];
  if (lp.role == Role::Reuse && !faulted(Fault::ReuseOwnSelection, l)) return layers[size_t(lp.idx_src)];
  return layers[size_t(l)];
}

template <class T>
void Engine<T>::count(int64_t l, int kind, int64_t flops) {
  if (flops_) flops_->add(l, kind, flops);
}

template <class T>
Mat<T> Engine<T>::normalised_input(int64_t l, const Mat<T>& X) const {
  return rmsnorm_rows(X, w_.layers[size_t(l)].attn_norm, eps_);
}

// docs/spec.md §3.3 visibility, capped by what exists (a decode step has only the
// entries completed so far).
template <class T>
int64_t Engine<T>::visible(int64_t l, int64_t p, int64_t r, int64_t n_entries) const {
  const int64_t ahead = faulted(Fault::CompressorBlockShifted, l) ? 1 : 0;
  return std::min(n_entries, n_visible(p + ahead, r));
}

// docs/spec.md §3.3: the compressor of kv source l consumes the rows of positions
// a.. that it has not consumed yet (a resume replay only reads, §6).
template <class T>
void Engine<T>::append_tokens(int64_t l, int64_t a, const Mat<T>& xhat) {
  const auto& lw = w_.layers[size_t(l)];
  auto& src = sources[size_t(l)];
  const int64_t r = p_[l].ratio, hd = c_.head_dim, ihd = c_.index_head_dim;
  const int64_t skip = std::max<int64_t>(0, src.n_tokens - a);
  const int64_t n = xhat.rows() - skip;
  if (n <= 0) return;
  if (a + skip != src.n_tokens)
    throw std::logic_error(fmt::format("layer {}: compressor gap at position {}", l, a + skip));
  const Mat<T> rows = xhat.bottomRows(n);
  const Mat<T> cw = matmul(rows, lw.comp_wkv);
  Mat<T> zw;
  if (r >= 2) zw = matmul(rows, lw.comp_wgate);
  count(l, kFlopCompressor, 2 * n * c_.d_model * hd * (r >= 2 ? 2 : 1));
  std::vector<T> lat(static_cast<size_t>(hd)), raw(static_cast<size_t>(hd)), ik(static_cast<size_t>(ihd)), ikraw(static_cast<size_t>(ihd));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = src.n_tokens;
    bool complete = true;
    if (r == 1) {
      std::copy(cw.row(i).data(), cw.row(i).data() + hd, raw.begin());
    } else {
      src.pending_c.insert(src.pending_c.end(), cw.row(i).data(), cw.row(i).data() + hd);
      src.pending_z.insert(src.pending_z.end(), zw.row(i).data(), zw.row(i).data() + hd);
      complete = int64_t(src.pending_c.size()) == r * hd;
      if (complete) compress_block(src.pending_c.data(), src.pending_z.data(), r, hd, raw.data());
    }
    src.n_tokens = t + 1;
    if (!complete) continue;
    const int64_t j = t / r, pos = j * r;
    rmsnorm(raw.data(), lw.comp_norm.data(), hd, eps_, lat.data());
    matmul_rows(lat.data(), 1, hd, lw.idx_wk.data(), ihd, ikraw.data());
    rmsnorm(ikraw.data(), lw.idx_knorm.data(), ihd, eps_, ik.data());
    rope(ik.data(), ihd, c_.rope_dim, c_.rope_theta, pos);
    rope(lat.data(), hd, c_.rope_dim, c_.rope_theta, pos);
    src.entries.append(j, lat.data());
    src.index_keys.append(j, ik.data());
    src.pending_c.clear();
    src.pending_z.clear();
    count(l, kFlopIndexKeys, 2 * hd * ihd);
  }
}

template <class T>
void Engine<T>::source_only_write(int64_t a, const Mat<T>& xhat_E) {
  for (int64_t l : p_.decoder_kv_sources) append_tokens(l, a, xhat_E);
}

// docs/spec.md §3.4: selections of the positions a.. at layer l.
template <class T>
void Engine<T>::select(int64_t l, int64_t a, const Mat<T>& xhat, const Mat<T>& q_lat) {
  const LayerPlan& lp = p_[l];
  auto& ls = layers[size_t(l)];
  const int64_t n = xhat.rows();
  const bool reuse_fault = lp.role == Role::Reuse && faulted(Fault::ReuseOwnSelection, l);
  // A Reuse layer reads idx_src's selections in place (selecting()).
  if (&selecting(l) != &ls) return;
  const int64_t base = int64_t(ls.selection.size());
  ls.selection.resize(size_t(base + n));
  ls.selection_scores.resize(size_t(base + n));
  ls.left_out_score.resize(size_t(base + n));
  // Reindex, Full, or the reuse-own-selection fault (which borrows idx_src's indexer weights).
  const auto& iw = w_.layers[size_t(reuse_fault ? lp.idx_src : l)];
  const int64_t ih = c_.index_n_heads, ihd = c_.index_head_dim;
  const Mat<T> iq_all = matmul(q_lat, iw.idx_wq);          // [n, ih*ihd]
  const Mat<T> wraw = matmul(xhat, iw.idx_wweights);       // [n, ih]
  const T wscale = T(1.0 / std::sqrt(double(ihd * ih)));
  const auto& src = sources[size_t(lp.kv_src)];
  const int64_t r = lp.ratio;
  const bool tie_rev = faulted(Fault::TieBreakReversed, l);
  const bool in_pool = lp.selects_in_pool && !lp.candidate_source;
  if (lp.candidate_source) ls.pool.resize(size_t(base + n));
  const LayerState<T>* cand = p_.candidate_source >= 0 ? &layers[size_t(p_.candidate_source)] : nullptr;
  std::vector<int64_t> n_scored(static_cast<size_t>(n));
  const int64_t n_blocks = (n + kPositionBlock - 1) / kPositionBlock;
#pragma omp parallel for schedule(dynamic, 1) if (n >= 2 * kPositionBlock)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t i0 = b * kPositionBlock, i1 = std::min(n, i0 + kPositionBlock), bn = i1 - i0;
    auto& tmp = scratch<T>();
    // The block's index queries, roped at their positions: [bn * ih, ihd].
    tmp.queries.resize(size_t(bn * ih * ihd));
    for (int64_t i = i0; i < i1; ++i) {
      T* iq = tmp.queries.data() + (i - i0) * ih * ihd;
      std::copy(iq_all.row(i).data(), iq_all.row(i).data() + ih * ihd, iq);
      rope_heads(iq, ih, ihd, c_.rope_dim, c_.rope_theta, a + i);
    }
    // The entries the block's last position sees (visibility grows with p)
    // as columns: every position's keys are a prefix or a subset of them.
    const int64_t nv_max = visible(l, a + i1 - 1, r, src.entries.count());
    std::vector<const T*> rows(static_cast<size_t>(nv_max));
    for (int64_t j = 0; j < nv_max; ++j) rows[size_t(j)] = src.index_keys.row(j);
    tmp.block_keys_t.resize(size_t(ihd * nv_max));
    gemm::transpose_rows(rows.data(), nv_max, ihd, tmp.block_keys_t.data(), nv_max);
    // index_score of every entry (docs/spec.md §3.4): the dot products of all
    // heads with all keys are ordered products, D[h, e] = iq_h · ik_e with
    // each sum over the key's channels ascending from 0, as dot() sums; then
    // each entry's score sums its heads, h ascending. Outside the candidate
    // pool every position scores a prefix of the block's entries, so the
    // block's queries meet them in one product (the entries only later
    // positions see are computed and not read).
    if (!in_pool && nv_max > 0) {
      tmp.block_logits.resize(size_t(bn * ih * nv_max));
      gemm::gemm(tmp.queries.data(), bn * ih, ihd, tmp.block_keys_t.data(), nv_max, tmp.block_logits.data(), false);
    }
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t p = a + i;
      std::vector<T> w(static_cast<size_t>(ih));
      for (int64_t h = 0; h < ih; ++h) w[size_t(h)] = wraw(i, h) * wscale;
      const int64_t nv = visible(l, p, r, src.entries.count());
      std::vector<int64_t> ids;
      const T* d_rows = nullptr;  // D [ih, n_ids], row stride ld_d
      int64_t ld_d = 0;
      if (in_pool) {
        // The pool's blocks of entries, each a run of consecutive columns.
        const auto& pool = cand->pool[size_t(p - cand->local.first)];
        const int64_t bs = c_.candidate_block_size;
        for (int64_t pb : pool)
          for (int64_t j = pb * bs; j < std::min(nv, (pb + 1) * bs); ++j) ids.push_back(j);
        const int64_t n_ids = int64_t(ids.size());
        tmp.keys_t.resize(size_t(ihd * n_ids));
        for (int64_t x = 0; x < ihd; ++x) {
          const T* from = tmp.block_keys_t.data() + x * nv_max;
          T* to = tmp.keys_t.data() + x * n_ids;
          int64_t e = 0;
          for (int64_t pb : pool) {
            const int64_t j0 = pb * bs, j1 = std::min(nv, (pb + 1) * bs);
            if (j1 > j0) std::copy(from + j0, from + j1, to + e);
            e += std::max<int64_t>(0, j1 - j0);
          }
        }
        tmp.logits.resize(size_t(ih * n_ids));
        gemm::gemm(tmp.queries.data() + (i - i0) * ih * ihd, ih, ihd, tmp.keys_t.data(), n_ids, tmp.logits.data(),
                   false);
        d_rows = tmp.logits.data();
        ld_d = n_ids;
      } else {
        ids.resize(size_t(nv));
        for (int64_t j = 0; j < nv; ++j) ids[size_t(j)] = j;
        d_rows = tmp.block_logits.data() + (i - i0) * ih * nv_max;
        ld_d = nv_max;
      }
      const int64_t n_ids = int64_t(ids.size());
      std::vector<T> scores(ids.size(), T(0));
      for (int64_t h = 0; h < ih; ++h) {
        const T* d = d_rows + h * ld_d;
        for (int64_t e = 0; e < n_ids; ++e) scores[size_t(e)] += w[size_t(h)] * (d[e] > T(0) ? d[e] : T(0));
      }
      n_scored[size_t(i)] = n_ids;
      ScoredTopk<T> chosen;
      if (lp.candidate_source) {
        auto pool = candidate_pool(scores, nv, c_.candidate_block_size, c_.candidate_topk_blocks,
                                   !faulted(Fault::PoolPinDropped, l), tie_rev);
        const int64_t bs = c_.candidate_block_size;
        std::vector<int64_t> pids;
        std::vector<T> pscores;
        for (int64_t pb : pool)
          for (int64_t j = pb * bs; j < std::min(nv, (pb + 1) * bs); ++j) {
            pids.push_back(j);
            pscores.push_back(scores[size_t(j)]);
          }
        chosen = topk_scored(pids, pscores, c_.index_topk, tie_rev);
        ls.pool[size_t(base + i)] = std::move(pool);
      } else {
        chosen = topk_scored(ids, scores, c_.index_topk, tie_rev);
      }
      ls.selection[size_t(base + i)] = std::move(chosen.ids);
      ls.selection_scores[size_t(base + i)] = std::move(chosen.scores);
      ls.left_out_score[size_t(base + i)] = chosen.left_out;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    count(l, kFlopIndexerQW, 2 * (c_.q_lora_rank * ih * ihd + c_.d_model * ih));
    count(l, kFlopIndexScoring, 2 * ih * ihd * n_scored[size_t(i)]);
  }
}

// docs/spec.md §3.5: attention of the positions a.. over the local window and the
// selected global entries, with the sink; heads_out [n, H*hd].
template <class T>
void Engine<T>::attend(int64_t l, int64_t a, const Mat<T>& q, Mat<T>& heads_out) {
  const LayerPlan& lp = p_[l];
  auto& ls = layers[size_t(l)];
  const auto& lw = w_.layers[size_t(l)];
  const int64_t n = q.rows(), H = c_.n_heads, hd = c_.head_dim, W = c_.window;
  const T scale = T(1.0 / std::sqrt(double(hd)));
  const int64_t span = faulted(Fault::WindowOffByOne, l) ? W : W - 1;
  const SourceState<T>* src = lp.ratio > 0 ? &sources[size_t(lp.kv_src)] : nullptr;
  const LayerState<T>& owner = selecting(l);
  heads_out.resize(n, H * hd);
  std::vector<int64_t> n_entries(static_cast<size_t>(n));
  const int64_t n_blocks = (n + kPositionBlock - 1) / kPositionBlock;
#pragma omp parallel for schedule(dynamic, 1) if (n >= 2 * kPositionBlock)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t i0 = b * kPositionBlock, i1 = std::min(n, i0 + kPositionBlock), bn = i1 - i0;
    auto& tmp = scratch<T>();
    // The local entries any position of the block reads, j0 .. a+i1-1, as
    // columns; the block's queries meet them in one ordered product,
    // block_logits[(i - i0)·H + h, j - j0] = q_h(a+i) · k_j, each sum over
    // the channels ascending from 0 (dot()'s order). The entries outside a
    // position's window are computed and not read.
    const int64_t j0 = std::max(ls.local.first, a + i0 - span), m_b = a + i1 - j0;
    std::vector<const T*> rows(static_cast<size_t>(m_b));
    for (int64_t j = 0; j < m_b; ++j) rows[size_t(j)] = ls.local.row(j0 + j);
    tmp.block_keys_t.resize(size_t(hd * m_b));
    gemm::transpose_rows(rows.data(), m_b, hd, tmp.block_keys_t.data(), m_b);
    tmp.block_logits.resize(size_t(bn * H * m_b));
    gemm::gemm(q.row(i0).data(), bn * H, hd, tmp.block_keys_t.data(), m_b, tmp.block_logits.data(), false);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t p = a + i;
      const int64_t lo_full = std::max<int64_t>(0, p - span);
      const int64_t lo = std::max(ls.local.first, lo_full);  // docs/spec.md §4/§5: lo(p)
      const std::vector<int64_t>* sel = src ? &owner.selection[size_t(p - owner.local.first)] : nullptr;
      const int64_t n_sel = sel ? int64_t(sel->size()) : 0, n_loc = p - lo + 1;
      n_entries[size_t(i)] = n_loc + n_sel;
      T* out = heads_out.row(i).data();
      if (poison_ && lo > lo_full) {
        // The truncated entries enter as NaN: every logit sum, hence every
        // head's output, is NaN. Same result as carrying the NaN entries through.
        std::fill(out, out + H * hd, std::numeric_limits<T>::quiet_NaN());
        continue;
      }
      // The entry list (docs/spec.md §3.5): local entries lo..p, then the
      // selection. logits [H, n_e]: each head's local logits from the block's
      // product, then its selection logits, one more ordered product over the
      // selected entries gathered as columns.
      const int64_t n_e = n_entries[size_t(i)];
      tmp.logits.resize(size_t(H * n_e));
      for (int64_t h = 0; h < H; ++h) {
        const T* from = tmp.block_logits.data() + ((i - i0) * H + h) * m_b + (lo - j0);
        std::copy(from, from + n_loc, tmp.logits.data() + h * n_e);
      }
      if (n_sel > 0) {
        std::vector<const T*> picked(static_cast<size_t>(n_sel));
        for (int64_t k = 0; k < n_sel; ++k) picked[size_t(k)] = src->entries.row((*sel)[size_t(k)]);
        tmp.keys_t.resize(size_t(hd * n_sel));
        gemm::transpose_rows(picked.data(), n_sel, hd, tmp.keys_t.data(), n_sel);
        tmp.values.resize(size_t(n_sel * hd));
        for (int64_t k = 0; k < n_sel; ++k) std::copy(picked[size_t(k)], picked[size_t(k)] + hd, tmp.values.data() + k * hd);
        gemm::gemm(gemm::Operands<T>{q.row(i).data(), hd, tmp.keys_t.data(), n_sel, tmp.logits.data() + n_loc, n_e, H,
                                     hd, n_sel, false},
                   false);
      }
      // Each head's softmax; then out[h, :] = Σ_e weight[h, e] · entry_e, e
      // ascending from 0, the order of the definition's loop over the entry
      // list: the local entries read in place (rows lo..p of the store), the
      // selected ones continuing the same sums.
      for (int64_t h = 0; h < H; ++h) {
        T* wts = tmp.logits.data() + h * n_e;
        for (int64_t e = 0; e < n_e; ++e) wts[e] = wts[e] * scale;
        softmax_with_sink(wts, n_e, lw.attn_sink[h], !faulted(Fault::SinkDropped, l));
      }
      gemm::gemm(gemm::Operands<T>{tmp.logits.data(), n_e, ls.local.row(lo), hd, out, hd, H, n_loc, hd, false}, false);
      if (n_sel > 0)
        gemm::gemm(gemm::Operands<T>{tmp.logits.data() + n_loc, n_e, tmp.values.data(), hd, out, hd, H, n_sel, hd, true},
                   false);
      if (!faulted(Fault::RopeInverseSkipped, l)) rope_heads(out, H, hd, c_.rope_dim, c_.rope_theta, p, -1);
    }
  }
  for (int64_t i = 0; i < n; ++i) count(l, kFlopAttention, 2 * 2 * H * hd * n_entries[size_t(i)]);
}

// docs/spec.md §3.7.
template <class T>
void Engine<T>::ffn(int64_t l, Mat<T>& X) {
  const auto& lw = w_.layers[size_t(l)];
  const int64_t n = X.rows(), d = c_.d_model, m = c_.moe_dim;
  const Mat<T> f = rmsnorm_rows(X, lw.ffn_norm, eps_);
  Mat<T> out = Mat<T>::Zero(n, d);
  // weight_e of each row for each expert (0 = not chosen)
  const int64_t ne = c_.n_routed_experts;
  Mat<T> gate = Mat<T>::Zero(n, std::max<int64_t>(ne, 1));
  std::vector<char> chosen(static_cast<size_t>(n * std::max<int64_t>(ne, 1)), 0);
  if (ne > 0) {
    const Mat<T> logits = matmul(f, lw.router);
#pragma omp parallel for schedule(static) if (n * ne >= kParallelElements / 8)
    for (int64_t i = 0; i < n; ++i) {
      std::vector<T> s(static_cast<size_t>(ne));
      for (int64_t e = 0; e < ne; ++e) s[size_t(e)] = router_score(logits(i, e));
      const auto pick = route(s.data(), lw.router_bias.data(), ne, c_.n_active_experts);
      T sum = 0;
      for (int64_t e : pick) sum += s[size_t(e)];
      for (int64_t e : pick) {
        gate(i, e) = (s[size_t(e)] / sum) * T(c_.routed_scaling_factor);
        chosen[size_t(i * ne + e)] = 1;
      }
    }
    count(l, kFlopRouter, 2 * n * d * ne);
  }
  // SwiGLU of rows x [nr, d] through one expert into y's first nr rows. The
  // buffers are sized for every row and shared by the experts: temporaries
  // whose size changes with each expert and layer fragment the heap, and each
  // fresh piece of it is page-faulted and zeroed by the kernel.
  Mat<T> v(n, d), h1(n, m), h3(n, m), y(n, d);
  auto swiglu = [&](const ExpertWeights<T>& ex, const T* x, int64_t nr) {
    const bool thread_dep = faulted(Fault::ThreadDependentReduction, l);
    matmul_rows(x, nr, d, ex.w1.data(), m, h1.data(), thread_dep);
    matmul_rows(x, nr, d, ex.w3.data(), m, h3.data(), thread_dep);
    const int64_t size = nr * m;
#pragma omp parallel for schedule(static) if (size >= kParallelElements)
    for (int64_t i = 0; i < size; ++i) h1.data()[i] = silu(h1.data()[i]) * h3.data()[i];
    matmul_rows(h1.data(), nr, m, ex.w2.data(), d, y.data(), thread_dep);
  };
  // Rows are gathered so each expert runs one product per matrix, which leaves
  // every row's arithmetic unchanged.
  for (int64_t e = 0; e < ne; ++e) {
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < n; ++i)
      if (chosen[size_t(i * ne + e)]) rows.push_back(i);
    if (rows.empty()) continue;
    const int64_t nr = int64_t(rows.size());
    const bool par = nr * d >= kParallelElements;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < nr; ++r) std::copy(f.row(rows[size_t(r)]).data(), f.row(rows[size_t(r)]).data() + d, v.row(r).data());
    swiglu(lw.experts[size_t(e)], v.data(), nr);
    // The rows are distinct: each out row gets one addition per element from this expert.
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t i = rows[size_t(r)];
      const T g = gate(i, e);
      T* __restrict to = out.row(i).data();  // out and y: two matrices
      const T* __restrict from = y.row(r).data();
      for (int64_t x = 0; x < d; ++x) to[x] += g * from[x];
    }
  }
  for (const auto& ex : lw.shared) {
    swiglu(ex, f.data(), n);
    add_into(out, y);
  }
  const int64_t per_row = (ne > 0 ? c_.n_active_experts : 0) + c_.n_shared_experts;
  count(l, kFlopExperts, 2 * 3 * n * d * m * per_row);
  if (faulted(Fault::FfnOutputScaled, l)) out *= T(1 + 1.0 / 1024);
  add_into(X, out);
}

template <class T>
void Engine<T>::layer(int64_t l, int64_t a, Mat<T>& X, const Mat<T>* xhat_E) {
  const LayerPlan& lp = p_[l];
  auto& ls = layers[size_t(l)];
  const auto& lw = w_.layers[size_t(l)];
  const int64_t n = X.rows(), H = c_.n_heads, hd = c_.head_dim, d = c_.d_model;
  if (ls.local.first >= 0 && a != ls.local.end())
    throw std::logic_error(fmt::format("layer {}: positions must continue at {} (got {})", l, ls.local.end(), a));
  const Mat<T> xhat = normalised_input(l, X);
  if (lp.role == Role::Full) append_tokens(l, a, lp.reads_xhat_E ? *xhat_E : xhat);
  // 1. query
  const Mat<T> q_lat = rmsnorm_rows(matmul(xhat, lw.wq_a), lw.q_norm, eps_);
  Mat<T> q = matmul(q_lat, lw.wq_b);
#pragma omp parallel for schedule(static) if (q.size() >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) rope_heads(q.row(i).data(), H, hd, c_.rope_dim, c_.rope_theta, a + i);
  count(l, kFlopQuery, 2 * n * (d * c_.q_lora_rank + c_.q_lora_rank * H * hd));
  // 2. local entries
  Mat<T> k = rmsnorm_rows(matmul(xhat, lw.wkv), lw.kv_norm, eps_);
#pragma omp parallel for schedule(static) if (k.size() >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) rope(k.row(i).data(), hd, c_.rope_dim, c_.rope_theta, a + i);
  for (int64_t i = 0; i < n; ++i) ls.local.append(a + i, k.row(i).data());
  count(l, kFlopLocalEntry, 2 * n * d * hd);
  // 4. selection
  if (lp.ratio > 0) select(l, a, xhat, q_lat);
  // 5. attention
  Mat<T> heads;
  attend(l, a, q, heads);
  // 6. grouped output projection
  const int64_t G = c_.o_groups, per_group = (H / G) * hd, R = c_.o_lora_rank;
  Mat<T> u(n, G * R);
  for (int64_t g = 0; g < G; ++g)
    matmul_block(heads.data() + g * per_group, H * hd, n, lw.wo_a[size_t(g)], u.data() + g * R, G * R);
  add_into(X, matmul(u, lw.wo_b));
  count(l, kFlopOutput, 2 * n * (H * hd * R + G * R * d));
  // 7. FFN
  ffn(l, X);
  if (capture_) {
    auto& cap = ls.capture;
    const int64_t k_top = c_.index_topk;
    const int64_t old = int64_t(cap.positions.size());
    cap.out.conservativeResize(old + n, d);
    for (int64_t i = 0; i < n; ++i) {
      cap.positions.push_back(a + i);
      for (int64_t x = 0; x < d; ++x) cap.out(old + i, x) = double(X(i, x));
    }
    if (cap.has_topk) {
      cap.has_scores = true;
      cap.topk.conservativeResize(old + n, k_top);
      cap.topk_scores.conservativeResize(old + n, k_top);
      const LayerState<T>& owner = selecting(l);
      for (int64_t i = 0; i < n; ++i) {
        const size_t at = size_t(a + i - owner.local.first);
        const auto& s = owner.selection[at];
        const auto& sc = owner.selection_scores[at];
        for (int64_t x = 0; x < k_top; ++x) {
          const bool has = x < int64_t(s.size());
          cap.topk(old + i, x) = has ? s[size_t(x)] : -1;
          cap.topk_scores(old + i, x) = has ? double(sc[size_t(x)]) : kNaN;
        }
        cap.kth_score.push_back(sc.empty() ? kNaN : double(sc.back()));
        cap.left_out_score.push_back(double(owner.left_out_score[at]));
      }
    }
  }
}

template <class T>
Mat<T> Engine<T>::logits(const Mat<T>& X) {
  const Mat<T> f = rmsnorm_rows(X, w_.final_norm, eps_);
  count(p_.L, kFlopLmHead, 2 * X.rows() * c_.d_model * c_.vocab_size);
  return matmul(f, w_.lm_head);
}

template <class T>
PersistedCache Engine<T>::export_cache(const std::string& dtype) const {
  PersistedCache pc;
  pc.dtype = dtype;
  auto to_mat = [](const RowStore<T>& rs) {
    MatD m(rs.count(), rs.cols);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = double(rs.data[size_t(i)]);
    return m;
  };
  auto to_rows = [&](const std::vector<T>& v) {
    MatD m(int64_t(v.size()) / c_.head_dim, c_.head_dim);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = double(v[size_t(i)]);
    return m;
  };
  for (int64_t l : p_.kv_sources) {
    const auto& s = sources[size_t(l)];
    SourceCache sc;
    sc.layer = l;
    sc.ratio = p_[l].ratio;
    sc.n_tokens = s.n_tokens;
    sc.entries = to_mat(s.entries);
    sc.index_keys = to_mat(s.index_keys);
    sc.pending_c = to_rows(s.pending_c);
    sc.pending_z = to_rows(s.pending_z);
    pc.prefix_len = s.n_tokens;
    pc.sources.push_back(std::move(sc));
  }
  return pc;
}

template <class T>
void Engine<T>::import_cache(const PersistedCache& pc) {
  for (const auto& sc : pc.sources) {
    if (sc.layer < 0 || sc.layer >= p_.L || p_[sc.layer].role != Role::Full || p_[sc.layer].ratio != sc.ratio)
      throw InputError(fmt::format("cache: layer {} is not a kv source of ratio {} in this config", sc.layer, sc.ratio));
    if (sc.entries.cols() != c_.head_dim || sc.index_keys.cols() != c_.index_head_dim ||
        sc.entries.rows() != sc.index_keys.rows() || sc.entries.rows() != sc.n_tokens / sc.ratio ||
        sc.pending_c.rows() != sc.n_tokens % sc.ratio || sc.pending_z.rows() != sc.pending_c.rows())
      throw InputError(fmt::format("cache: layer {}: shapes do not match the config and n_tokens = {}", sc.layer,
                                   sc.n_tokens));
    auto& s = sources[size_t(sc.layer)];
    s = SourceState<T>{};
    s.entries.cols = c_.head_dim;
    s.index_keys.cols = c_.index_head_dim;
    s.n_tokens = sc.n_tokens;
    // Row-major MatD -> T, element by element (the cache holds T's values exactly).
    auto to_t = [](const MatD& m) { return std::vector<T>(m.data(), m.data() + m.size()); };
    s.entries.data = to_t(sc.entries);
    s.entries.first = sc.entries.rows() ? 0 : -1;
    s.index_keys.data = to_t(sc.index_keys);
    s.index_keys.first = s.entries.first;
    s.pending_c = to_t(sc.pending_c);
    s.pending_z = to_t(sc.pending_z);
  }
  if (int64_t(pc.sources.size()) != int64_t(p_.kv_sources.size()))
    throw InputError(fmt::format("cache: {} kv sources, the config has {}", pc.sources.size(), p_.kv_sources.size()));
}

template class Engine<float>;
template class Engine<double>;

}  // namespace ced::ref
