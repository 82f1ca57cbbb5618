// The gate's summary driver (checks/v41/agreement_summary.cpp, docs/v41.md §12.4), run as a user runs it:
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
#include <vector>

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

// The cells of the summary's markdown row for `kind` ("" when there is none): kind, files, compared, bitwise, ...
std::vector<std::string> row_of(const std::string& out, const std::string& kind) {
  const size_t at = out.find("\n| " + kind + " |");
  if (at == std::string::npos) return {};
  std::stringstream row(out.substr(at + 2, out.find('\n', at + 1) - at - 2));
  std::vector<std::string> cells;
  for (std::string c; std::getline(row, c, '|');)
    if (!c.empty()) cells.push_back(c.substr(1, c.size() - 2));
  return cells;
}

// The summary's kinds are named by pass: a teacher-forced kind by its own name, a prefill end-to-end one with
// " (end to end)" (rope, compared end to end only, too); a kind compared as rows says how many of them differ
// (none, on the official code's own file).
TEST(V41AgreementSummary, KindsAreNamedByTheirPassTheEndToEndOnesSayingSo) {
  const auto r = summary((kGolden / "tiny-bf16-n1.h5").string());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // | kind | files | compared | bitwise | ...
  EXPECT_EQ(row_of(r.out, "hash_ids"),
            (std::vector<std::string>{"hash_ids", "1", "2 rows", "0 of 2 rows differ", "–", "–", "–"}))
      << r.out;
  EXPECT_EQ(row_of(r.out, "in").at(2), "2048 values") << r.out;
  EXPECT_EQ(row_of(r.out, "in (end to end)").at(2), "6144 values") << r.out;
  EXPECT_EQ(row_of(r.out, "rope (end to end)").at(2), "32 values") << r.out;
  EXPECT_TRUE(row_of(r.out, "rope").empty()) << "rope is compared end to end only\n" << r.out;
  EXPECT_TRUE(row_of(r.out, "hash_ids (end to end)").empty()) << r.out;
  EXPECT_EQ(r.out.find("== "), std::string::npos) << "no per-file table without -v\n" << r.out;
}

// A kind compared as rows counts those that differ of those compared: one Engram hash id changed in the
// official file (layer 0's row of two) is "1 of 2 rows differ", and the file fails.
TEST(V41AgreementSummary, ARowKindCountsTheRowsThatDifferOfThoseCompared) {
  const fs::path d = fresh_dir("hash");
  ced::v41::V41RunFile f = ced::v41::read_v41_run_file(kGolden / "tiny-bf16-n1.h5");
  ASSERT_FALSE(f.result.layers.at(0).hash_ids.empty());
  f.result.layers[0].hash_ids[0] += 1;
  ced::v41::write_v41_run_file(d / "planted.h5", f);
  const auto r = summary((d / "planted.h5").string());
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  ASSERT_FALSE(row_of(r.out, "hash_ids").empty()) << r.out;
  EXPECT_EQ(row_of(r.out, "hash_ids").at(3), "1 of 2 rows differ") << r.out;
}

// -v prints each file's own table, row by row, before the summary; the file may come after the flag or before it.
TEST(V41AgreementSummary, VerbosePrintsEachFilesTableRowByRowWhereverTheFlagIs) {
  const std::string file = (kGolden / "tiny-bf16-n1.h5").string();
  for (const std::string& args : {"-v " + file, file + " -v"}) {
    const auto r = summary(args);
    ASSERT_EQ(r.code, 0) << args << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("\n== " + file + " (bf16, N = 1)\n"), std::string::npos) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("\nteacher forced      0 hash_ids "), std::string::npos) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("\n| hash_ids | 1 | 2 rows |"), std::string::npos) << args << "\n" << r.out;
  }
}

}  // namespace

// The bound model's options: a value missing at the end of the line, an unknown model or option, a
// function-ulps that is not a number: usage or a one-line error, exit 2, never a crash.
TEST(V41AgreementSummary, TheBoundModelsOptionsRefuseWhatTheyCannotReadWithExit2) {
  const std::string file = (fs::path(CED_V41_GOLDEN_DIR) / "tiny-fp8-n5.h5").string();
  EXPECT_EQ(summary(file + " --accumulation").code, 2);
  EXPECT_EQ(summary(file + " --function-ulps").code, 2);
  EXPECT_EQ(summary("--accumulation fp16 " + file).code, 2);
  EXPECT_EQ(summary("--function-ulps x " + file).code, 2);
  EXPECT_EQ(summary("--bogus " + file).code, 2);
  const auto ok = summary("--accumulation tensor-core:14:128 --function-ulps 1 " + file);
  EXPECT_EQ(ok.code, 0) << ok.err;
  const auto budgets = summary("--tsv --budgets-only " + file);
  EXPECT_EQ(budgets.code, 0) << budgets.err;
  EXPECT_EQ(budgets.out.find("\tbounds\t"), std::string::npos);
  EXPECT_NE(summary("--tsv " + file).out.find("\tbounds\t"), std::string::npos);
}
