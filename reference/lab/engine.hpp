#pragma once
// The reference model's layer engine (docs/spec.md §3) and its caches (docs/spec.md §5, §6).
// A layer is evaluated over a contiguous run of positions given their input
// rows; every mode of §4–§6 is a sequence of such calls (reference/lab/forward.cpp).
#include <cstdint>
#include <vector>

#include "model/run.hpp"
#include "models/lab/weights.hpp"

namespace ced::ref {

// Rows of `cols` values for the contiguous positions first .. first+count-1.
template <class T>
struct RowStore {
  int64_t cols = 0;
  int64_t first = -1;
  std::vector<T> data;
  int64_t count() const { return cols ? int64_t(data.size()) / cols : 0; }
  int64_t end() const { return first + count(); }
  const T* row(int64_t pos) const { return data.data() + (pos - first) * cols; }
  void append(int64_t pos, const T* v) {
    if (first < 0) first = pos;
    data.insert(data.end(), v, v + cols);
  }
};

template <class T>
struct LayerState {
  RowStore<T> local;                            // local (SWA) entries k_p  [*, head_dim]
  // S_l(p), p from local.first, with the scores behind them; empty on a Reuse
  // layer, which reads its idx_src's (Engine::selecting).
  std::vector<std::vector<int64_t>> selection;  // S_l(p)
  std::vector<std::vector<T>> selection_scores; // I(p, j) of each j in S_l(p)
  std::vector<T> left_out_score;                // best eligible entry not in S_l(p) (NaN: none)
  std::vector<std::vector<int64_t>> pool;       // candidate source: pool blocks of p
  LayerCapture capture;                         // when capturing
};

// A kv source's compressor (docs/spec.md §3.3): global entries, index keys and the
// rows of the incomplete block.
template <class T>
struct SourceState {
  int64_t n_tokens = 0;        // tokens consumed: positions 0 .. n_tokens-1
  RowStore<T> entries;         // g_j  [*, head_dim]
  RowStore<T> index_keys;      // ik_j [*, index_head_dim]
  std::vector<T> pending_c, pending_z;  // [n_pending * head_dim]
};

template <class T>
class Engine {
 public:
  // fault_layer >= 0 confines a per-layer fault to that layer.
  Engine(const Config& c, const Plan& p, const Weights<T>& w, Fault fault, bool poison, bool capture,
         FlopCount* flops, int64_t fault_layer = -1);

  // Layer l over positions a .. a+X.rows()-1 (contiguous with what it already
  // evaluated). X [n, d] is updated in place. xhat_E [n, d] is layer E's
  // normalised input at the same positions; decoder kv sources read it.
  void layer(int64_t l, int64_t a, Mat<T>& X, const Mat<T>* xhat_E);

  // docs/spec.md §4 step 2: the compressor and index keys of every decoder kv source
  // over x̂_E rows of positions a.. (positions already consumed are skipped).
  void source_only_write(int64_t a, const Mat<T>& xhat_E);

  // x̂ = RMSNorm(X) ⊙ layers.l.attn_norm.
  Mat<T> normalised_input(int64_t l, const Mat<T>& X) const;

  // logits = (RMSNorm(X) ⊙ final_norm) lm_head, [n, V].
  Mat<T> logits(const Mat<T>& X);

  // The dependency probe (RunRequest::poison_truncated) of the positions
  // evaluated from now on. A replay session (reference/lab/replays.hpp) sets it on
  // each copy of its shared engine: the probe acts only where a window is
  // truncated (lo(p) > max(0, p - span)), and a ced prefill's encoder starts at
  // position 0, so none of its windows is, and the shared part is the same
  // with the probe on or off.
  void set_poison(bool on) { poison_ = on; }

  PersistedCache export_cache(const std::string& dtype) const;
  void import_cache(const PersistedCache& cache);

  std::vector<LayerState<T>> layers;
  std::vector<SourceState<T>> sources;  // indexed by layer; used for Full layers

 private:
  void append_tokens(int64_t l, int64_t a, const Mat<T>& xhat);
  void select(int64_t l, int64_t a, const Mat<T>& xhat, const Mat<T>& q_lat);
  void attend(int64_t l, int64_t a, const Mat<T>& q, Mat<T>& heads_out);
  void ffn(int64_t l, Mat<T>& X);
  int64_t visible(int64_t l, int64_t p, int64_t r, int64_t n_entries) const;
  // The layer state holding layer l's selections: idx_src's for a Reuse layer
  // (docs/spec.md §3.4: it reuses S_idx_src(p) unchanged), l's own otherwise.
  const LayerState<T>& selecting(int64_t l) const;
  bool faulted(Fault f, int64_t l) const { return fault_ == f && (fault_layer_ < 0 || l == fault_layer_); }
  void count(int64_t l, int kind, int64_t flops);

  const Config& c_;
  const Plan& p_;
  const Weights<T>& w_;
  Fault fault_;
  int64_t fault_layer_;
  bool poison_;
  bool capture_;
  FlopCount* flops_;
  T eps_;
};

extern template class Engine<float>;
extern template class Engine<double>;

}  // namespace ced::ref
