// The CUDA backend side by side with the reference (label gpu): every golden
// run, every layer's output and selections, under the self-calibrating policy
// (f32) and the bf16 policy; then the tolerance-based CED properties on the
// CUDA backend. Without a device: "SKIP" and CTest's skip code 77.
#include <cmath>
#include <cstdio>

#include "models/lab/weights.hpp"
#include "oracle/analytic.hpp"
#include "backends/registry.hpp"
#include "golden/golden_set.hpp"

using namespace ced;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("  %s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

double rel_l2(const MatD& a, const MatD& b) { return (a - b).norm() / std::max(b.norm(), 1e-300); }

}  // namespace

int main() {
  if (!backend_entry("cuda").unavailable_reason().empty()) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  for (const char* backend : {"cuda", "cuda-bf16"}) {
    golden::GateOptions g;
    g.dir = golden::default_golden_dir();
    g.backend = backend;
    const auto rep = golden::run_gate(g);
    expect(rep.failures.empty(), std::string("golden gate on ") + backend);
  }
  // CED properties that hold within tolerance on any backend: ced replay=full
  // equals full, and inside the cone bounded equals full (to the f32 bound).
  const Config c = builtin_config("small");
  auto be = make_backend("cuda", c, 1);
  RunRequest r;
  r.n_prompt = 120;
  r.tokens = make_tokens(2, c.vocab_size, 120);
  r.capture_layers = true;
  const RunResult full = be->run(r);
  r.mode = Mode::Ced;
  r.replay = ReplayPolicy::parse("full");
  const RunResult cfull = be->run(r);
  expect(rel_l2(cfull.logits, full.logits) < 1e-5, "cuda: ced replay=full equals full within f32 rounding");
  r.replay = ReplayPolicy::parse("exact");
  const RunResult exact = be->run(r);
  const MatD last_full = full.logits.bottomRows(1), last_exact = exact.logits.bottomRows(1);
  expect(rel_l2(last_exact, last_full) < 1e-5, "cuda: exact replay's last logits equal full's within f32 rounding");
  r.replay = ReplayPolicy::parse("bounded");
  const RunResult bounded = be->run(r);
  expect(rel_l2(bounded.logits.bottomRows(1), last_full) > 1e-4, "cuda: bounded replay past R differs from full");
  // determinism
  expect((be->run(r).logits - bounded.logits).cwiseAbs().maxCoeff() == 0.0, "cuda: two runs give the same bits");
  std::printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
