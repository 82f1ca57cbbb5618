// The gate's summary driver (models/v41/agreement_summary.cpp, docs/v41.md §12.4), run as a user runs it:
// it passes only when it judged at least one file and every file is within every bound, and a file
// outside one is named with its first failure. Nothing judged is no pass.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "models/v41/run_file.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kGolden = CED_V41_GOLDEN_DIR;

// This process's scratch folder, made once.
fs::path scratch() {
  static const fs::path d = fs::temp_directory_path() / ("v41-summary-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Result {
  int code = -1;  // the exit status; -1 when the driver died of a signal
  std::string out, err;
};

Result summary(const std::string& args) {
  const fs::path o = scratch() / "stdout", e = scratch() / "stderr";
  const int status = std::system((std::string(CED_V41_SUMMARY) + " " + args + " >" + o.string() + " 2>" + e.string()).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(o), slurp(e)};
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = scratch() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(V41AgreementSummary, AFolderWithoutRunFilesIsRefusedNotPassed) {
  const fs::path empty = fresh_dir("empty");
  const auto r = summary(empty.string());
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("no .h5 run files"), std::string::npos) << r.err;
  const fs::path other = fresh_dir("other");
  std::ofstream(other / "notes.txt") << "not a run file\n";
  EXPECT_EQ(summary(other.string()).code, 2);
  EXPECT_EQ(summary("").code, 2);  // no argument: usage
}

TEST(V41AgreementSummary, GoldenFilesWithinTheirBoundsPassAndAreCountedPerRegime) {
  const fs::path d = fresh_dir("two");
  fs::copy_file(kGolden / "tiny-fp8-n5.h5", d / "tiny-fp8-n5.h5");
  fs::copy_file(kGolden / "tiny-bf16-n5.h5", d / "tiny-bf16-n5.h5");
  const auto r = summary(d.string());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("2 files, 0 outside a budget"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("### regime release"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("### regime bf16"), std::string::npos) << r.out;
}

TEST(V41AgreementSummary, AFileWithANanInItsLogitsFailsAndIsNamed) {
  const fs::path d = fresh_dir("nan");
  ced::v41::V41RunFile f = ced::v41::read_v41_run_file(kGolden / "tiny-fp8-n5.h5");
  f.result.logits.at(3) = std::numeric_limits<double>::quiet_NaN();
  ced::v41::write_v41_run_file(d / "planted.h5", f);
  fs::copy_file(kGolden / "tiny-bf16-n5.h5", d / "clean.h5");
  const auto r = summary(d.string());
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("2 files, 1 outside a budget"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("planted.h5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("NaN or an infinity"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("clean.h5"), std::string::npos) << r.err;
}

}  // namespace
