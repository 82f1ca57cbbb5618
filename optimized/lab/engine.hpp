#pragma once
// The optimized model's layer engine (docs/spec.md §3) and its caches (docs/spec.md §5, §6):
// the device twin of reference/lab/engine.hpp, with the same steps under the same
// names and argument order (layer, append_tokens, source_only_write,
// normalised_input, select, attend, ffn, logits, export_cache, import_cache).
// Every mode of §4–§6 is a sequence of these calls (optimized/lab/forward.cpp).
//
// Layout: every activation is row-major with one row per position. Buffers
// that live for the whole run (hidden states X, local entries, global entries,
// compressor rows, selections, pools) are indexed by absolute position
// ("abs rows"); scratch buffers by the row inside the evaluated range [a, b).
// Unlike the reference, the hidden states live in the engine (X_, abs rows),
// so a step names its positions [a, b) instead of taking their rows.
#include <cstdint>
#include <string>
#include <vector>

#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"
#include "model/run.hpp"
#include "optimized/lab/device_buffer.hpp"
#include "optimized/lab/device_weights.hpp"
#include "optimized/lab/projector.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {

// A kv source's compressor (docs/spec.md §3.3): global entries, index keys and the
// per-token compressor rows.
struct SourceState {
  int64_t layer = -1, ratio = 0, cap = 0;  // cap: entries the run can complete (Ntot / r)
  DeviceBuffer<float> entries;             // [cap, head_dim]  g_j (roped)
  DeviceBuffer<float> keys;                // [cap, index_head_dim]  ik_j (roped)
  DeviceBuffer<float> cbuf, zbuf;          // [Ntot, head_dim]  c_t, z_t per token (r >= 2)
};

struct HostCapture {
  std::vector<int64_t> positions;
  std::vector<double> out;    // [P_l, d]
  std::vector<int64_t> topk;  // [P_l, index_topk]
  std::vector<float> topk_scores;  // [P_l, index_topk + 1]: chosen entries' scores, then the best left out
};

class Engine {
 public:
  // tokens: every token of the run (prompt and decode); capture: keep each
  // layer's outputs and selections (docs/spec.md §9).
  Engine(const Config& c, const Plan& plan, const DevWeights& w, Projector& proj, const std::vector<int32_t>& tokens,
         bool capture);

  // The first position layer l is evaluated at: its window never starts earlier (docs/spec.md §4–§6).
  void set_first(int64_t l, int64_t pos);

  // X_0 = embed[tokens] at positions [a, b).
  void embed(int64_t a, int64_t b);

  // docs/spec.md §3: layer l at positions [a, b). Global entries of a Full encoder
  // layer are written only at positions >= write_from (docs/spec.md §6: cached below P).
  void layer(int64_t l, int64_t a, int64_t b, int64_t write_from);

  // docs/spec.md §4 step 2: every decoder kv source's entries and index keys from
  // x̂_E rows of positions [a, b) (>= write_from).
  void source_only_write(int64_t a, const float* xhat_E, int64_t b, int64_t write_from);

  // x̂ = RMSNorm(X) ⊙ layers.l.attn_norm at positions [a, b), into the
  // scratch rows it returns ([b − a, d], valid until the next step).
  const float* normalised_input(int64_t l, int64_t a, int64_t b);

  // logits = (RMSNorm(X_L) ⊙ final_norm) lm_head at positions [a, b) into out rows row0 ...
  void logits(int64_t a, int64_t b, MatD& out, int64_t row0);

  // docs/spec.md §6: the persisted cache of the first P tokens (all of them written).
  PersistedCache export_cache(const std::string& dtype, int64_t P) const;
  // docs/spec.md §6: global entries, index keys and pending compressor rows of a
  // persisted cache (already checked against the config: models/lab/schedule.hpp).
  void import_cache(const PersistedCache& cache);

  std::vector<LayerCapture> take_captures();

 private:
  static constexpr int64_t kScoreBudget = int64_t(1) << 25;  // floats of index scores per chunk (128 MiB)
  static constexpr int64_t kLogitRows = 256;                 // lm_head rows per product

  // docs/spec.md §3.3: the global entries and index keys of kv source l from x̂ rows
  // of positions [a, b) (xhat [b − a, d]), at positions >= write_from.
  void append_tokens(int64_t l, int64_t a, const float* xhat, int64_t b, int64_t write_from);
  // Entries j0 .. j0+nj−1 from their pre-norm latents (append_tokens).
  void finish_entries(SourceState& S, const DevLayer& lw, int64_t j0, int64_t nj);
  // docs/spec.md §3.4 at index source l, positions [a, b).
  void select(int64_t l, int64_t a, const float* xhat, const float* q_lat, int64_t b);
  // docs/spec.md §3.5 for layer l at positions [a, b): heads_out [b − a, H·hd].
  void attend(int64_t l, int64_t a, const float* q, float* heads_out, int64_t b);
  // docs/spec.md §3.7: X rows Xa [n, d] += the FFN of layer l.
  void ffn(int64_t l, float* Xa, int64_t n);
  // y_ = (silu(f̂ w1) ⊙ (f̂ w3)) w2     [n, d]
  void swiglu(const DevExpert& ex, int64_t n);
  void capture(int64_t l, int64_t a, int64_t b);

  static MatD download_rows(const DeviceBuffer<float>& buf, int64_t row0, int64_t rows, int64_t cols);
  static void upload_rows(DeviceBuffer<float>& buf, int64_t row0, const MatD& m);

  const Plan& plan_;
  const DevWeights& w_;
  Projector& proj_;
  bool capture_;
  int64_t ntot_ = 0, d_ = 0, hd_ = 0, H_ = 0, rd_ = 0, half_ = 0, qr_ = 0, HI_ = 0, dI_ = 0, K_ = 0, bs_ = 1,
          ctb_ = 1, G_ = 0, olr_ = 0, R_ = 0, A_ = 0, moe_ = 0, V_ = 0, W_ = 0;
  float eps_ = 0, rsf_ = 0, scale_ = 0, iw_scale_ = 0;
  std::vector<int64_t> first_;  // [L] first evaluated position of each layer

  DeviceBuffer<int32_t> tokens_;              // [Ntot]
  DeviceBuffer<float> cos_, sin_;             // [Ntot, rope_dim/2]
  DeviceBuffer<float> X_;                     // [Ntot, d] abs: the residual stream
  std::vector<DeviceBuffer<float>> local_;    // L × [Ntot, head_dim] abs: local (SWA) entries
  std::vector<DeviceBuffer<int32_t>> topk_;   // L × [Ntot, index_topk] abs (index sources): S_l(p)
  std::vector<DeviceBuffer<float>> topk_scores_;  // L × [Ntot, index_topk + 1] abs (index sources): their scores
  std::vector<SourceState> sources_;          // L (Full layers): global entries
  DeviceBuffer<int32_t> pool_;                // [Ntot, candidate_topk_blocks] abs: pool block ids

  DeviceBuffer<float> xhat_, qa_, qlat_, q_, o_, iq_, iw_, u_, y_, fhat_, acc_, h1_, h3_;
  DeviceBuffer<float> rlog_, rs_, rw_;  // [n, R], [n, R], [n, A]
  DeviceBuffer<int32_t> chosen_;        // [n, A]
  DeviceBuffer<float> scores_;          // [chunk, ld_s]
  DeviceBuffer<float> bscores_;         // [chunk, ld_b]
  DeviceBuffer<float> lbuf_;            // [logit_rows, V]
  int64_t ld_s_ = 1, chunk_ = 1, ld_b_ = 1, logit_rows_ = 1;
  std::vector<HostCapture> captures_;
};

}  // namespace CED_FLAVOUR
}  // namespace ced::cuda
