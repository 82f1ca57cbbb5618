#pragma once
// `ced export` and `ced run` on a config of the v41 family (docs/v41.md §12): the same commands, the
// family picked from --config (or --checkpoint), each option either meaning the same in both families
// or refused by the one that has no use for it.
#include <cstdint>
#include <string>
#include <vector>

namespace ced::tools {

// Whether a --config argument names the v41 family (models/family.hpp decides).
bool names_v41_family(const std::string& config_arg);

// `ced oracle` on a v41 config (docs/v41.md §14): the release's oracle for the prompt lengths Ns, as
// the table or JSON. InputError when a count overflows int64 at the longest N.
int oracle_v41(const std::string& config, const std::vector<int64_t>& Ns, bool json);

struct V41ExportOptions {
  std::string config;  // a v41 built-in or config file
  uint64_t weight_seed = 0;
  std::string out;     // the folder (must not exist, or be empty)
  int64_t shard_bytes = 0;  // 0: the writer's default
  std::vector<std::string> boost;  // test only: "TENSOR=K", boost_v41_weight (docs/v41.md §12.4)
};
int export_v41(const V41ExportOptions& o);

struct V41RunOptions {
  std::string config;      // a v41 built-in (random weights from weight_seed), or "" with checkpoint
  std::string checkpoint;  // a release-layout folder, "" with config
  uint64_t weight_seed = 0, token_seed = 0;
  std::string regime = "release";
  std::string topk_ties = "torch", index_scores = "bf16";  // docs/v41.md §8.7
  std::string decode_index_k = "official";                 // docs/v41.md §8.8
  int64_t decode = 0;      // teacher-forced decode steps after the prefill (the last `decode` tokens)
  std::string mode = "full";          // full | ced (docs/v41.md §13)
  std::string replay = "bounded";     // ced: bounded (W) | exact (the convention's span) | full | K
  std::string convention = "sglang";  // ced: v41_replay_conventions()
  int64_t speculative = 0;            // ced: speculative tokens in a bounded tail (conventions that hold them)
  std::string backend = "v41-reference";
  int64_t tokens = 0;      // N seeded prompt tokens, or 0 with token_file
  std::string token_file;  // whitespace-separated token ids
  std::string out;         // the v41 run file to write ("" : print only)
};
int run_v41(const V41RunOptions& o);

}  // namespace ced::tools
