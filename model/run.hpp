#pragma once
// What a backend is asked to run (docs/spec.md §4–§6) and what it returns (docs/spec.md §9).
#include <Eigen/Core>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ced {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

enum class Mode { Full, Ced, Resume };
const char* mode_name(Mode m);
Mode parse_mode(const std::string& s);  // InputError

// docs/spec.md §4 replay policies: bounded = W, exact = 1 + D(W-1), full = N, or K >= 1.
struct ReplayPolicy {
  enum class Kind { None, Bounded, Exact, Full, Count } kind = Kind::None;
  int64_t count = 0;  // K for Kind::Count
  static ReplayPolicy parse(const std::string& s);  // InputError
  std::string str() const;                          // "none" | "bounded" | "exact" | "full" | "K"
  // Policy length before min(N, .): -1 for None. The family gives its window W and its exact span
  // (the lab's 1 + D(W - 1), docs/spec.md §4).
  int64_t n_replay(int64_t window, int64_t exact_span, int64_t n_prompt) const;
};

// Test-only fault injections (spec-violating on purpose) for the negative
// controls of the property suite and the gate. Fault::None is the model.
enum class Fault {
  None,
  WindowOffByOne,          // local window W+1: lo(p) = max(first, p - W)
  ReplayStartIgnored,      // decoder evaluated from 0 whatever the replay policy
  ReuseOwnSelection,       // Reuse layers score with their own queries instead of taking idx_src's selection
  TieBreakReversed,        // equal scores: smaller entry id first
  SourceOnlyWrongLayer,    // source-only write reads x̂ of layer E-1's input instead of x̂_E
  SinkDropped,             // softmax without the sink logit
  CompressorBlockShifted,  // block j visible one position early: (j+1)r - 2 <= p
  PoolPinDropped,          // candidate pool without the pinned newest block
  ResumeReplayShort,       // resume replays W-1 positions: s_r = max(0, P - W + 1)
  RopeInverseSkipped,      // attention output not inverse-rotated
  FfnOutputScaled,         // FFN output added times 1 + 2^-10: a small numerical slip every run carries alike
  ThreadDependentReduction,  // FFN matmuls sum k descending on OpenMP threads other than 0 (only where a
                             // parallel region opens: above ~1M multiply-adds, ops.hpp matmul_rows)
};
const std::vector<Fault>& all_faults();  // excluding None
const char* fault_name(Fault f);
Fault parse_fault(const std::string& s);  // InputError

enum class LogitsScope { All, Last };

// docs/spec.md §6: what survives a prefix of P tokens: per kv source, the global
// entries, index keys and the compressor's pending rows; no local entries.
struct SourceCache {
  int64_t layer = 0;
  int64_t ratio = 0;
  int64_t n_tokens = 0;  // P
  MatD entries;     // [n_entries, head_dim]  g_j (roped)
  MatD index_keys;  // [n_entries, index_head_dim]  ik_j
  MatD pending_c;   // [n_pending, head_dim]  c_t of the incomplete block (r >= 2)
  MatD pending_z;   // [n_pending, head_dim]  z_t
};
struct PersistedCache {
  int64_t prefix_len = 0;
  std::string dtype;  // of the backend that wrote it
  std::vector<SourceCache> sources;  // one per kv source, ascending
};

struct RunRequest {
  Mode mode = Mode::Full;
  ReplayPolicy replay;      // ced / resume
  int64_t n_prompt = 0;     // N
  int64_t prefix_len = -1;  // P (resume)
  // Encoder replay length of a resume: s_r = max(0, P - resume_replay).
  // -1 = docs/spec.md §6's W. Other values serve `ced spans` only.
  int64_t resume_replay = -1;
  int64_t decode_steps = 0;
  std::vector<int32_t> tokens;  // at least n_prompt + decode_steps
  bool capture_layers = false;
  LogitsScope logits = LogitsScope::All;
  // Probe: window entries a truncated window leaves out enter as NaN, so an
  // output is NaN iff it depends on them (the dependency cone, measured).
  bool poison_truncated = false;
  Fault fault = Fault::None;
  int64_t fault_layer = -1;  // >= 0: a per-layer fault only at this layer
  std::shared_ptr<const PersistedCache> cache_in;  // resume: use this instead of computing it
  bool want_cache = false;  // return the persisted cache of the first P (resume) or N tokens
};

struct LayerCapture {
  int64_t layer = 0;
  std::vector<int64_t> positions;  // ascending
  MatD out;                        // [P_l, d]  X after the whole layer
  bool has_topk = false;
  Eigen::Matrix<int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> topk;  // [P_l, index_topk], -1 padded
  // The index scores behind the selection (docs/spec.md §9.1), for §8.3's
  // near-tie classification; in the run's scalar type. Stored with topk by
  // both models; absent from version-1 files (has_scores false).
  bool has_scores = false;
  MatD topk_scores;                     // [P_l, index_topk]  I(p, j) of each selected j; NaN where topk is -1
  std::vector<double> kth_score;        // [P_l]  score of the last (k-th) selected entry; NaN if none
  std::vector<double> left_out_score;   // [P_l]  score of the best eligible entry left out; NaN if none
};

// docs/spec.md §7 FLOP categories (2 per multiply-add).
enum FlopKind : int {
  kFlopQuery, kFlopLocalEntry, kFlopCompressor, kFlopIndexKeys, kFlopIndexerQW, kFlopIndexScoring,
  kFlopAttention, kFlopOutput, kFlopRouter, kFlopExperts, kFlopLmHead, kFlopKinds
};
const char* flop_kind_name(int k);

struct FlopCount {
  // per layer (the lm_head is counted in an extra row L)
  std::vector<std::array<int64_t, kFlopKinds>> per_layer;
  void resize(int64_t L) { per_layer.assign(size_t(L + 1), {}); }
  void add(int64_t layer, int kind, int64_t flops) { per_layer[size_t(layer)][size_t(kind)] += flops; }
  int64_t total() const;
  int64_t total_layer(int64_t l) const;
  int64_t total_kind(int k) const;
};

struct RunResult {
  std::string backend;
  std::string dtype;  // "f32" | "f64" | "bf16"
  Mode mode = Mode::Full;
  ReplayPolicy replay;
  int64_t n_prompt = 0;
  int64_t n_replay = -1;
  int64_t replay_start = 0;
  int64_t prefix_len = -1;
  int64_t decode_steps = 0;
  std::vector<int64_t> positions;  // ascending
  MatD logits;                     // [P, V]
  std::vector<LayerCapture> layers;  // empty unless captured
  FlopCount flops;
  std::shared_ptr<PersistedCache> cache;
  // Wall time of the prefill (encoder, source-only write, decoder, its
  // logits) and of all decode steps, measured by the backend (not stored).
  double prefill_seconds = 0, decode_seconds = 0;
};

// The interface both models implement; a user's engine is another one.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual std::string dtype() const = 0;
  // "" when this backend can run `req`, else why not (one sentence). Asked
  // before run(), the way ggml asks a backend's supports_op before placing an
  // op on it, so a caller (`ced gate`, `ced verify`) lists the run as not
  // supported instead of failing inside run(). The request's validity against
  // the config is validate_request's question, not this one's.
  virtual std::string supports(const RunRequest& req) const {
    (void)req;
    return "";
  }
  // Throws InputError for requests that break the spec's rules, NotSupported
  // for what this backend cannot do (whatever supports() refuses).
  virtual RunResult run(const RunRequest& req) = 0;
};

// Checks what a request must satisfy on every family (lengths, the mode's replay policy and prefix);
// InputError. A family adds its own (models/lab/schedule.hpp validate_request: the tokens against its vocab).
void validate_request_shape(const RunRequest& r);

}  // namespace ced
