// docs/spec.md §4–§6 on the device: the prefill modes, resume and decode as sequences
// of layer evaluations of the engine (optimized/lab/engine.hpp), in the order of
// reference/lab/forward.cpp; the schedule (encoder, replay and resume starts) and
// the cache check are models/lab/schedule.hpp's, shared with the reference.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "model/error.hpp"
#include "models/lab/plan.hpp"
#include "models/lab/schedule.hpp"
#include "models/lab/weights.hpp"
#include "optimized/lab/cuda_backend.hpp"
#include "optimized/lab/device_runtime.hpp"
#include "optimized/lab/device_weights.hpp"
#include "optimized/lab/engine.hpp"
#include "optimized/lab/host_emulation.hpp"
#include "optimized/lab/projector.hpp"

namespace ced::cuda {
inline namespace CED_FLAVOUR {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Config& c, uint64_t seed, CudaPrecision prec) : cfg_(c), prec_(prec) {
    validate(cfg_);
    plan_ = make_plan(cfg_);
    if (!rt::device_available()) throw NotSupported("CUDA backend: no CUDA device is available");
    rt::select_device();
    const int64_t smem_floats = cfg_.window + cfg_.index_topk + cfg_.head_dim;
    if (smem_floats * 4 > 48 * 1024)
      throw NotSupported(fmt::format("CUDA backend: attention needs window + index_topk + head_dim = {} floats of "
                                     "shared memory, more than 48 KiB",
                                     smem_floats));
    const auto specs = weight_specs(cfg_, plan_);
    size_t free_b = 0, total_b = 0;
    rt::memory_info(free_b, total_b);
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
    rt::synchronize();
  }

  std::string name() const override { return "cuda"; }
  std::string dtype() const override { return cuda_precision_name(prec_); }

  // The negative controls (fault injection) and the dependency probe are the
  // reference's instruments; the CUDA model has neither.
  std::string supports(const RunRequest& req) const override {
    if (req.fault != Fault::None)
      return fmt::format("CUDA backend: fault injection '{}' is not supported (the negative controls run on the "
                         "reference)",
                         fault_name(req.fault));
    if (req.poison_truncated) return "CUDA backend: the poison_truncated dependency probe is not supported";
    return "";
  }

  RunResult run(const RunRequest& req) override {
    validate_request(cfg_, req);
    if (const std::string why = supports(req); !why.empty()) throw NotSupported(why);
    const int64_t N = req.n_prompt, steps = req.decode_steps, ntot = N + steps, L = plan_.L, E = plan_.E;
    const auto t0 = std::chrono::steady_clock::now();

    RunResult res = result_for(*this, req, plan_);  // FLOP counts stay zero: counting is the oracle's job
    const RunSchedule s = run_schedule(plan_, req, res.n_replay);
    std::shared_ptr<const PersistedCache> cache;
    if (req.mode == Mode::Resume) {
      const int64_t P = req.prefix_len;
      res.prefix_len = P;
      cache = req.cache_in ? req.cache_in : std::make_shared<const PersistedCache>(prefix_cache(req.tokens, P));
      check_cache(cfg_, plan_, *cache, P);
    }
    res.replay_start = s.replay_start;

    const std::vector<int32_t> tokens(req.tokens.begin(), req.tokens.begin() + ntot);
    Engine eng(cfg_, plan_, w_, *proj_, tokens, req.capture_layers);
    if (cache) eng.import_cache(*cache);
    for (int64_t l = 0; l < L; ++l) eng.set_first(l, l < E ? s.encoder_start : s.replay_start);

    // Prompt: encoder, source-only write, decoder (docs/spec.md §4; §6 for resume).
    prefill(eng, s.encoder_start, s.replay_start, N, s.resume_start);

    const int64_t n_prompt_rows = N - s.first_logit;
    res.logits.resize(n_prompt_rows + steps, cfg_.vocab_size);
    for (int64_t p = s.first_logit; p < ntot; ++p) res.positions.push_back(p);
    eng.logits(s.first_logit, N, res.logits, 0);

    if (req.want_cache)
      res.cache = req.mode == Mode::Resume ? std::make_shared<PersistedCache>(*cache)
                                           : std::make_shared<PersistedCache>(eng.export_cache(dtype(), N));

    rt::synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    // docs/spec.md §5 decode: one position at a time through all layers, with caches.
    for (int64_t p = N; p < ntot; ++p) {
      eng.embed(p, p + 1);
      for (int64_t l = 0; l < E; ++l) eng.layer(l, p, p + 1, s.resume_start);
      source_only_write(eng, p, p + 1, s.resume_start);
      for (int64_t l = E; l < L; ++l) eng.layer(l, p, p + 1, s.resume_start);
      eng.logits(p, p + 1, res.logits, n_prompt_rows + (p - N));
    }
    rt::synchronize();
    res.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    if (req.capture_layers) res.layers = eng.take_captures();
    return res;
  }

 private:
  // The encoder over [enc_first, N), the source-only write, the decoder over [dec_first, N).
  void prefill(Engine& eng, int64_t enc_first, int64_t dec_first, int64_t N, int64_t write_from) const {
    eng.embed(enc_first, N);
    for (int64_t l = 0; l < plan_.E; ++l) eng.layer(l, enc_first, N, write_from);
    source_only_write(eng, enc_first, N, write_from);
    for (int64_t l = plan_.E; l < plan_.L; ++l) eng.layer(l, dec_first, N, write_from);
  }

  // docs/spec.md §4 step 2 over x̂_E = RMSNorm(H_E) ⊙ layers.E.attn_norm at [a, b).
  void source_only_write(Engine& eng, int64_t a, int64_t b, int64_t write_from) const {
    if (plan_.decoder_kv_sources.empty() || b <= a) return;
    eng.source_only_write(a, eng.normalised_input(plan_.E, a, b), b, write_from);
  }

  // docs/spec.md §6: the cache of the first P tokens, from the encoder over [0, P)
  // and the source-only write (no decoder, no local entries kept).
  PersistedCache prefix_cache(const std::vector<int32_t>& all_tokens, int64_t P) {
    const std::vector<int32_t> tokens(all_tokens.begin(), all_tokens.begin() + P);
    Engine eng(cfg_, plan_, w_, *proj_, tokens, false);
    for (int64_t l = 0; l < plan_.L; ++l) eng.set_first(l, 0);
    eng.embed(0, P);
    for (int64_t l = 0; l < plan_.E; ++l) eng.layer(l, 0, P, 0);
    source_only_write(eng, 0, P, 0);
    return eng.export_cache(dtype(), P);
  }

  Config cfg_;
  Plan plan_;
  CudaPrecision prec_;
  std::unique_ptr<Projector> proj_;
  DevWeights w_;
};

}  // namespace
}  // namespace CED_FLAVOUR
}  // namespace ced::cuda

namespace ced {

#if defined(CED_CUDA_HOST_EMULATION)
std::unique_ptr<Backend> make_cuda_host_backend(const Config& config, uint64_t weight_seed, CudaPrecision precision) {
  return std::make_unique<cuda::CudaBackend>(config, weight_seed, precision);
}
#else
std::unique_ptr<Backend> make_cuda_backend(const Config& config, uint64_t weight_seed, CudaPrecision precision) {
  return std::make_unique<cuda::CudaBackend>(config, weight_seed, precision);
}
#endif

}  // namespace ced
