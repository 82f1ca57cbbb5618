// The verdicts of the v41 commands that no cheap run of the `ced` binary can reach (issue 35): `ced verify`'s
// golden gate on a folder that holds no golden file (the command would first run its whole property suite).
// Called in the library the commands run (ced_tools), so what it holds is what `ced` prints and exits on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tools/v41_commands.hpp"

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ced-v41-tools-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

bool names(const std::vector<std::string>& failures, const std::string& what) {
  for (const std::string& f : failures)
    if (f.find(what) != std::string::npos) return true;
  return false;
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
