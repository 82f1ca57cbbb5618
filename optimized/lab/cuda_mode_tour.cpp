// cuda_mode_tour: one process that takes the CUDA backend through every mode
// on `tiny` (and its bf16 twin through the same), for the CUDA sanitizers
// (compute-sanitizer memcheck, racecheck, synccheck, initcheck), which pay
// their start-up once per process. Modes: full with decode; ced with each
// replay policy (bounded, exact, full, an integer K) with decode and layer
// capture; resume with P < W, P = W and P > W; a resume from a cache the
// backend exported (cache round trip). Each result must be finite and not all
// zero; the tour judges nothing else (the gate does).
//
// Exit 0 when every run finished with sane logits, 1 otherwise, 77 with
// "SKIP: no CUDA device" without a device. Built with CED_CUDA_HOST_EMULATION
// it takes the host emulation of the same backend instead (CTest, default
// tier): the tour itself is then proven to run before a GPU ever sees it.
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"
#include "model/run.hpp"
#include "models/lab/weights.hpp"
#include "optimized/lab/cuda_backend.hpp"
#ifdef CED_CUDA_HOST_EMULATION
#include "optimized/lab/host_emulation.hpp"
#endif

using namespace ced;

int main() {
#ifdef CED_CUDA_HOST_EMULATION
  const auto make_backend = make_cuda_host_backend;
#else
  if (!cuda_device_available()) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  const auto make_backend = make_cuda_backend;
#endif
  const Config c = builtin_config("tiny");
  const Plan p = make_plan(c);
  const int64_t W = p.W, N = 3 * p.exact_replay() + 1, K = 3;
  int failures = 0;
  for (const CudaPrecision prec : {CudaPrecision::F32, CudaPrecision::BF16}) {
    std::unique_ptr<Backend> be;
    try {
      be = make_backend(c, 1, prec);
    } catch (const std::exception& e) {
      std::printf("FAIL %s: %s\n", cuda_precision_name(prec), e.what());
      ++failures;
      continue;
    }
    auto run = [&](const std::string& what, RunRequest r) -> std::shared_ptr<PersistedCache> {
      r.n_prompt = r.n_prompt ? r.n_prompt : N;
      r.tokens = make_tokens(2, c.vocab_size, r.n_prompt + r.decode_steps);
      try {
        const RunResult res = be->run(r);
        const bool sane = res.logits.size() > 0 && res.logits.allFinite() && res.logits.norm() > 0;
        std::printf("%s %-5s %s\n", sane ? "ok  " : "FAIL", cuda_precision_name(prec), what.c_str());
        failures += !sane;
        return res.cache;
      } catch (const std::exception& e) {
        std::printf("FAIL %-5s %s: %s\n", cuda_precision_name(prec), what.c_str(), e.what());
        ++failures;
        return nullptr;
      }
    };
    RunRequest full;
    full.decode_steps = K;
    full.capture_layers = true;
    run("full + decode", full);
    for (const char* policy : {"bounded", "exact", "full", "3"}) {
      RunRequest r = full;
      r.mode = Mode::Ced;
      r.replay = ReplayPolicy::parse(policy);
      run(std::string("ced --replay ") + policy + " + decode", r);
    }
    std::shared_ptr<PersistedCache> cache;
    for (const int64_t P : {W - 1, W, W + 3}) {
      RunRequest r;
      r.mode = Mode::Resume;
      r.replay = ReplayPolicy::parse("bounded");
      r.prefix_len = P;
      r.decode_steps = K;
      r.want_cache = true;
      auto got = run("resume --prefix " + std::to_string(P) + " + decode", r);
      if (P == W + 3) cache = got;
    }
    if (cache) {
      RunRequest r;
      r.mode = Mode::Resume;
      r.replay = ReplayPolicy::parse("bounded");
      r.prefix_len = W + 3;
      r.cache_in = cache;
      run("resume --prefix " + std::to_string(W + 3) + " from the exported cache", r);
    }
  }
  std::printf("cuda_mode_tour: %d failure(s)\n", failures);
  return failures ? 1 : 0;
}
