// docs/v41.md §11.4: a v41 checkpoint written as a release-layout folder, every file atomically.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "io/atomic_write.hpp"
#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"

namespace ced::v41 {
namespace {

// The group a tensor is sharded with: the embedding, one per layer, one per DSpark stage, the final
// norm and head; an
// Engram table (weight and scale) is a group of its own, written after all the others.
struct Group {
  std::string key;
  bool engram_table = false;
  std::vector<const SafetensorsTensor*> tensors;
  int64_t bytes = 0;
};

std::vector<Group> shard_groups(const V41Checkpoint& ck) {
  std::vector<Group> groups;
  auto group_of = [&](const std::string& key, bool table) -> Group& {
    for (Group& g : groups)
      if (g.key == key) return g;
    groups.push_back({key, table, {}, 0});
    return groups.back();
  };
  group_of("embed", false);
  for (int64_t l = 0; l < ck.config.n_layers; ++l) group_of(fmt::format("layers.{}.", l), false);
  for (int64_t k = 0; ck.config.dspark_block_size > 0 && k < ck.config.n_mtp_layers; ++k)
    group_of(fmt::format("mtp.{}.", k), false);
  group_of("final", false);
  for (const auto& t : ck.weights.tensors) {
    std::string key = t.name == "embed.weight" ? "embed" : "final";
    bool table = false;
    if (t.name.starts_with("mtp.")) key = t.name.substr(0, t.name.find('.', 4) + 1);
    if (t.name.starts_with("layers.")) {
      key = t.name.substr(0, t.name.find('.', 7) + 1);
      if (t.name.find(".engram.embed.") != std::string::npos) key += "engram.embed", table = true;
    }
    Group& g = group_of(key, table);
    g.tensors.push_back(&t);
    g.bytes += int64_t(t.bytes.size());
  }
  std::stable_partition(groups.begin(), groups.end(), [](const Group& g) { return !g.engram_table; });
  return groups;
}

std::string shard_name(size_t k, size_t n) { return fmt::format("model-{:05}-of-{:05}.safetensors", k, n); }

nlohmann::ordered_json tokenizer_config() {
  return {{"tokenizer_class", "PreTrainedTokenizerFast"},
          {"add_bos_token", false},
          {"add_eos_token", false},
          {"clean_up_tokenization_spaces", false},
          {"model_max_length", 1048576},
          {"bos_token", nullptr},
          {"eos_token", nullptr},
          {"pad_token", nullptr},
          {"unk_token", nullptr}};
}

}  // namespace

std::vector<std::string> write_v41_checkpoint(const std::filesystem::path& dir, const V41Checkpoint& ck,
                                              const V41WriteOptions& options) {
  namespace fs = std::filesystem;
  check_v41_weights(ck, "the checkpoint to write");
  check_v41_token_map_size(ck.config, ck.config.name);
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec)))
    throw InputError(fmt::format("v41 checkpoint: {}: exists and is not an empty folder", dir.string()));
  fs::create_directories(dir / "inference", ec);
  if (ec) throw InputError(fmt::format("v41 checkpoint: {}: cannot create it ({})", dir.string(), ec.message()));

  // Shards: consecutive main groups up to shard_bytes, then one shard per Engram table.
  std::vector<std::vector<const Group*>> shards;
  const auto groups = shard_groups(ck);
  int64_t open_bytes = 0;
  for (const Group& g : groups) {
    if (g.tensors.empty()) continue;
    if (shards.empty() || g.engram_table || shards.back().front()->engram_table ||
        open_bytes + g.bytes > options.shard_bytes) {
      shards.emplace_back();
      open_bytes = 0;
    }
    shards.back().push_back(&g);
    open_bytes += g.bytes;
  }

  std::vector<std::string> files = {"config.json", "inference/config.json"};
  write_bytes_atomically(dir / "config.json", write_v41_hf_json(ck.config));
  write_bytes_atomically(dir / "inference" / "config.json", write_v41_flat_json(ck.config));
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = shard_name(k + 1, shards.size());
    SafetensorsFile f;
    f.metadata["format"] = "pt";
    for (const Group* g : shards[k])
      for (const SafetensorsTensor* t : g->tensors) {
        f.tensors.push_back(*t);
        weight_map[t->name] = name;
        total += int64_t(t->bytes.size());
      }
    write_safetensors(dir / name, f);
    files.push_back(name);
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_bytes_atomically(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  write_bytes_atomically(dir / "tokenizer.json", v41_stub_tokenizer_json(ck.config));
  write_bytes_atomically(dir / "tokenizer_config.json", tokenizer_config().dump(2) + "\n");
  files.insert(files.end(), {"model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"});
  return files;
}

}  // namespace ced::v41
