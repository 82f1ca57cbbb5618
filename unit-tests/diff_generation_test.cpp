// `ced diff` with the generation-level verdicts (docs/spec.md §8.7, §10): the per-position KL
// distribution and the teacher-forced greedy rule beside the worst row, in text and JSON; a
// policy that gates a KL quantile or the greedy rule fails a planted file (exit 1) and names
// the position, one that gates neither leaves the verdict as before, a malformed key is exit 2.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "backends/registry.hpp"
#include "models/lab/hdf5_files.hpp"
#include "models/lab/weights.hpp"
#include "unit-tests/run_ced.hpp"

namespace fs = std::filesystem;
using namespace ced;

namespace {

using test::Result;

const fs::path& scratch() {
  static const fs::path dir = test::scratch_dir("ced-diff-generation-test");
  return dir;
}

// The reference: one full run of tiny over 8 tokens, its logits at positions 1..7 (row 0 dropped,
// so that a row's index is not its position and a message that names one is told apart).
RunFile reference() {
  RunFile f;
  f.generator = "diff_generation_test";
  f.config = load_config("tiny");
  f.tokens = make_tokens(0, f.config.vocab_size, 8);
  RunRequest r;
  r.n_prompt = 8;
  r.tokens = f.tokens;
  RunResult full = make_backend("reference", f.config, 0)->run(r);
  full.positions.erase(full.positions.begin());
  full.logits = MatD(full.logits.bottomRows(full.logits.rows() - 1));
  f.runs.push_back({"full", std::move(full)});
  return f;
}

constexpr int64_t kPlantedRow = 4;  // position 5

// Row kPlantedRow's largest logit nudged up by 1e-3 (relative): the argmax stays, the KL does not.
RunFile nudged(RunFile f) {
  auto& l = f.runs[0].result.logits;
  Eigen::Index top = 0;
  l.row(kPlantedRow).maxCoeff(&top);
  l(kPlantedRow, top) += 1e-3 * std::abs(l(kPlantedRow, top));
  return f;
}

// Row kPlantedRow's smallest logit raised above the row's largest: the argmax moves to
// the token the reference ranks last (outside any top-5 of tiny's 97).
RunFile argmax_moved(RunFile f) {
  auto& l = f.runs[0].result.logits;
  Eigen::Index lowest = 0;
  l.row(kPlantedRow).minCoeff(&lowest);
  l(kPlantedRow, lowest) = l.row(kPlantedRow).maxCoeff() + 1.0;
  return f;
}

// The reference and both plants, written once.
struct Files {
  RunFile base = reference();
  fs::path ref = write("ref.h5", base), nudged = write("nudged.h5", ::nudged(base)),
           moved = write("moved.h5", argmax_moved(base));
  int64_t planted_position = base.runs[0].result.positions[kPlantedRow];

  static fs::path write(const std::string& name, const RunFile& f) {
    write_run_file(scratch() / name, f);
    return scratch() / name;
  }
};
const Files& files() {
  static const Files f;
  return f;
}

// `ced diff T REF ARGS`, under a policy whose logits rule holds `logits_keys` when given
// (layers: a rule with no bound), else under ced diff's exact default.
Result diff(const fs::path& t, const std::optional<std::string>& logits_keys, const std::string& args = "") {
  std::string cmd = "diff " + t.string() + " " + files().ref.string() + " " + args;
  if (logits_keys) {
    const fs::path p = scratch() / "policy.toml";
    std::ofstream(p) << "[[rule]]\npattern = \"runs/*/logits\"\nreason = \"generation-level bound\"\n"
                     << *logits_keys << "\n\n[[rule]]\npattern = \"**\"\nreason = \"layers are not what this test judges\"\n";
    cmd += " --policy " + p.string();
  }
  return test::run_ced_in(scratch(), cmd);
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST(DiffGeneration, PrintsTheKlDistributionAndTheTeacherForcedGreedyRuleBesideTheWorstRow) {
  const Result r = diff(files().moved, std::nullopt);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "KL mean ")) << r.out;
  EXPECT_TRUE(has(r.out, fmt::format("(position {}); nearest rank of 7 rows", files().planted_position))) << r.out;
  EXPECT_TRUE(has(r.out, fmt::format("teacher-forced greedy (vLLM's rule, top-5): first divergence at step {} "
                                     "(position {})",
                                     kPlantedRow, files().planted_position)))
      << r.out;
  EXPECT_TRUE(has(r.out, "(not gated)")) << r.out;
  const Result same = diff(files().ref, std::nullopt);
  EXPECT_EQ(same.code, 0) << same.out << same.err;
  EXPECT_TRUE(has(same.out, "the same token at all 7 steps: pass")) << same.out;
}

TEST(DiffGeneration, JsonCarriesTheKlDistributionAndTheGreedyRule) {
  const Result j = diff(files().moved, "greedy_top_n = 5", "--json");
  EXPECT_EQ(j.code, 1) << j.out << j.err;
  EXPECT_TRUE(has(j.out, "\"kl_distribution\":{\"count\":7,")) << j.out;
  EXPECT_TRUE(has(j.out, fmt::format("\"greedy_teacher_forced\":{{\"steps\":7,\"top_n\":5,\"pass\":false,\"step\":{},",
                                     kPlantedRow)))
      << j.out;
  EXPECT_TRUE(has(j.out, "\"greedy_gated\": true")) << j.out;
  EXPECT_TRUE(has(j.out, "\"threshold\":\"greedy_top_n\"")) << j.out;
}

TEST(DiffGeneration, APolicyGatingKlP99FailsANudgedRowAndNamesItsPosition) {
  const Result r = diff(files().nudged, "max_kl_p99 = 1e-30");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, fmt::format("worst: runs/full/logits, position {}", files().planted_position))) << r.out;
  EXPECT_TRUE(has(r.out, "max_kl_p99: measured ")) << r.out;
  // The argmax did not move: the greedy rule, gated alone, passes the same file.
  const Result greedy = diff(files().nudged, "greedy_top_n = 1");
  EXPECT_EQ(greedy.code, 0) << greedy.out << greedy.err;
  EXPECT_TRUE(has(greedy.out, "the same token at all 7 steps: pass (gated by greedy_top_n)")) << greedy.out;
  // No generation key: not gated, as before these keys existed.
  const Result open = diff(files().nudged, "");
  EXPECT_EQ(open.code, 0) << open.out << open.err;
}

TEST(DiffGeneration, APolicyGatingTheGreedyRuleFailsAMovedArgmaxAtItsStep) {
  const Result r = diff(files().moved, "greedy_top_n = 5");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, fmt::format("worst: runs/full/logits, position {}", files().planted_position))) << r.out;
  EXPECT_TRUE(has(r.out, "greedy_top_n: measured 97 > limit 5")) << r.out;  // the last of 97 tokens
  EXPECT_TRUE(has(r.out, "(gated by greedy_top_n)")) << r.out;
}

TEST(DiffGeneration, AMalformedGenerationKeyIsExitTwoInOneLine) {
  for (const std::string bad : {"greedy_top_n = 0", "greedy_top_n = 1.5", "max_kl_p99 = -1"}) {
    const Result r = diff(files().ref, bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(has(r.err, "policy.toml:4: '" + bad.substr(0, bad.find(' ')) + "'")) << r.err;
  }
}
