// The verdicts of the v41 commands that no cheap run of the `ced` binary can reach (issue 35): `ced verify`'s
// golden gate on a folder that holds no golden file (the command would first run its whole property suite),
// and `ced cache-hit`'s verdict on samples the reference does not give on demand (a claim whose decode step
// alone differs, a token seed that fails before one that passes). Called in the library the commands run
// (ced_tools), so what they hold is what `ced` prints and exits on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "checks/v41/agreement.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/run_file.hpp"
#include "tools/v41_cache_hit.hpp"
#include "tools/v41_commands.hpp"
#include "tools/v41_study.hpp"

namespace fs = std::filesystem;
using ced::tools::cache_hit::aggregate;
using ced::tools::cache_hit::Row;
using ced::tools::cache_hit::Sample;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ced-v41-tools-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The whitespace-separated words of a line.
std::vector<std::string> words(const std::string& line) {
  std::stringstream ss(line);
  std::vector<std::string> w;
  for (std::string x; ss >> x;) w.push_back(x);
  return w;
}

// The lines of a text that start with `prefix`.
std::vector<std::string> lines_starting(const std::string& text, const std::string& prefix) {
  std::stringstream ss(text);
  std::vector<std::string> out;
  for (std::string line; std::getline(ss, line);)
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  return out;
}

bool names(const std::vector<std::string>& failures, const std::string& what) {
  for (const std::string& f : failures)
    if (f.find(what) != std::string::npos) return true;
  return false;
}

// A resume of mode sglang, hit 16, rule trtllm, K 16 (a hit of W: every row rebuilt, so the rule claims the
// cold run) that holds its claim: finite, its last logits and its next decode step the cold run's bits.
Sample exact_claim_held(uint64_t token_seed) {
  Sample s;
  s.mode = "sglang";
  s.rule = "trtllm";
  s.token_seed = token_seed;
  s.H = s.K = s.hit = 16;
  s.start = 0;
  s.claims_exact = true;
  s.top1 = s.bitwise = s.step_bitwise = s.finite = true;
  return s;
}

}  // namespace

// A gate that compared nothing has not passed: the folder `--golden-v41` names exists but holds no .h5 file
// (only a note beside them), and the failure names it so the user sees which folder was empty.
TEST(V41VerifyGolden, AFolderWithNoGoldenFileIsAFailureNamingTheFolder) {
  const fs::path empty = scratch("empty");
  std::ofstream(empty / "README.md") << "not a golden file\n";
  std::vector<std::string> failures;
  ced::tools::verify_v41_golden(empty.string(), failures);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_TRUE(names(failures, "no golden file in " + empty.string())) << failures[0];
  failures.clear();
  ced::tools::verify_v41_golden((empty / "missing").string(), failures);
  EXPECT_TRUE(names(failures, "no golden file in " + (empty / "missing").string()));
}

// The other side of the one above: a folder with one golden file of the official code is gated and passes,
// so the refusal is the empty folder's alone (tiny-bf16-n1.h5, the cheapest file: half a second).
TEST(V41VerifyGolden, AFolderWithOneGoldenFileIsGatedAndPasses) {
  const fs::path one = scratch("one");
  fs::copy_file(fs::path(CED_V41_GOLDEN_DIR) / "tiny-bf16-n1.h5", one / "tiny-bf16-n1.h5");
  std::vector<std::string> failures;
  testing::internal::CaptureStdout();
  ced::tools::verify_v41_golden(one.string(), failures);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(failures.empty()) << failures[0];
  EXPECT_NE(out.find("ok   golden       tiny-bf16-n1.h5 ("), std::string::npos) << out;
}

// `ced gate --golden DIR` takes the v41 gate where DIR is a folder of v41 golden files (no policy.toml, a v41
// run file first) and the lab's gate where it holds the lab's policy.
TEST(V41GateCommand, TheV41GoldenFolderIsRecognisedAndTheLabOneIsNot) {
  EXPECT_TRUE(ced::tools::is_v41_golden_dir(CED_V41_GOLDEN_DIR));
  EXPECT_FALSE(ced::tools::is_v41_golden_dir(fs::path(CED_V41_GOLDEN_DIR).parent_path().string()));
  EXPECT_FALSE(ced::tools::is_v41_golden_dir(scratch("empty").string()));
}

// One golden file passes `ced gate` and the same file with a port's bug planted in our reference (the v4
// q_norm) fails, at the query of layer 0, naming the command that reproduces it.
TEST(V41GateCommand, AGoldenFilePassesAndAPlantedPortBugFailsAtItsOpWithItsReproduceCommand) {
  ced::tools::V41GateOptions o;
  o.dir = CED_V41_GOLDEN_DIR;
  o.only = "tiny-fp8-n17.h5";
  testing::internal::CaptureStdout();
  EXPECT_EQ(ced::tools::gate_v41(o), 0);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("ok   tiny-fp8-n17.h5 (release, N = 17)"), std::string::npos) << out;
  EXPECT_NE(out.find("1 files, 1 passed, 0 failed"), std::string::npos) << out;
  o.fault = "v4-q-norm";
  testing::internal::CaptureStdout();
  EXPECT_EQ(ced::tools::gate_v41(o), 1);
  out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("first failure: teacher forced layer 0 attn_q (forced x):"), std::string::npos) << out;
  EXPECT_NE(out.find("reproduce: ced gate --golden"), std::string::npos) << out;
  o.only = "no-such.h5";
  EXPECT_THROW(ced::tools::gate_v41(o), ced::InputError);
}

// `ced diff` on two v41 run files judges each op by its bounds where the inputs agree: a golden file against
// itself is bitwise; our reference's own run of the same prompt against the official's passes (each op whose
// inputs are the official's within its bounds, the others not judged); one query value of layer 0 a quarter
// off fails there.
TEST(V41DiffCommand, OurReferencesRunPassesAgainstTheOfficialsAndAQueryAQuarterOffFails) {
  namespace v41 = ced::v41;
  const fs::path dir = scratch("diff"), golden = fs::path(CED_V41_GOLDEN_DIR) / "tiny-fp8-n17.h5";
  auto diff = [&](const fs::path& a, std::string& out) {
    testing::internal::CaptureStdout();
    const int rc = ced::tools::diff_v41({a.string(), golden.string(), "", true});
    out = testing::internal::GetCapturedStdout();
    return rc;
  };
  std::string out;
  EXPECT_EQ(diff(golden, out), 0) << out;
  EXPECT_NE(out.find("0 ops not judged"), std::string::npos) << out;
  const v41::V41RunFile official = v41::read_v41_run_file(golden);
  const v41::V41Checkpoint ck = v41::v41_golden_checkpoint(official);
  const v41::V41Model m(ck.config, ck.weights, official.regime);
  v41::V41RunFile ours = official;
  ours.generator = "ced reference (test)";
  ours.result = m.forward(official.tokens, v41::v41_checkpoint_hashing(ck.config));
  v41::write_v41_run_file(dir / "ours.h5", ours);
  EXPECT_EQ(diff(dir / "ours.h5", out), 0) << out;
  EXPECT_NE(out.find("PASS"), std::string::npos) << out;
  v41::V41RunFile bad = official;
  bad.result.layers[0].attn_q[3] *= 1.25;  // 64 of its bf16 steps
  v41::write_v41_run_file(dir / "bad.h5", bad);
  EXPECT_EQ(diff(dir / "bad.h5", out), 1) << out;
  EXPECT_NE(out.find("first failure: layer 0 attn_q (forced x)"), std::string::npos) << out;
}

// A row is every token seed's verdict: the first seed's failed claim is not washed out by the last seed's
// pass, nor a middle one's by the seeds around it. Rows of other (mode, H, rule, K) keys interleaved keep
// their own verdicts.
TEST(V41CacheHitRows, ARowFailsWhenAnySeedFailedNotOnlyTheLast) {
  std::vector<Sample> samples;
  Sample failed = exact_claim_held(0);
  failed.bitwise = false;
  samples.push_back(failed);
  Sample other = exact_claim_held(0);
  other.H = other.hit = 15;
  samples.push_back(other);
  samples.push_back(exact_claim_held(1));
  other.token_seed = 1;
  samples.push_back(other);
  // A third key whose middle seed failed.
  for (uint64_t seed : {0, 1, 2}) {
    Sample s = exact_claim_held(seed);
    s.rule = "vllm";
    s.bitwise = seed != 1;
    samples.push_back(s);
  }
  const std::vector<Row> rows = aggregate(samples);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].first->H, 16);
  EXPECT_EQ(rows[0].n, 2);
  EXPECT_EQ(rows[0].bitwise, 1);
  EXPECT_FALSE(rows[0].ok) << "seed 0 failed its claim, seed 1 held it";
  EXPECT_EQ(rows[1].first->H, 15);
  EXPECT_TRUE(rows[1].ok) << "both seeds held the claim";
  EXPECT_EQ(rows[2].first->rule, "vllm");
  EXPECT_EQ(rows[2].n, 3);
  EXPECT_EQ(rows[2].bitwise, 2);
  EXPECT_FALSE(rows[2].ok) << "seed 1 of 3 failed its claim";
}

// A rule that claims the cold run claims its next decode step too: last logits bitwise with a step that
// differs is a failed claim. Where the rule claims nothing (the window rebuilt from H - K) neither bit is
// asked, only finite values.
TEST(V41CacheHitRows, AnExactClaimFailsWhenOnlyItsDecodeStepDiffers) {
  Sample s = exact_claim_held(0);
  EXPECT_TRUE(s.ok());
  s.step_bitwise = false;
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(aggregate({s})[0].ok);
  s.step_bitwise = true;
  s.bitwise = false;
  EXPECT_FALSE(s.ok());
  Sample measured = exact_claim_held(0);
  measured.H = measured.hit = 51;
  measured.start = 34;
  measured.claims_exact = false;
  measured.bitwise = measured.step_bitwise = false;
  EXPECT_TRUE(measured.ok());
  EXPECT_TRUE(aggregate({measured})[0].ok);
  measured.finite = false;
  EXPECT_FALSE(measured.ok());
}

// The table `ced cache-hit` prints and writes: each cell under its own heading. Two seeds whose median KL,
// worst KL, top-1 and step KL all differ (2e-3, 3e-3, one seed of two, 5e-3), so a column shown twice or
// under a neighbour's heading is seen.
TEST(V41CacheHitRows, TheTableShowsEachCellUnderItsHeadingPrintedAndInMarkdown) {
  std::vector<Sample> samples;
  for (uint64_t seed : {0, 1}) {
    Sample s = exact_claim_held(seed);
    s.H = s.hit = 51;
    s.start = 34;
    s.claims_exact = false;  // measured: the window rebuilt from H - K
    s.bitwise = s.step_bitwise = false;
    s.kl = seed ? 3e-3 : 1e-3;
    s.top1 = seed == 0;
    s.step_kl = seed ? 6e-3 : 4e-3;
    samples.push_back(s);
  }
  const std::vector<Row> rows = aggregate(samples);
  ASSERT_EQ(rows.size(), 1u);
  // mode, H, rule, hit, start, K, claim, samples, bitwise, median KL, worst KL, top-1, step bitwise, step KL, verdict
  const std::vector<std::string> want = {"sglang", "51", "trtllm", "51", "34", "16", "measured", "2", "0/2",
                                         "2.000e-03", "3.000e-03", "0.50", "0/2", "5.000e-03", "ok"};
  const std::string printed = ced::tools::cache_hit::table(rows, false);
  const std::vector<std::string> printed_rows = lines_starting(printed, "sglang");
  ASSERT_EQ(printed_rows.size(), 1u) << printed;
  EXPECT_EQ(words(printed_rows[0]), want) << printed;
  const std::string md = ced::tools::cache_hit::table(rows, true);
  const std::vector<std::string> md_rows = lines_starting(md, "| sglang |");
  ASSERT_EQ(md_rows.size(), 1u) << md;
  std::vector<std::string> cells;
  std::stringstream ss(md_rows[0].substr(1));
  for (std::string c; std::getline(ss, c, '|');) cells.push_back(c.substr(1, c.size() - 2));
  EXPECT_EQ(cells, want) << md;
}

// rel L2 = sqrt(Σ(t - r)² / Σr²) over every element. A reference whose Σr² is below 1 (0.36) tells the quotient
// from the bare numerator (0.5 here) and from a test of Σr² against 1; one above 1 and a difference in the last
// element only show that every element counts.
TEST(V41Study, RelL2IsTheNormOfTheDifferenceOverTheReference) {
  const std::vector<double> t = {0.3, 0.4}, r = {0.6, 0.0};
  EXPECT_NEAR(ced::tools::rel_l2(t, r), std::sqrt(0.25 / 0.36), 1e-15);  // 0.8333
  const std::vector<double> t3 = {1, 2, 3}, r3 = {1, 2, 4};
  EXPECT_NEAR(ced::tools::rel_l2(t3, r3), std::sqrt(1.0 / 21.0), 1e-15);
  EXPECT_EQ(ced::tools::rel_l2(r3, r3), 0.0);
}

// Against a reference that is zero everywhere the quotient has no meaning: rel L2 is then the difference's own
// norm, sqrt(Σt²), not 0 and not NaN.
TEST(V41Study, RelL2AgainstAnAllZeroReferenceIsTheNormOfTheDifference) {
  const std::vector<double> t = {3, 4}, zero = {0, 0};
  EXPECT_EQ(ced::tools::rel_l2(t, zero), 5.0);
  EXPECT_EQ(ced::tools::rel_l2(zero, zero), 0.0);
}

// `ced verify`'s property section runs and reports: a check named runs on v41-tiny in both regimes, one line
// each, and a planted port bug is caught by its check (the cheap ones: the whole suite is `ced verify`'s).
TEST(V41VerifyProperties, EachCheckRunsOnV41TinyInBothRegimesAndAPlantedBugIsCaughtByItsCheck) {
  std::vector<std::string> failures;
  testing::internal::CaptureStdout();
  ced::tools::verify_v41_properties({"bounded = prefill when N <= W"},
                                    {{"ced-cut-floor-flipped", "vllm keeps layer E's tail exact"}}, failures);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(failures.empty()) << failures[0];
  EXPECT_EQ(lines_starting(out, "  ok   v41-tiny f64 bounded = prefill when N <= W").size(), 1u) << out;
  EXPECT_EQ(lines_starting(out, "  ok   v41-tiny release bounded = prefill when N <= W").size(), 1u) << out;
  const std::string caught = "  ok   ced-cut-floor-flipped    caught by \"vllm keeps layer E's tail exact\": ";
  EXPECT_EQ(lines_starting(out, caught).size(), 1u) << out;
  EXPECT_EQ(out.find("FAIL"), std::string::npos) << out;
}

// The other side: a bug set against a check that cannot see it (the floor of the cut layer flipped, against a
// prompt no longer than the window, which replays every row) is a failure of `ced verify`, and it reads
// "FAULT: the check passed with the bug planted".
TEST(V41VerifyProperties, ACheckThatPassesWithItsBugPlantedIsAFailureNamingTheFault) {
  std::vector<std::string> failures;
  testing::internal::CaptureStdout();
  ced::tools::verify_v41_properties({}, {{"ced-cut-floor-flipped", "bounded = prefill when N <= W"}}, failures);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(failures, std::vector<std::string>{"ced-cut-floor-flipped: the check passed with the bug planted"}) << out;
  EXPECT_EQ(lines_starting(out, "  FAIL ced-cut-floor-flipped ").size(), 1u) << out;
}

// `ced verify`'s drift summary: the FLOP ratio column holds the oracle's ratio for each convention's ced prefill
// (a number in (0, 1)) and "-" for each resume after a prefix-cache hit, which has none.
TEST(V41VerifyDrift, TheFlopRatioIsANumberForEachConventionAndADashForEachResume) {
  std::vector<std::string> failures;
  testing::internal::CaptureStdout();
  ced::tools::verify_v41_drift("v41-tiny", failures);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(failures.empty()) << failures[0];
  const std::vector<std::string> conventions = lines_starting(out, "  ced ");
  const std::vector<std::string> resumes = lines_starting(out, "  full, hit ");
  ASSERT_EQ(conventions.size(), 3u) << out;
  ASSERT_FALSE(resumes.empty()) << out;
  for (const std::string& line : conventions) {
    const double ratio = std::stod(words(line).back());
    EXPECT_GT(ratio, 0.0) << line;
    EXPECT_LT(ratio, 1.0) << line;
  }
  for (const std::string& line : resumes) EXPECT_EQ(words(line).back(), "-") << line;
}
