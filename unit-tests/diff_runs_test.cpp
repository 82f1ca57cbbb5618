// `ced diff` over files that hold several runs (docs/spec.md §8, §10): one failing run among passing ones
// fails the diff whichever its place, a run on one side only is a problem named in the text and the
// JSON, `--run` judges that run alone, and a `--run` in neither file is a usage error. Written for the
// mutation pass (docs/mutation.md): the CLI tests held one run per file.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "unit-tests/run_ced.hpp"
#include "models/lab/hdf5_files.hpp"
#include "models/lab/weights.hpp"
#include "backends/registry.hpp"

namespace fs = std::filesystem;
using namespace ced;

namespace {

using test::Result;

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("ced-diff-runs-test-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}


Result run_ced(const std::string& args) { return test::run_ced_in(scratch(), args); }

// Two runs of tiny over the same 8 tokens: "full" and "ced" (bounded replay).
struct Runs {
  Config c = load_config("tiny");
  RunResult full, ced;
  Runs() {
    auto be = make_backend("reference", c, 0);
    RunRequest r;
    r.n_prompt = 8;
    r.tokens = make_tokens(0, c.vocab_size, 8);
    full = be->run(r);
    r.mode = Mode::Ced;
    r.replay = ReplayPolicy::parse("bounded");
    ced = be->run(r);
  }
};

const Runs& runs() {
  static const Runs r;
  return r;
}

// A file of the given runs; `bump` multiplies logits(0, 0) of the run of that name by 1 + 1e-3.
fs::path write_file(const std::string& name, std::vector<NamedRun> rs, const std::string& bump = "") {
  RunFile f;
  f.generator = "diff_runs_test";
  f.config = runs().c;
  f.tokens = make_tokens(0, f.config.vocab_size, 8);
  for (auto& r : rs)
    if (r.name == bump) r.result.logits(0, 0) *= 1 + 1e-3;
  f.runs = std::move(rs);
  const fs::path p = scratch() / name;
  write_run_file(p, f);
  return p;
}

}  // namespace

TEST(DiffRuns, OneFailingRunAmongPassingOnesFailsTheDiffWhereverItStands) {
  const fs::path ref = write_file("ref.h5", {{"full", runs().full}, {"ced", runs().ced}});
  for (const std::string bumped : {"full", "ced"}) {
    const fs::path t = write_file("t-" + bumped + ".h5", {{"full", runs().full}, {"ced", runs().ced}}, bumped);
    const Result r = run_ced("diff " + t.string() + " " + ref.string());
    EXPECT_EQ(r.code, 1) << bumped << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("FAIL"), std::string::npos) << r.out;
    const Result j = run_ced("diff " + t.string() + " " + ref.string() + " --json");
    EXPECT_EQ(j.code, 1) << j.out << j.err;
    EXPECT_EQ(j.out.rfind("{\"pass\": false, \"problems\": []", 0), 0u) << j.out;
  }
  const Result same = run_ced("diff " + ref.string() + " " + ref.string());
  EXPECT_EQ(same.code, 0) << same.out << same.err;
}

TEST(DiffRuns, ARunOnOneSideOnlyIsAProblemNamedInTextAndJson) {
  const fs::path one = write_file("one.h5", {{"full", runs().full}});
  const fs::path two = write_file("two.h5", {{"full", runs().full}, {"ced", runs().ced}});
  const Result r = run_ced("diff " + one.string() + " " + two.string());
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find(fmt::format("problem: run 'ced' is in {} only", two.string())), std::string::npos) << r.out;
  const Result j = run_ced("diff " + two.string() + " " + one.string() + " --json");
  EXPECT_EQ(j.code, 1) << j.out << j.err;
  EXPECT_EQ(j.out.rfind(fmt::format("{{\"pass\": false, \"problems\": [\"run 'ced' is in {} only\"], ", two.string()), 0),
            0u)
      << j.out;
}

TEST(DiffRuns, RunOptionJudgesThatRunAlone) {
  const fs::path one = write_file("sel-one.h5", {{"full", runs().full}});
  const fs::path two = write_file("sel-two.h5", {{"full", runs().full}, {"ced", runs().ced}});
  // The run missing on one side is not the one asked for: no problem.
  Result r = run_ced("diff " + one.string() + " " + two.string() + " --run full");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  r = run_ced("diff " + two.string() + " " + one.string() + " --run full");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const fs::path bumped = write_file("sel-bumped.h5", {{"full", runs().full}, {"ced", runs().ced}}, "ced");
  r = run_ced("diff " + bumped.string() + " " + two.string() + " --run full");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  r = run_ced("diff " + bumped.string() + " " + two.string() + " --run ced");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
}

TEST(DiffRuns, RunInNeitherFileIsAUsageError) {
  const fs::path two = write_file("none-two.h5", {{"full", runs().full}, {"ced", runs().ced}});
  const Result r = run_ced("diff " + two.string() + " " + two.string() + " --run resume");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--run: no run 'resume' in both files"), std::string::npos) << r.err;
}
