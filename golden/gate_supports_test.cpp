// The gate asks a backend before each run (Backend::supports) and lists what
// it cannot do as not supported: never passed, never failed, never run.
#include <gtest/gtest.h>

#include "golden/golden_set.hpp"
#include "model/error.hpp"
#include "optimized/lab/host_emulation.hpp"
#include "reference/lab/backend.hpp"

using namespace ced;

namespace {

// reference-f64 that cannot resume: supports() says so, and run() throws
// NotSupported if the gate runs a resume anyway (the slip this test catches).
class NoResume final : public Backend {
 public:
  NoResume(const Config& c, uint64_t seed) : inner_(make_reference_backend(c, seed, true)) {}
  std::string name() const override { return "reference-f64-no-resume"; }
  std::string dtype() const override { return inner_->dtype(); }
  std::string supports(const RunRequest& r) const override {
    return r.mode == Mode::Resume ? "this test's backend does not resume" : "";
  }
  RunResult run(const RunRequest& r) override {
    if (r.mode == Mode::Resume) throw NotSupported("run() reached with a resume request");
    return inner_->run(r);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

// The two backends these tests gate, as registry entries (never registered).
BackendEntry no_resume_entry() {
  return {.name = "reference-f64-no-resume", .scalar = "f64", .golden_policy = "policy.toml", .gate_calibrated = false,
          .host_bytes_per_value = 8, .description = "test only",
          .factory = [](const Config& c, uint64_t s) { return std::make_unique<NoResume>(c, s); }};
}
// The CUDA model's host build: the same forward pass, no device.
BackendEntry cuda_host_entry() {
  return {.name = "cuda-host", .scalar = "f32", .golden_policy = "policy-calibrated.toml", .gate_calibrated = true,
          .host_bytes_per_value = 0, .description = "test only",
          .factory = [](const Config& c, uint64_t s) { return make_cuda_host_backend(c, s); }};
}

golden::GateOptions tiny_gate(const BackendEntry& e) {
  golden::GateOptions g;
  g.dir = golden::default_golden_dir();
  g.backend = e.name;
  g.entry = &e;
  g.only = "tiny.h5";
  g.quiet = true;
  return g;
}

}  // namespace

TEST(GateSupports, RunsABackendRefusesAreListedAsNotSupportedAndTheRestAreJudged) {
  const BackendEntry e = no_resume_entry();
  const auto rep = golden::run_gate(tiny_gate(e));
  ASSERT_EQ(rep.not_supported.size(), 1u);
  EXPECT_EQ(rep.not_supported[0].run, "resume");
  EXPECT_EQ(rep.not_supported[0].why, "this test's backend does not resume");
  EXPECT_TRUE(rep.failures.empty()) << rep.failures[0].run << ": " << rep.failures[0].what;
  EXPECT_EQ(rep.runs, 5);
  EXPECT_EQ(rep.passed, 4);
}

// The CUDA model (here its host build, the same forward pass) has no fault
// injection: a faulted gate runs none of its runs and fails none.
TEST(GateSupports, CudaModelListsEveryFaultedRunAsNotSupported) {
  const BackendEntry e = cuda_host_entry();
  auto g = tiny_gate(e);
  g.fault = Fault::WindowOffByOne;
  const auto rep = golden::run_gate(g);
  EXPECT_EQ(rep.runs, 5);
  EXPECT_EQ(rep.passed, 0);
  EXPECT_TRUE(rep.failures.empty());
  ASSERT_EQ(rep.not_supported.size(), 5u);
  EXPECT_NE(rep.not_supported[0].why.find("fault injection"), std::string::npos) << rep.not_supported[0].why;
}

// `ced gate`'s verdict: a gate that judged nothing (every run not supported)
// does not pass, however clean its zero failures look; one with a passing run
// and the rest not supported passes; a failure fails.
TEST(GateSupports, AGateThatJudgedNoRunDoesNotPassAndSaysSo) {
  const BackendEntry cuda = cuda_host_entry();
  auto g = tiny_gate(cuda);
  g.fault = Fault::WindowOffByOne;
  g.only = "tiny.h5:full";
  const auto none = golden::run_gate(g);
  ASSERT_EQ(none.runs, 1);
  ASSERT_EQ(none.not_supported.size(), 1u);
  try {
    golden::gate_exit_code(none, "cuda-host");
    FAIL() << "a gate that judged no run passed";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("no run was judged: backend cuda-host supports none of the 1 selected runs"),
              std::string::npos)
        << e.what();
  }
  const BackendEntry no_resume = no_resume_entry();
  golden::GateReport some = golden::run_gate(tiny_gate(no_resume));
  ASSERT_EQ(some.not_supported.size(), 1u);
  EXPECT_EQ(golden::gate_exit_code(some, no_resume.name), 0);
  some.failures.push_back({"tiny.h5", "full", "planted", ""});
  EXPECT_EQ(golden::gate_exit_code(some, no_resume.name), 1);
}

TEST(GateSupports, CudaModelRefusesFaultsAndTheProbeBeforeRunningAndRunThrowsTheSameReason) {
  const Config c = builtin_config("tiny");
  auto be = make_cuda_host_backend(c, 1);
  RunRequest r;
  r.n_prompt = 4;
  r.tokens = {1, 2, 3, 4};
  EXPECT_EQ(be->supports(r), "");
  r.poison_truncated = true;
  EXPECT_NE(be->supports(r).find("poison_truncated"), std::string::npos);
  r.poison_truncated = false;
  r.fault = Fault::SinkDropped;
  const std::string why = be->supports(r);
  ASSERT_FALSE(why.empty());
  try {
    be->run(r);
    FAIL() << "run() of a faulted request succeeded";
  } catch (const NotSupported& e) {
    EXPECT_EQ(std::string(e.what()), why);
  }
}
