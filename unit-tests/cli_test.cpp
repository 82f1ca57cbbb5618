// The `ced` command line on bad input (exit 2, one line on stderr, no file
// left behind), and the gate and diff acceptance: a 1e-9 relative change of
// one golden element fails the gate naming the tensor; a fault placed in a
// known layer is named as the first divergent layer.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "unit-tests/run_ced.hpp"
#include "models/lab/hdf5_files.hpp"
#include "models/lab/weights.hpp"
#include "compare/run_compare.hpp"
#include "reference/lab/backend.hpp"
#include "golden/golden_set.hpp"

namespace fs = std::filesystem;
using namespace ced;

namespace {

using test::Result;

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("ced-cli-test-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}


Result run_ced(const std::string& args) { return test::run_ced_in(scratch(), args); }

void expect_usage_error(const std::string& args, const std::string& word) {
  const Result r = run_ced(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "want one line: " << r.err;
  EXPECT_NE(r.err.find(word), std::string::npos) << r.err;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

// Multiplies one element of a float64/float32 2-D dataset by (1 + rel).
void perturb(const fs::path& file, const std::string& dataset, int64_t row, int64_t col, double rel) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  hid_t s = H5Dget_space(d);
  hsize_t dims[2];
  H5Sget_simple_extent_dims(s, dims, nullptr);
  std::vector<double> v(dims[0] * dims[1]);
  H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  v[size_t(row) * dims[1] + size_t(col)] *= 1.0 + rel;
  H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(f);
}

}  // namespace

TEST(Cli, UnwritableOutputIsAUsageErrorAndLeavesNoFile) {
  expect_usage_error("run --config tiny --tokens 5 --out /nonexistent-dir/x.h5", "nonexistent-dir");
}

TEST(Cli, UnknownConfigKeyIsAUsageErrorNamingIt) {
  const Config c = builtin_config("tiny");
  write(scratch() / "bad.toml", to_toml(c) + "mystery_key = 1\n");
  expect_usage_error("run --config " + (scratch() / "bad.toml").string() + " --tokens 5 --out " +
                         (scratch() / "o.h5").string(),
                     "mystery_key");
  EXPECT_FALSE(fs::exists(scratch() / "o.h5"));
}

TEST(Cli, NanConfigValueIsAUsageError) {
  std::string t = to_toml(builtin_config("tiny"));
  t.replace(t.find("rms_eps = "), t.find('\n', t.find("rms_eps = ")) - t.find("rms_eps = "), "rms_eps = nan");
  write(scratch() / "nan.toml", t);
  expect_usage_error("oracle --config " + (scratch() / "nan.toml").string(), "rms_eps");
}

TEST(Cli, RunningTheLabModelAtTheReleasedSizesOnTheCpuIsRefusedWithAMemoryEstimate) {
  expect_usage_error("run --config lab-flash --tokens 16 --out " + (scratch() / "f.h5").string(), "GiB");
}

// Every command serves both families now (`ced replay-error` and `ced bench` on a v41 config:
// unit-tests/v41_cli_test.cpp); an option of one family given to the other's config is refused naming the
// family it belongs to, and no output is written.
TEST(Cli, AnOptionOfTheV41FamilyGivenALabConfigIsRefusedNamingItsFamily) {
  expect_usage_error("replay-error --config tiny --tokens 4 --convention vllm --out " + (scratch() / "v").string(),
                     "v41 family's");
  expect_usage_error("bench --config tiny --tokens 4 --regime bf16", "v41 family's");
  expect_usage_error("replay-error --config v41-tiny --tokens 4 --backend reference --out " + (scratch() / "v").string(),
                     "lab family's");
  EXPECT_FALSE(fs::exists(scratch() / "v.csv"));
}

TEST(Cli, BadLengthsAndModesAreUsageErrors) {
  const std::string out = " --out " + (scratch() / "x.h5").string();
  expect_usage_error("run --config tiny --tokens 0" + out, "--tokens");
  expect_usage_error("run --config tiny --tokens 5 --mode sideways" + out, "--mode");
  expect_usage_error("run --config tiny --tokens 5 --mode ced --replay 0" + out, "--replay");
  expect_usage_error("run --config tiny --tokens 5 --mode resume --prefix 9" + out, "--prefix");
  expect_usage_error("run --config nosuch --tokens 5" + out, "nosuch");
  expect_usage_error("frobnicate", "frobnicate");
}

TEST(Cli, NonHdf5AndTruncatedFilesAreUsageErrors) {
  write(scratch() / "text.h5", "not an hdf5 file\n");
  expect_usage_error("diff " + (scratch() / "text.h5").string() + " " + (scratch() / "text.h5").string(), "text.h5");
  const fs::path good = scratch() / "good.h5", cut = scratch() / "cut.h5";
  ASSERT_EQ(run_ced("run --config tiny --tokens 6 --out " + good.string()).code, 0);
  fs::copy_file(good, cut, fs::copy_options::overwrite_existing);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  expect_usage_error("diff " + cut.string() + " " + good.string(), "cut.h5");
  expect_usage_error("diff " + (scratch() / "missing.h5").string() + " " + good.string(), "missing.h5");
}

TEST(Cli, UnknownFormatVersionIsRefusedNamingTheRegenerateCommand) {
  const fs::path f = scratch() / "v3.h5";
  ASSERT_EQ(run_ced("run --config tiny --tokens 6 --out " + f.string()).code, 0);
  hid_t file = H5Fopen(f.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t a = H5Aopen(file, "format_version", H5P_DEFAULT);
  const int64_t three = kFileFormatVersion + 1;
  H5Awrite(a, H5T_NATIVE_INT64, &three);
  H5Aclose(a);
  H5Fclose(file);
  expect_usage_error("diff " + f.string() + " " + f.string(), "ced golden regenerate");
}

TEST(Cli, DiffOfARunAgainstItselfReportsZeroError) {
  const fs::path f = scratch() / "self.h5";
  ASSERT_EQ(run_ced("run --config small --tokens 20 --mode ced --decode 2 --capture layers --out " + f.string()).code, 0);
  const Result r = run_ced("diff " + f.string() + " " + f.string() + " --json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\"max_abs_err\":0,"), std::string::npos) << r.out.substr(0, 400);
  EXPECT_EQ(r.out.find("\"max_abs_err\":0."), std::string::npos);
  EXPECT_EQ(r.out.find("\"bitwise_equal\": false"), std::string::npos);
}

TEST(Cli, DiffNamesTheLayerWhereAFaultWasPlaced) {
  const Config c = builtin_config("small");
  auto be = make_reference_backend(c, 3, true);
  RunRequest r;
  r.n_prompt = 30;
  r.tokens = make_tokens(4, c.vocab_size, 30);
  r.capture_layers = true;
  const RunResult good = be->run(r);
  for (int64_t layer : {2, 5, 9}) {
    r.fault = Fault::SinkDropped;
    r.fault_layer = layer;
    const RunResult bad = be->run(r);
    const RunDiff d = diff_runs("full", bad, good, exact_policy());
    EXPECT_FALSE(d.pass());
    EXPECT_EQ(d.first_divergent_layer, layer);
    EXPECT_EQ(d.first_inexact_layer, layer);
  }
  // the same through the command line, from files
  RunFile f;
  f.generator = "cli_test";
  f.config = c;
  f.weight_seed = 3;
  f.token_seed = 4;
  f.tokens = r.tokens;
  f.runs = {{"full", good}};
  write_run_file(scratch() / "good-run.h5", f);
  r.fault_layer = 7;
  f.runs = {{"full", be->run(r)}};
  write_run_file(scratch() / "bad-run.h5", f);
  const Result cli = run_ced("diff " + (scratch() / "bad-run.h5").string() + " " + (scratch() / "good-run.h5").string());
  EXPECT_EQ(cli.code, 1);
  EXPECT_NE(cli.out.find("first divergent layer (over tolerance): 7"), std::string::npos) << cli.out;
}

TEST(Gate, OneElementChangedBy1e9RelativeFailsNamingTheTensor) {
  const fs::path dir = scratch() / "golden-copy";
  fs::create_directories(dir);
  for (const char* name : {"tiny.h5", "policy.toml"})
    fs::copy_file(golden::default_golden_dir() / name, dir / name, fs::copy_options::overwrite_existing);
  golden::GateOptions g;
  g.dir = dir;
  g.quiet = true;
  ASSERT_TRUE(golden::run_gate(g).failures.empty());
  // the largest-magnitude logit of the full run, multiplied by 1 + 1e-9
  const RunFile f = read_run_file(dir / "tiny.h5");
  const MatD& L = f.find_run("full")->result.logits;
  Eigen::Index row = 0, col = 0;
  L.cwiseAbs().maxCoeff(&row, &col);
  perturb(dir / "tiny.h5", "/runs/full/logits", row, col, 1e-9);
  const auto rep = golden::run_gate(g);
  ASSERT_EQ(rep.failures.size(), 1u);
  EXPECT_EQ(rep.failures[0].run, "full");
  EXPECT_NE(rep.failures[0].what.find("runs/full/logits"), std::string::npos) << rep.failures[0].what;
  EXPECT_NE(rep.failures[0].what.find(fmt::format("position {}, column {}", f.find_run("full")->result.positions[size_t(row)], col)),
            std::string::npos)
      << rep.failures[0].what;
}

// A golden directory's own policy file judges its runs (the default policy is
// the backend's file in --golden DIR, not in the repository's golden/): a
// 1e-9 relative change fails the shipped rtol of 1e-11 and passes a copy whose
// policy.toml allows 1e-6.
TEST(Gate, TheGoldenDirectorysOwnPolicyFileJudgesItsRuns) {
  const fs::path dir = scratch() / "golden-copy-loose";
  fs::create_directories(dir);
  fs::copy_file(golden::default_golden_dir() / "tiny.h5", dir / "tiny.h5", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "policy.toml") << "[[rule]]\npattern = \"runs/*/layers/*/topk\"\nreason = \"this test\"\n"
                                        "min_jaccard = 1\n\n[[rule]]\npattern = \"**\"\n"
                                        "reason = \"this test: 1e-6 relative passes a 1e-9 change\"\nrtol = 1e-6\n";
  const RunFile f = read_run_file(dir / "tiny.h5");
  const MatD& L = f.find_run("full")->result.logits;
  Eigen::Index row = 0, col = 0;
  L.cwiseAbs().maxCoeff(&row, &col);
  perturb(dir / "tiny.h5", "/runs/full/logits", row, col, 1e-9);
  golden::GateOptions g;
  g.dir = dir;
  g.only = "tiny.h5:full";
  g.quiet = true;
  const auto loose = golden::run_gate(g);
  EXPECT_TRUE(loose.failures.empty()) << loose.failures[0].what;
  EXPECT_EQ(loose.passed, 1);
  g.policy = (golden::default_golden_dir() / "policy.toml").string();
  EXPECT_EQ(golden::run_gate(g).failures.size(), 1u) << "the shipped policy must fail the change";
}

// The failure line gives the largest absolute error with its place and both values, also when that
// place is the tensor's first element (flat index 0).
TEST(Gate, MaxAbsErrorInTheFirstElementIsNamedWithItsPlaceAndValues) {
  const fs::path dir = scratch() / "golden-copy-first";
  fs::create_directories(dir);
  for (const char* name : {"tiny.h5", "policy.toml"})
    fs::copy_file(golden::default_golden_dir() / name, dir / name, fs::copy_options::overwrite_existing);
  const RunFile f = read_run_file(dir / "tiny.h5");
  const double was = f.find_run("full")->result.logits(0, 0);
  ASSERT_NE(was, 0.0) << "the plant must change the value";
  perturb(dir / "tiny.h5", "/runs/full/logits", 0, 0, 1e-6);
  golden::GateOptions g;
  g.dir = dir;
  g.quiet = true;
  const auto rep = golden::run_gate(g);
  ASSERT_EQ(rep.failures.size(), 1u);
  // the gate reran the unchanged model, so its value is the one the file held before the plant
  EXPECT_NE(rep.failures[0].what.find(fmt::format("(max abs error at position {}, column 0: {:.17g} vs {:.17g})",
                                                  f.find_run("full")->result.positions[0], was, was * (1.0 + 1e-6))),
            std::string::npos)
      << rep.failures[0].what;
}

TEST(Gate, FaultedModelFailsWithTheFirstDivergentLayer) {
  golden::GateOptions g;
  g.dir = golden::default_golden_dir();
  g.only = "small.h5:full";
  g.quiet = true;
  g.fault = Fault::SinkDropped;
  const auto rep = golden::run_gate(g);
  ASSERT_EQ(rep.failures.size(), 1u);
  EXPECT_NE(rep.failures[0].what.find("first divergent layer 0"), std::string::npos) << rep.failures[0].what;
  EXPECT_NE(rep.failures[0].reproduce.find("--only small.h5:full --fault sink-dropped"), std::string::npos);
}
