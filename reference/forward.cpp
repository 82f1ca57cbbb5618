// docs/spec.md §4–§6: the prefill modes, resume and decode as sequences of layer
// evaluations of the engine.
#include <fmt/format.h>

#include <chrono>

#include "model/error.hpp"
#include "model/schedule.hpp"
#include "reference/backend.hpp"
#include "reference/engine.hpp"

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
    const int64_t N = req.n_prompt;
    // Encoder start, replay start s, first logit: model/schedule.hpp (shared with optimized/).
    const RunSchedule sched = run_schedule(p_, req, res.n_replay);
    const int64_t enc_first = sched.encoder_start;  // first position the encoder evaluates
    if (req.mode == Mode::Resume) {
      const int64_t P = req.prefix_len;
      std::shared_ptr<const PersistedCache> cache = req.cache_in;
      if (!cache) cache = std::make_shared<PersistedCache>(prefix_cache(req, P));
      check_cache(c_, p_, *cache, P);
      eng.import_cache(*cache);
      if (req.want_cache) res.cache = std::make_shared<PersistedCache>(*cache);
    }
    const int64_t s = sched.replay_start;
    res.replay_start = s;
    const int64_t s_eval = (req.fault == Fault::ReplayStartIgnored) ? enc_first : s;

    // 1. encoder over enc_first .. N-1
    Mat<T> X = embed(req.tokens, enc_first, N);
    Mat<T> H_prev;  // input of layer E-1 (for the source-only-wrong-layer fault)
    for (int64_t l = 0; l < p_.E; ++l) {
      if (l == p_.E - 1) H_prev = X;
      eng.layer(l, enc_first, X, nullptr);
    }
    // 2. source-only write (ced, resume): every decoder kv source over x̂_E.
    //    In full mode the decoder layers write their own entries as they run.
    const Mat<T> xhat_E = eng.normalised_input(p_.E, X);
    if (req.mode != Mode::Full) {
      if (req.fault == Fault::SourceOnlyWrongLayer) eng.source_only_write(enc_first, eng.normalised_input(p_.E, H_prev));
      else eng.source_only_write(enc_first, xhat_E);
    }
    // 3. decoder over s_eval .. N-1
    Mat<T> Xd = X.bottomRows(N - s_eval);
    const Mat<T> xd_E = xhat_E.bottomRows(N - s_eval);
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
    return res;
  }

 private:
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

}  // namespace

std::unique_ptr<Backend> make_reference_backend(const Config& c, uint64_t weight_seed, bool f64) {
  if (f64) return std::make_unique<ReferenceBackend<double>>(c, weight_seed);
  return std::make_unique<ReferenceBackend<float>>(c, weight_seed);
}

}  // namespace ced
