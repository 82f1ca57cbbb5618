// The commands beyond run, diff and gate, end to end through the `ced` binary (docs/spec.md §10): `ced oracle`
// prints the library's table for the same arguments and keeps its documented defaults, `ced spans`
// prints the plan's spans (capped by N and P) and finds them on the model, `ced bench` prints one
// row per phase and the oracle's FLOP ratio, `ced merge` refuses a shard whose config differs in a key
// (named) or whose attributes are malformed, and each refuses bad arguments with exit 2 and one line.
// Written for the mutation pass (docs/mutation.md): these lines were unguarded before.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <fstream>
#include <functional>
#include <sstream>

#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"
#include "models/lab/weights.hpp"
#include "oracle/analytic.hpp"
#include "checks/replay_sweep.hpp"
#include "backends/registry.hpp"
#include "golden/golden_set.hpp"
#include "unit-tests/run_ced.hpp"
#include "models/lab/hdf5_files.hpp"

namespace fs = std::filesystem;
using namespace ced;

namespace {

using test::Result;
using test::slurp;

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("ced-cli-commands-test-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}


Result run_ced(const std::string& args) { return test::run_ced_in(scratch(), args); }

void expect_usage_error(const std::string& args, const std::string& word) {
  const Result r = run_ced(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "want one line: " << r.err;
  EXPECT_NE(r.err.find(word), std::string::npos) << r.err;
}

// The line of `text` that starts with `prefix` (after leading blanks), or "".
std::string line_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t b = line.find_first_not_of(' ');
    if (b != std::string::npos && line.compare(b, prefix.size(), prefix) == 0) return line;
  }
  return "";
}

// The integers printed after the label of a `ced spans` row: the oracle's, then (with --empirical)
// the found one.
std::vector<long long> span_row(const std::string& out, const std::string& label) {
  const std::string line = line_starting(out, label);
  std::vector<long long> v;
  if (line.empty()) return v;
  std::istringstream in(line.substr(label.size()));
  for (std::string w; in >> w;) {
    char* end = nullptr;
    const long long x = std::strtoll(w.c_str(), &end, 10);
    if (end && *end == '\0' && !w.empty()) v.push_back(x);
  }
  return v;
}

const char* kLast = "decoder: exact last-position logits, R = 1 + D(W-1)";
const char* kDecode = "decoder: exact next decode step, D(W-1)";
const char* kEncHidden = "encoder resume: exact H_E at P-1, 1 + E(W-1)";
const char* kEncNext = "encoder resume: exact first new position, E(W-1)";

}  // namespace

TEST(OracleCommand, JsonIsTheLibrarysTableForTheGivenLengthsAndPrefix) {
  const Config c = load_config("tiny");
  const Result r = run_ced("oracle --config tiny --tokens 40 100 --prefix 9 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, oracle_table_json(oracle_table(c, {40, 100}, 9)) + "\n");
  // and the library's JSON itself is plain: the config's name as written, unescaped where nothing needs it
  EXPECT_EQ(r.out.rfind("{\n  \"config\": \"tiny\",\n", 0), 0u) << r.out;
  // --prefix 0 is a prefix of 0, not "the default"
  const Result r0 = run_ced("oracle --config tiny --tokens 40 --prefix 0 --json");
  ASSERT_EQ(r0.code, 0) << r0.err;
  EXPECT_EQ(r0.out, oracle_table_json(oracle_table(c, {40}, 0)) + "\n");
}

TEST(OracleCommand, DefaultsAreThreeLengthsAndPrefixFourW) {
  const Config c = load_config("tiny");
  const Result r = run_ced("oracle --config tiny");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, format_oracle_table(oracle_table(c, {256, 32768, 1000000}, 4 * c.window)));
  // the cone's rows read k, then the layer E + k, then B_k = 1 + (k+1)(W-1): tiny has E = 4, W = 4
  EXPECT_NE(r.out.find("     k  layer      B_k\n     0      4        4\n     1      5        7\n"), std::string::npos)
      << r.out;
}

// Hand values (tiny: E = 4, W = 4; docs/spec.md §6.2, §7.2): a prefix shorter than W is replayed
// whole, min(P, W) = P positions at each encoder layer; the text and the JSON say so.
TEST(OracleCommand, EncoderReplayOfAPrefixShorterThanWIsThePrefix) {
  for (const auto& [P, span, work] : std::vector<std::array<int, 3>>{{3, 3, 12}, {1, 1, 4}, {0, 0, 0}}) {
    const Result j = run_ced(fmt::format("oracle --config tiny --tokens 20 --prefix {} --json", P));
    ASSERT_EQ(j.code, 0) << j.err;
    EXPECT_NE(j.out.find(fmt::format("\"prefix_len\": {}, \"bounded_span\": {}, \"bounded_work\": {},", P, span, work)),
              std::string::npos)
        << j.out;
  }
  const Result t = run_ced("oracle --config tiny --tokens 20 --prefix 3");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(span_row(t.out, "bounded span min(P, W)"), std::vector<long long>{3}) << t.out;
  EXPECT_EQ(span_row(t.out, "its work E·min(P, W) (position-layers)"), std::vector<long long>{12}) << t.out;
}

TEST(SpansCommand, OracleColumnIsThePlansSpans) {
  const Plan p = make_plan(load_config("tiny"));
  const Result r = run_ced("spans --config tiny");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(fmt::format("config tiny: L = {}, E = {}, D = {}, W = {}", p.L, p.E, p.D, p.W)),
            std::string::npos)
      << r.out;
  // The default N lies past every span and P past the encoder's, so nothing is capped.
  EXPECT_EQ(span_row(r.out, kLast), std::vector<long long>{1 + p.D * (p.W - 1)}) << r.out;
  EXPECT_EQ(span_row(r.out, kDecode), std::vector<long long>{std::max<int64_t>(1, p.D * (p.W - 1))}) << r.out;
  EXPECT_EQ(span_row(r.out, kEncHidden), std::vector<long long>{1 + p.E * (p.W - 1)}) << r.out;
  EXPECT_EQ(span_row(r.out, kEncNext), std::vector<long long>{std::max<int64_t>(1, p.E * (p.W - 1))}) << r.out;
}

TEST(SpansCommand, SpansAreCappedByTheGivenNAndP) {
  const Plan p = make_plan(load_config("tiny"));
  ASSERT_GT(1 + p.D * (p.W - 1), 3) << "the caps below must bind";
  ASSERT_GT(1 + p.E * (p.W - 1), 2);
  const Result r = run_ced("spans --config tiny --tokens 3 --prefix 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(span_row(r.out, kLast), std::vector<long long>{3}) << r.out;
  EXPECT_EQ(span_row(r.out, kDecode), std::vector<long long>{3}) << r.out;
  EXPECT_EQ(span_row(r.out, kEncHidden), std::vector<long long>{2}) << r.out;
  EXPECT_EQ(span_row(r.out, kEncNext), std::vector<long long>{2}) << r.out;
}

TEST(SpansCommand, EmpiricalSearchFindsTheOracleSpansOnTiny) {
  const Plan p = make_plan(load_config("tiny"));
  const Result r = run_ced("spans --config tiny --empirical");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::vector<long long> last = span_row(r.out, kLast);
  ASSERT_EQ(last.size(), 2u) << r.out;
  EXPECT_EQ(last[0], 1 + p.D * (p.W - 1));
  EXPECT_EQ(last[1], last[0]);
  for (const char* label : {kDecode, kEncHidden, kEncNext}) {
    const std::vector<long long> v = span_row(r.out, label);
    ASSERT_EQ(v.size(), 2u) << label << "\n" << r.out;
    EXPECT_EQ(v[0], v[1]) << label;
  }
  EXPECT_FALSE(line_starting(r.out, "decoder: last logits bitwise equal, plain arithmetic").empty()) << r.out;
}

// The verdict of `ced spans --empirical` is every row's: a model that breaks only the decoder's spans
// (its replay start ignored, so every replay length looks exact and the search finds 1) fails it, although
// the encoder rows, printed after them, agree. The hidden --fault plants the difference, as in `ced run`.
TEST(SpansCommand, MismatchedDecoderRowsFailTheEmpiricalVerdictWhenTheLaterRowsAgree) {
  const Result r = run_ced("spans --config tiny --empirical --fault replay-start-ignored");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  for (const char* label : {kLast, kDecode}) {
    const std::vector<long long> v = span_row(r.out, label);
    ASSERT_EQ(v.size(), 2u) << label << "\n" << r.out;
    EXPECT_EQ(v[1], 1) << label << "\n" << r.out;
    EXPECT_NE(line_starting(r.out, label).find("MISMATCH"), std::string::npos) << label << "\n" << r.out;
  }
  // the planted difference is confined to the decoder rows, so the last rows cannot carry the verdict
  for (const char* label : {kEncHidden, kEncNext})
    EXPECT_NE(line_starting(r.out, label).find(" ok"), std::string::npos) << label << "\n" << r.out;
}

TEST(SpansCommand, UnknownFaultIsAUsageError) { expect_usage_error("spans --config tiny --fault bogus", "--fault"); }

TEST(SpansCommand, EmpiricalPrefixAtOrPastNIsAUsageError) {
  expect_usage_error("spans --config tiny --empirical --tokens 10 --prefix 10", "--prefix");
}

// `ced verify` on tiny, its drift skipped, against a golden directory of tiny.h5 alone (the one slow test
// of this file, about 7 s of CPU: the property checks on tiny and small): every check is listed ok and
// the command passes; the CUDA section gates the device backends of the registry (each gated or skipped
// with its reason), never a CPU backend.
TEST(VerifyCommand, PassesOnTinyWithEveryCheckOkAndGatesOnlyDeviceBackendsAsCuda) {
  const fs::path golden_dir = scratch() / "golden-tiny";
  fs::create_directories(golden_dir);
  for (const auto& e : fs::directory_iterator(golden::default_golden_dir()))
    if (e.path().extension() == ".toml" || e.path().filename() == "tiny.h5")
      fs::copy_file(e.path(), golden_dir / e.path().filename(), fs::copy_options::overwrite_existing);
  const Result r = run_ced("verify --config tiny --skip-drift --golden " + golden_dir.string());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\nPASS: every check passed ("), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  // 12 property checks on each of tiny and small, each listed ok
  size_t ok_rows = 0;
  for (size_t at = r.out.find("\n  ok   "); at != std::string::npos; at = r.out.find("\n  ok   ", at + 1)) ++ok_rows;
  EXPECT_EQ(ok_rows, 24u) << r.out;
  const size_t n = read_run_file(golden_dir / "tiny.h5").runs.size();
  EXPECT_NE(r.out.find(fmt::format("  {} runs, {} passed, 0 not supported\n", n, n)), std::string::npos) << r.out;
  const size_t from = r.out.find("== CUDA side by side\n"), to = r.out.find("\n== summary");
  ASSERT_NE(from, std::string::npos) << r.out;
  ASSERT_NE(to, std::string::npos) << r.out;
  const std::string cuda = r.out.substr(from, to - from);
  for (const auto& e : backend_table()) {
    const bool listed = cuda.find("\n  " + e.name + ": ") != std::string::npos;
    EXPECT_EQ(listed, e.host_bytes_per_value == 0) << e.name << "\n" << cuda;
  }
}

// A gate that reran nothing has not passed: a folder with the policies but no golden file is refused in one
// line (exit 2) that says what is missing, no .h5 file, and where; without that refusal the later guard of
// a gate of 0 runs would say that the folder's .h5 files hold no run. The lab section of `ced verify` runs
// this gate.
TEST(GateCommand, AFolderWithItsPoliciesButNoGoldenFileIsRefusedForHavingNoH5File) {
  const fs::path dir = scratch() / "golden-none";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(golden::default_golden_dir()))
    if (e.path().extension() == ".toml")
      fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  expect_usage_error("gate --golden " + dir.string(), "no .h5 files in '" + dir.string() + "'");
}

TEST(BenchCommand, PrintsEachPhaseAndTheOracleRatio) {
  const Config c = load_config("tiny");
  const Plan p = make_plan(c);
  const int64_t N = 24;
  const Result r = run_ced(fmt::format("bench --config tiny --tokens {} --decode 2 --repeat 2", N));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const char* phase : {"prefill-full", "prefill-ced", "decode"}) {
    const std::string line = line_starting(r.out, fmt::format("{:<14} {}", "reference", phase));
    ASSERT_FALSE(line.empty()) << phase << "\n" << r.out;
    double secs = -1, median = -1, tps = -1, gflop = -1, rate = -1, peak = -1;
    ASSERT_EQ(std::sscanf(line.c_str() + 28, "%lf %lf %lf %lf %lf %lf", &secs, &median, &tps, &gflop, &rate, &peak), 6)
        << line;
    // A tiny run takes well under a minute; the 1e300 start value of the best time means no run was timed.
    EXPECT_GE(secs, 0) << line;
    EXPECT_LT(secs, 60) << line;
    EXPECT_LE(secs, median) << line;  // the minimum of the repeats is at most their median
  }
  const RatioFlops m = exact_ratio_flops(c, p, N);
  EXPECT_NE(r.out.find(fmt::format("FLOP model ratio {:.4f}, ideal 1/2 + B/(2N) = {:.4f}", m.ratio(),
                                   ideal_ratio(p, N))),
            std::string::npos)
      << r.out;
}

// --json: every phase of a backend that ran, with seconds x tokens/s = the
// phase's tokens (8 prompt tokens each prefill, 2 decode steps), and every
// backend that could not run with its reason.
TEST(BenchCommand, JsonHoldsEveryPhaseAndWhatCouldNotRun) {
  const fs::path j = scratch() / "bench.json";
  const Result r = run_ced("bench --config tiny --tokens 8 --decode 2 --backend reference --backend cuda-bf16 --json " +
                           j.string());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string s = slurp(j.string());
  EXPECT_EQ(s.rfind("{\"config\": \"tiny\", \"n_prompt\": 8, \"decode\": 2,", 0), 0u) << s;
  std::map<std::string, double> gflop;
  for (const auto& [phase, tokens] : {std::pair{"prefill-full", 8}, {"prefill-ced", 8}, {"decode", 2}}) {
    const std::string key = fmt::format("\"backend\": \"reference\", \"phase\": \"{}\", \"seconds\": ", phase);
    const size_t at = s.find(key);
    ASSERT_NE(at, std::string::npos) << phase << "\n" << s;
    double secs = 0, median = 0, a0 = 0, a1 = 0, a2 = 0, tps = 0, g = 0;
    ASSERT_EQ(std::sscanf(s.c_str() + at + key.size(),
                          "%lf, \"median_seconds\": %lf, \"all_seconds\": [%lf, %lf, %lf], \"tokens_per_s\": %lf, "
                          "\"gflop\": %lf",
                          &secs, &median, &a0, &a1, &a2, &tps, &g),
              7)
        << s;
    // three repeats (the default): the minimum and the median of the three
    // listed, within the 6 significant digits they are printed to
    const double lo = std::min({a0, a1, a2}), mid = std::max(std::min(a0, a1), std::min(std::max(a0, a1), a2));
    EXPECT_NEAR(secs, lo, lo * 1e-5) << s;
    EXPECT_NEAR(median, mid, mid * 1e-5) << s;
    // both printed to 6 significant digits: the product is the token count within 1e-5
    EXPECT_NEAR(secs * tps, tokens, tokens * 1e-5) << phase << "\n" << s;
    gflop[phase] = g;
  }
  // the decode row counts the 2 decode steps only, not the ced prefill before them
  EXPECT_LT(gflop["decode"], gflop["prefill-ced"]) << s;
  EXPECT_LT(gflop["prefill-ced"], gflop["prefill-full"]) << s;
  EXPECT_NE(s.find("\"not_supported\": [{\"backend\": \"cuda-bf16\", \"why\": \"backend cuda-bf16: "),
            std::string::npos)
      << s;
}

// Validate, then benchmark: a backend whose warm-up run disagrees with
// reference-f64 under its policy gets no figure, and the command fails.
TEST(BenchCommand, ABackendThatFailsValidationGetsNoFigures) {
  const fs::path j = scratch() / "bench-invalid.json";
  const Result good = run_ced("bench --config tiny --tokens 12 --decode 0 --repeat 1");
  ASSERT_EQ(good.code, 0) << good.out << good.err;
  EXPECT_NE(good.out.find("  PASS runs/full/logits"), std::string::npos) << good.out;
  const Result bad =
      run_ced("bench --config tiny --tokens 12 --decode 0 --repeat 1 --fault sink-dropped --json " + j.string());
  EXPECT_EQ(bad.code, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("  FAIL runs/full/logits"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("reference      invalid: no figures"), std::string::npos) << bad.out;
  EXPECT_TRUE(line_starting(bad.out, fmt::format("{:<14} {}", "reference", "prefill-full")).empty()) << bad.out;
  const std::string s = slurp(j.string());
  EXPECT_NE(s.find("\"rows\": [], \"summary\": [], \"invalid\": [\"reference\"]"), std::string::npos) << s;
}

// The f32 reference is where every calibration comes from, so a bound made
// from its own error would grow with that error and could not fail it: ced
// bench judges it under the fixed bounds of policy-f32-fixed.toml (the
// sink-dropped plant above fails them), and computes no calibration for it.
TEST(BenchCommand, TheF32ReferenceIsJudgedUnderFixedBoundsNotItsOwnError) {
  const Result r = run_ced("bench --config tiny --tokens 12 --decode 0 --repeat 1");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("reference      validation against reference-f64 (full, N = 12, last position) under "
                       "policy-f32-fixed.toml:"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  PASS runs/full/logits (rule runs/*/logits: f32 reference, no independent calibration"),
            std::string::npos)
      << r.out;
}

// Neither the f64 reference (judged bitwise) nor the f32 reference (the calibration's source) is handed a
// calibration: a self-calibrating policy put in place of either's is refused with the policy's own line,
// not fed the f32 reference's error (which would bound the f32 reference by itself).
TEST(BenchCommand, TheUncalibratedBackendsAreGivenNoCalibration) {
  const fs::path dir = scratch() / "golden-calibrating";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(golden::default_golden_dir()))
    if (e.path().extension() == ".toml") fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  for (const char* own : {"policy.toml", "policy-f32-fixed.toml"})
    fs::copy_file(golden::default_golden_dir() / "policy-calibrated.toml", dir / own, fs::copy_options::overwrite_existing);
  for (const char* backend : {"reference-f64", "reference"}) {
    const Result r = run_ced(fmt::format("bench --config tiny --tokens 12 --decode 0 --repeat 1 --backend {} --golden {}",
                                         backend, dir.string()));
    EXPECT_EQ(r.code, 2) << backend << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find("is self-calibrating: it needs the reference's f32-vs-f64 error"), std::string::npos)
        << backend << "\n" << r.err;
  }
}

// What the validation judges against is the f64 reference: the f32
// reference's measured error there, printed and in the JSON, is its error
// against reference-f64 computed here the plain way (nonzero: f32 is not
// exact), not the zero of a comparison with itself.
TEST(BenchCommand, TheF32ReferenceIsMeasuredAgainstTheF64Reference) {
  const int64_t N = 12;
  const fs::path j = scratch() / "bench-validation.json";
  const Result r = run_ced(fmt::format("bench --config tiny --tokens {} --decode 0 --repeat 1 --json {}", N, j.string()));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const Config c = load_config("tiny");
  RunRequest q;  // bench's validation run: full mode, the last position's logits, seeds 0
  q.n_prompt = N;
  q.logits = LogitsScope::Last;
  q.tokens = make_tokens(0, c.vocab_size, N);
  const RunResult r32 = make_backend("reference", c, 0)->run(q), r64 = make_backend("reference-f64", c, 0)->run(q);
  ASSERT_EQ(r32.logits.size(), c.vocab_size);
  double diff2 = 0, ref2 = 0, max_abs = 0;
  for (Eigen::Index i = 0; i < r64.logits.size(); ++i) {
    const double d = r32.logits.data()[i] - r64.logits.data()[i];
    diff2 += d * d;
    ref2 += r64.logits.data()[i] * r64.logits.data()[i];
    max_abs = std::max(max_abs, std::abs(d));
  }
  const double rel_l2 = std::sqrt(diff2 / ref2);
  ASSERT_GT(rel_l2, 0);
  const std::string line = line_starting(r.out, "measured: rel_l2 ");
  double got_rel = -1, got_max = -1;
  ASSERT_EQ(std::sscanf(line.c_str(), " measured: rel_l2 %lf, max_abs %lf", &got_rel, &got_max), 2) << r.out;
  // printed to 6 significant digits
  EXPECT_NEAR(got_rel, rel_l2, rel_l2 * 1e-5) << line;
  EXPECT_NEAR(got_max, max_abs, max_abs * 1e-5) << line;
  const std::string s = slurp(j.string());
  const std::string key = "\"validated_against\": \"reference-f64\", \"validation_rel_l2\": ";
  const size_t at = s.find(key);
  ASSERT_NE(at, std::string::npos) << s;
  EXPECT_NEAR(std::strtod(s.c_str() + at + key.size(), nullptr), rel_l2, rel_l2 * 1e-12) << s;
}

TEST(BenchCommand, NoDecodeRowWithoutDecodeSteps) {
  const Result r = run_ced("bench --config tiny --tokens 8 --decode 0");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_FALSE(line_starting(r.out, fmt::format("{:<14} {}", "reference", "prefill-ced")).empty()) << r.out;
  EXPECT_TRUE(line_starting(r.out, fmt::format("{:<14} {}", "reference", "decode")).empty()) << r.out;
}

TEST(BenchCommand, BadLengthsAndRepeatsAreUsageErrors) {
  expect_usage_error("bench --config tiny --tokens 0", "--tokens");
  expect_usage_error("bench --config tiny --tokens 8 --decode -1", "--decode");
  expect_usage_error("bench --config tiny --tokens 8 --repeat 0", "--repeat");
}

TEST(ReplayErrorCommand, WritesTheSweepsCsvAndSvgForTheGivenOptions) {
  const Config c = load_config("tiny");
  const fs::path prefix = scratch() / "drift";
  // N = 1 is the smallest valid length; two decode steps, one resume prefix.
  const Result r = run_ced("replay-error --config tiny --tokens 1 5 --decode 2 --prefix 2 --out " + prefix.string());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  prop::SweepOptions o;
  o.lengths = {1, 5};
  o.decode = 2;
  o.prefixes = {2};
  const auto rows = prop::replay_sweep(c, o);
  EXPECT_EQ(slurp(prefix.string() + ".csv"), prop::drift_csv(rows));
  EXPECT_EQ(slurp(prefix.string() + ".svg"), prop::drift_svg(rows, "CED bounded replay drift, config tiny"));
  EXPECT_NE(r.out.find(prop::drift_table(rows)), std::string::npos) << r.out;
  // The HDF5 table holds the same rows as the CSV, column by column, the bitwise verdict as 1 or 0: the rows
  // hold both verdicts (N = 1 replays all of itself, N = 5 > W = 4 does not), so a constant column is seen.
  const TableFile t = read_table_file(prefix.string() + ".h5", {"kind_legend", "backend"}, {});
  ASSERT_EQ(t.columns.size(), 11u);
  const std::vector<std::string> kinds = {"prefill", "layer", "decode", "resume", "resume-decode"};
  const std::vector<std::pair<std::string, std::function<double(const prop::DriftRow&)>>> want = {
      {"kind", [&](const auto& w) { return double(std::find(kinds.begin(), kinds.end(), w.kind) - kinds.begin()); }},
      {"n_prompt", [](const auto& w) { return double(w.n_prompt); }},
      {"replay", [](const auto& w) { return double(w.replay); }},
      {"prefix", [](const auto& w) { return double(w.prefix); }},
      {"layer", [](const auto& w) { return double(w.layer); }},
      {"step", [](const auto& w) { return double(w.step); }},
      {"rel_l2", [](const auto& w) { return w.rel_l2; }},
      {"max_abs", [](const auto& w) { return w.max_abs; }},
      {"kl", [](const auto& w) { return w.kl; }},
      {"top1", [](const auto& w) { return w.top1; }},
      {"bitwise_exact", [](const auto& w) { return w.exact ? 1.0 : 0.0; }}};
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(t.columns[k].first, want[k].first);
    ASSERT_EQ(t.columns[k].second.size(), rows.size()) << want[k].first;
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_EQ(t.columns[k].second[i], want[k].second(rows[i])) << want[k].first << " row " << i;
  }
  EXPECT_TRUE(std::any_of(rows.begin(), rows.end(), [](const auto& w) { return w.exact; }));
  EXPECT_TRUE(std::any_of(rows.begin(), rows.end(), [](const auto& w) { return !w.exact; }));
  // Progress goes to stderr, one line per step when stderr is not a terminal (a log file, CI): every line
  // ends there, none is empty (the terminal's closing newline is for a bar redrawn in place).
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.back(), '\n') << r.err;
  EXPECT_EQ(r.err.find("\n\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err[0], '\n') << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
}

TEST(ReplayErrorCommand, LengthsBelowOneAndNoDecodeStepsAreUsageErrors) {
  const std::string out = " --out " + (scratch() / "bad-drift").string();
  expect_usage_error("replay-error --config tiny --tokens 0" + out, "--tokens");
  expect_usage_error("replay-error --config tiny --tokens 4 --decode 0" + out, "--decode");
  EXPECT_FALSE(fs::exists(scratch() / "bad-drift.csv"));
}

TEST(CommandLine, UnknownCommandIsNamedWithTheListOfCommands) {
  const Result r = run_ced("frobnicate --config tiny");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err, "ced: error: unknown command 'frobnicate' (commands: verify, run, diff, gate, oracle, spans, "
                   "replay-error, golden, bench, export, replay-budget, merge, cache-hit, migrate)\n");
}

// `ced` alone: no command to look up (argv[1] does not exist), a usage error, never a crash.
TEST(CommandLine, NoArgumentsIsAUsageErrorNotACrash) {
  const Result r = run_ced("");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(r.err, "ced: error: A subcommand is required (see ced --help)\n");
}

TEST(CommandLine, BadOptionOfAKnownCommandIsNotAnUnknownCommand) {
  for (const char* args : {"oracle --config tiny --frobnicate", "--frobnicate"}) {
    const Result r = run_ced(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.find("unknown command"), std::string::npos) << args << ": " << r.err;
    EXPECT_NE(r.err.find("(see ced --help)"), std::string::npos) << args << ": " << r.err;
  }
}

TEST(BenchCommand, DecodeStepsCountTowardTheMemoryCheck) {
  // 8 prompt tokens of tiny fit anywhere; 8 + 1e9 positions need hundreds of GiB: refused before any work.
  expect_usage_error("bench --config tiny --tokens 8 --decode 1000000000", "needs about");
}

TEST(RunCommand, ThroughputCountsPromptAndDecodeTokens) {
  const fs::path out = scratch() / "throughput.h5";
  const Result r = run_ced("run --config small --tokens 200 --decode 200 --logits last --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  double secs = 0, tps = 0;
  bool found = false;
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);)
    if (std::sscanf(l.c_str(), "%lf s, %lf tokens/s", &secs, &tps) == 2) found = true;
  ASSERT_TRUE(found) << r.out;
  // secs is printed to 1 ms; a 400-position run of small takes far longer than 20 ms, so the
  // rounding stays under 5 %, and tokens/s * secs must give N + decode = 400, not N = 200.
  ASSERT_GT(secs, 0.02) << r.out;
  EXPECT_NEAR(tps * secs, 400, 400 * 0.05) << r.out;
}

namespace {

// The root attributes of a `ced replay-budget --shard` file (docs/spec.md §9.3).
const std::vector<std::string> kShardAttrs = {"backend",        "weight_seeds",        "token_seeds", "lengths",
                                              "replays",        "decode",              "bootstrap_seed",
                                              "bootstrap_resamples", "kind_legend",    "exact_replay",
                                              "exact_decode_replay", "shard"};

// Shards 0/2 and 1/2 of a small study of tiny (N = 6, 2 token seeds, no decode: well under a
// second each), made once.
const std::vector<fs::path>& two_shards() {
  static const std::vector<fs::path> files = [] {
    std::vector<fs::path> f;
    for (int i : {0, 1}) {
      const fs::path out = scratch() / fmt::format("shard-{}", i);
      const Result r = run_ced(fmt::format(
          "replay-budget --config tiny --tokens 6 --token-seeds 2 --decode 0 --shard {}/2 --out {}", i, out.string()));
      EXPECT_EQ(r.code, 0) << r.out << r.err;
      f.push_back(out.string() + ".h5");
    }
    return f;
  }();
  return files;
}

// A copy of `shard` named `name`, with `edit` applied to what it holds.
fs::path edited_shard(const fs::path& shard, const std::string& name, const std::function<void(TableFile&)>& edit) {
  TableFile t = read_table_file(shard, kShardAttrs, {"samples", "timings"});
  edit(t);
  const fs::path out = scratch() / name;
  write_table_file(out, t);
  return out;
}

void set_attr(TableFile& t, const std::string& name, const std::string& value) {
  for (auto& [k, v] : t.attrs)
    if (k == name) v = value;
}

void expect_refused(const Result& r, const std::vector<std::string>& words) {
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "want one line: " << r.err;
  for (const std::string& w : words) EXPECT_NE(r.err.find(w), std::string::npos) << w << " not in: " << r.err;
}

}  // namespace

TEST(MergeCommand, TheTwoShardsMerge) {
  const auto& s = two_shards();
  const Result r = run_ced(fmt::format("merge {} {} --out {}", s[1].string(), s[0].string(),
                                       (scratch() / "merged").string()));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  // An edited copy that changes nothing merges too: the refusals below are the edits'.
  const fs::path same = edited_shard(s[1], "shard-1-same.h5", [](TableFile&) {});
  EXPECT_EQ(run_ced(fmt::format("merge {} {} --out {}", s[0].string(), same.string(),
                                (scratch() / "merged-same").string()))
                .code,
            0);
}

// docs/spec.md §10: a shard of another config is refused, and a config is its keys: a shard whose
// config keeps the name "tiny" with another window (a file edited by hand, or written by another
// build of the built-in) is not a shard of this study, and the message names the key.
TEST(MergeCommand, AShardWithTheSameConfigNameAndAnotherKeyIsRefusedNamingTheKey) {
  const auto& s = two_shards();
  const fs::path other = edited_shard(s[1], "shard-1-window.h5", [](TableFile& t) { t.config.window = 8; });
  ASSERT_EQ(read_table_file(other, kShardAttrs, {}).config.name, "tiny");
  const Result r = run_ced(fmt::format("merge {} {} --out {}", s[0].string(), other.string(),
                                       (scratch() / "merged-window").string()));
  expect_refused(r, {"window is 8 in '" + other.string() + "', 4 in '" + s[0].string() + "'", "not shards of one study"});
  EXPECT_FALSE(fs::exists(scratch() / "merged-window.csv"));
}

// An attribute holding a list of whole numbers (docs/spec.md §9.3) with an empty item, nothing at
// all, a sign or a number past its type is malformed input: exit 2 and one line naming the
// attribute, not an internal error. Both shards carry the edit, so the shards agree and the list
// itself is what is read.
TEST(MergeCommand, AMalformedNumberListInAShardIsAnInputErrorNamingTheAttribute) {
  const auto& s = two_shards();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"lengths", "6,,6"},     {"lengths", "6,"},        {"lengths", ""},           {"lengths", "99999999999999999999"},
      {"token_seeds", "-1,0"}, {"weight_seeds", "18446744073709551616"},         {"shard", "0/"},
      {"bootstrap_seed", ""}};
  int k = 0;
  for (const auto& [name, value] : cases) {
    SCOPED_TRACE(name + " = '" + value + "'");
    std::vector<std::string> files;
    for (int i : {0, 1}) {
      const fs::path shard = s[size_t(i)];
      files.push_back(edited_shard(shard, fmt::format("shard-{}-bad-{}.h5", i, k), [&](TableFile& t) {
                        set_attr(t, name, name == "shard" ? (i == 0 ? value : "1/2") : value);
                      }).string());
    }
    ++k;
    const Result r = run_ced(fmt::format("merge {} {} --out {}", files[0], files[1], (scratch() / "merged-bad").string()));
    expect_refused(r, {"attribute '" + name + "'"});
  }
}
