#pragma once
// `ced cache-hit`'s verdict (docs/v41.md §13.8): one resume against its cold run, and the resumes of one
// (mode, H, rule, K) over the token seeds. Declared here, defined in tools/v41_cache_hit.cpp, so that a
// test can hand the verdict samples that no run of the reference gives on demand: a claim whose decode
// step alone differs, a token seed that fails before one that passes (unit-tests/v41_tools_test.cpp).
#include <cstdint>
#include <string>
#include <vector>

namespace ced::tools::cache_hit {

// One resume of one prompt against its cold run.
struct Sample {
  std::string mode, rule;
  uint64_t token_seed = 0;
  int64_t H = 0, K = 0, hit = 0, start = 0;
  bool claims_exact = false;  // every row rebuilt: the cold run's bits
  double kl = 0, rel_l2 = 0, step_kl = 0;
  bool top1 = false, bitwise = false, step_bitwise = false, finite = false;
  // Finite, and where the rule claims the cold run, its last logits and its next decode step bitwise.
  bool ok() const;
};

// The samples of one (mode, H, rule, K) over the token seeds.
struct Row {
  const Sample* first = nullptr;
  int64_t n = 0, bitwise = 0, top1 = 0, step_bitwise = 0;
  double kl_median = 0, kl_worst = 0, step_kl_median = 0;
  bool ok = true;  // every sample's ok(), not the last one's
};

// One row per (mode, H, rule, K) in the order of their first samples; each row's `first` points into samples.
std::vector<Row> aggregate(const std::vector<Sample>& samples);

// The rows as `ced cache-hit` prints them (aligned columns) or writes them in OUT.md (markdown): mode, H, rule,
// hit, start, K, claim, samples, bitwise, median KL, worst KL, top-1, step bitwise, step KL, verdict.
std::string table(const std::vector<Row>& rows, bool markdown);

}  // namespace ced::tools::cache_hit
