// docs/spec.md §4–§6: the prefill modes, resume and decode as sequences of layer
// evaluations of the engine.
#include <fmt/format.h>

#include <malloc.h>

#include <chrono>
#include <mutex>
#include <optional>

#include "model/error.hpp"
#include "models/lab/schedule.hpp"
#include "reference/lab/backend.hpp"
#include "reference/lab/engine.hpp"
#include "reference/lab/replays.hpp"

namespace ced {
namespace {

using ref::Engine;

template <class T>
class ReferenceBackend final : public Backend {
 public:
  ReferenceBackend(const Config& c, uint64_t seed)
      : c_(c), p_(make_plan(c)), w_(generate_weights<T>(c_, p_, seed)) {}

  std::string name() const override { return sizeof(T) == 8 ? "reference-f64" : "reference"; }
  std::string dtype() const override { return sizeof(T) == 8 ? "f64" : "f32"; }

  RunResult run(const RunRequest& req) override {
    validate_request(c_, req);
    const auto t0 = std::chrono::steady_clock::now();
    RunResult res = result_for(*this, req, p_);
    Engine<T> eng(c_, p_, w_, req.fault, req.poison_truncated, req.capture_layers, &res.flops, req.fault_layer);
    // Encoder start, replay start s, first logit: models/lab/schedule.hpp (shared with optimized/lab/).
    const RunSchedule sched = run_schedule(p_, req, res.n_replay);
    if (req.mode == Mode::Resume) {
      const int64_t P = req.prefix_len;
      std::shared_ptr<const PersistedCache> cache = req.cache_in;
      if (!cache) cache = std::make_shared<PersistedCache>(prefix_cache(req, P));
      check_cache(c_, p_, *cache, P);
      eng.import_cache(*cache);
      if (req.want_cache) res.cache = std::make_shared<PersistedCache>(*cache);
    }
    const Encoded enc = encode(req, sched, eng);
    decode_rest(req, sched, eng, enc, res, t0);
    return res;
  }

  class Session;  // reference/lab/replays.hpp's session on this backend (below)

 private:
  // The encoder's output X [N - encoder_start, d] and layer E's normalised
  // input x̂_E over the same positions.
  struct Encoded {
    Mat<T> X, xhat_E;
  };

  // docs/spec.md §4.2 steps 1–2 (§6.2 steps 1–2 for a resume).
  Encoded encode(const RunRequest& req, const RunSchedule& sched, Engine<T>& eng) const {
    const int64_t enc_first = sched.encoder_start;  // first position the encoder evaluates
    // 1. encoder over enc_first .. N-1
    Encoded e;
    e.X = embed(req.tokens, enc_first, req.n_prompt);
    Mat<T> H_prev;  // input of layer E-1 (for the source-only-wrong-layer fault)
    for (int64_t l = 0; l < p_.E; ++l) {
      if (l == p_.E - 1) H_prev = e.X;
      eng.layer(l, enc_first, e.X, nullptr);
    }
    // 2. source-only write (ced, resume): every decoder kv source over x̂_E.
    //    In full mode the decoder layers write their own entries as they run.
    e.xhat_E = eng.normalised_input(p_.E, e.X);
    if (req.mode != Mode::Full) {
      if (req.fault == Fault::SourceOnlyWrongLayer) eng.source_only_write(enc_first, eng.normalised_input(p_.E, H_prev));
      else eng.source_only_write(enc_first, e.xhat_E);
    }
    return e;
  }

  // docs/spec.md §4.2 step 3, the logits and §5's decode; `t0` began the prefill.
  void decode_rest(const RunRequest& req, const RunSchedule& sched, Engine<T>& eng, const Encoded& enc,
                   RunResult& res, std::chrono::steady_clock::time_point t0) {
    const int64_t N = req.n_prompt;
    const int64_t s = sched.replay_start;
    res.replay_start = s;
    const int64_t s_eval = (req.fault == Fault::ReplayStartIgnored) ? sched.encoder_start : s;
    // 3. decoder over s_eval .. N-1
    Mat<T> Xd = enc.X.bottomRows(N - s_eval);
    const Mat<T> xd_E = enc.xhat_E.bottomRows(N - s_eval);
    for (int64_t l = p_.E; l < p_.L; ++l) eng.layer(l, s_eval, Xd, &xd_E);
    if (req.want_cache && req.mode != Mode::Resume) res.cache = std::make_shared<PersistedCache>(eng.export_cache(dtype()));

    const int64_t first_logit = sched.first_logit;
    const int64_t n_dec = req.decode_steps;
    res.logits.resize(N - first_logit + n_dec, c_.vocab_size);
    put_rows(res.logits, 0, eng.logits(Xd.bottomRows(N - first_logit)));
    for (int64_t p = first_logit; p < N; ++p) res.positions.push_back(p);

    const auto t1 = std::chrono::steady_clock::now();
    res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    // docs/spec.md §5: decode, teacher-forced.
    for (int64_t t = 0; t < n_dec; ++t) {
      const int64_t p = N + t;
      Mat<T> x = embed(req.tokens, p, p + 1);
      for (int64_t l = 0; l < p_.E; ++l) eng.layer(l, p, x, nullptr);
      const Mat<T> xe = eng.normalised_input(p_.E, x);
      for (int64_t l = p_.E; l < p_.L; ++l) eng.layer(l, p, x, &xe);
      put_rows(res.logits, N - first_logit + t, eng.logits(x));
      res.positions.push_back(p);
    }
    res.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    if (req.capture_layers)
      for (auto& ls : eng.layers) res.layers.push_back(std::move(ls.capture));
  }

  Mat<T> embed(const std::vector<int32_t>& tokens, int64_t a, int64_t b) const {
    Mat<T> X(b - a, c_.d_model);
    for (int64_t p = a; p < b; ++p) X.row(p - a) = w_.embed.row(tokens[size_t(p)]);
    return X;
  }

  static void put_rows(MatD& dst, int64_t row, const Mat<T>& src) {
    for (int64_t i = 0; i < src.rows(); ++i)
      for (int64_t j = 0; j < src.cols(); ++j) dst(row + i, j) = double(src(i, j));
  }

  // docs/spec.md §6: the cache a previous session left for the first P tokens: the
  // encoder and the source-only write over 0..P-1 (its work is not counted).
  PersistedCache prefix_cache(const RunRequest& req, int64_t P) const {
    Engine<T> eng(c_, p_, w_, req.fault, false, false, nullptr, req.fault_layer);
    if (P > 0) {
      Mat<T> X = embed(req.tokens, 0, P);
      for (int64_t l = 0; l < p_.E; ++l) eng.layer(l, 0, X, nullptr);
      eng.source_only_write(0, eng.normalised_input(p_.E, X));
    }
    PersistedCache pc = eng.export_cache(dtype());
    pc.prefix_len = P;
    return pc;
  }

  Config c_;
  Plan p_;
  Weights<T> w_;
};

// reference/lab/replays.hpp: a ced prefill's encoder and source-only write do not
// depend on the replay policy, the decode steps, the dependency probe or the
// logits' scope (docs/spec.md §4.2 steps 1–2): computed once when the session
// opens, then each run continues a copy of the engine from there.
template <class T>
class ReferenceBackend<T>::Session final : public ReplaySession {
 public:
  Session(ReferenceBackend& be, const RunRequest& base) : be_(be), base_(with_some_replay(base)) {
    validate_request(be_.c_, base_);
    const auto t0 = std::chrono::steady_clock::now();
    counts_.resize(be_.p_.L);
    // The opening request's probe setting; no encoder window is truncated, so
    // it does not act here (Engine::set_poison).
    shared_.emplace(be_.c_, be_.p_, be_.w_, base_.fault, base_.poison_truncated, base_.capture_layers, &counts_,
                    base_.fault_layer);
    const RunResult first = result_for(be_, base_, be_.p_);
    enc_ = be_.encode(base_, run_schedule(be_.p_, base_, first.n_replay), *shared_);
    encoder_counts_ = counts_;
    encoder_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Session(const Session&) = delete;  // the engine counts into this session's counts_
  Session& operator=(const Session&) = delete;

  RunResult run(const RunRequest& r) override {
    require_same_prefill(base_, r);
    validate_request(be_.c_, r);
    const auto t1 = std::chrono::steady_clock::now();
    RunResult res = result_for(be_, r, be_.p_);
    counts_ = encoder_counts_;  // the previous run's decoder counts out
    Engine<T> eng = *shared_;   // counts into counts_ too
    eng.set_poison(r.poison_truncated);
    be_.decode_rest(r, run_schedule(be_.p_, r, res.n_replay), eng, enc_, res, t1);
    res.prefill_seconds += encoder_seconds_;
    res.flops = counts_;
    return res;
  }

 private:
  // The shared part does not depend on the policy, so an opening request may
  // leave it unset (run_replays' does); any policy makes it a valid request.
  static RunRequest with_some_replay(RunRequest r) {
    if (r.replay.kind == ReplayPolicy::Kind::None) r.replay = ReplayPolicy::parse("full");
    return r;
  }

  ReferenceBackend& be_;
  const RunRequest base_;
  FlopCount counts_, encoder_counts_;
  std::optional<Engine<T>> shared_;  // the engine after the encoder and the source-only write
  Encoded enc_;
  double encoder_seconds_ = 0;
};

}  // namespace

std::unique_ptr<ReplaySession> open_reference_replays(Backend& be, const RunRequest& base) {
  if (base.mode != Mode::Ced || base.want_cache) return nullptr;
  if (auto* r = dynamic_cast<ReferenceBackend<float>*>(&be)) return std::make_unique<ReferenceBackend<float>::Session>(*r, base);
  if (auto* r = dynamic_cast<ReferenceBackend<double>*>(&be)) return std::make_unique<ReferenceBackend<double>::Session>(*r, base);
  return nullptr;
}

namespace {
// A layer's temporaries are megabytes each (an [N, d] matrix is 8 MiB at
// N = 1024, d = 1024 in f64). glibc serves blocks that large with mmap and
// returns them on free, so every layer faulted in and the kernel zeroed the
// same memory again: 7 % of a bench prefill. Blocks up to 32 MiB (glibc's
// largest mmap threshold) now come from the heap, and freed memory stays with
// the process for reuse. Set once, for the whole process; it changes memory
// reuse only, never a value.
void keep_freed_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
}
}  // namespace

std::unique_ptr<Backend> make_reference_backend(const Config& c, uint64_t weight_seed, bool f64) {
  keep_freed_memory();
  if (f64) return std::make_unique<ReferenceBackend<double>>(c, weight_seed);
  return std::make_unique<ReferenceBackend<float>>(c, weight_seed);
}

}  // namespace ced
