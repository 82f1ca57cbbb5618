// docs/v41.md §11.5: a release-layout folder read strictly into a V41Checkpoint.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <stdexcept>

#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"

namespace ced::v41 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[noreturn]] void fail(const fs::path& file, const std::string& what, const std::string& why) {
  throw InputError(fmt::format("v41 checkpoint: {}: {}: {}", file.string(), what, why));
}

std::string read_text(const fs::path& path, const std::string& why_needed) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(path, "file", "missing (" + why_needed + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "file", "cannot be opened");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The index: {"metadata": {"total_size": N, ...}, "weight_map": {tensor: shard file}}; the shard
// files are model-0000k-of-0000n.safetensors, k = 1..n, each named at least once.
struct Index {
  int64_t total_size = 0;
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  std::vector<std::string> shards;                // k = 1..n
};

Index read_index(const fs::path& path) {
  json j;
  try {
    j = json::parse(read_text(path, "a release folder has one"));
  } catch (const json::exception& e) {
    fail(path, "file", fmt::format("not JSON ({})", e.what()));
  }
  if (!j.is_object()) fail(path, "file", "not a JSON object");
  for (const auto& [key, v] : j.items())
    if (key != "metadata" && key != "weight_map") fail(path, key, "unknown key (an index has metadata and weight_map)");
  if (!j.contains("metadata") || !j["metadata"].is_object()) fail(path, "metadata", "missing or not an object");
  const json& meta = j["metadata"];
  if (!meta.contains("total_size") || !meta["total_size"].is_number_unsigned())
    fail(path, "metadata.total_size", "missing or not a non-negative integer");
  if (!j.contains("weight_map") || !j["weight_map"].is_object() || j["weight_map"].empty())
    fail(path, "weight_map", "missing, empty or not an object");
  Index idx;
  idx.total_size = meta["total_size"].get<int64_t>();
  static const std::regex kShard(R"(model-(\d{5})-of-(\d{5})\.safetensors)");
  std::set<std::string> files;
  size_t n = 0;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    std::smatch m;
    const std::string f = file.is_string() ? file.get<std::string>() : file.dump();
    if (!file.is_string() || !std::regex_match(f, m, kShard))
      fail(path, "weight_map." + tensor, fmt::format("{} is not a shard file name model-0000k-of-0000n.safetensors", f));
    const size_t k = std::stoul(m[1].str()), of = std::stoul(m[2].str());
    if (n == 0) n = of;
    if (of != n || k < 1 || k > n)
      fail(path, "weight_map." + tensor, fmt::format("{} is not shard k of {} for k = 1..{}", f, n, n));
    idx.weight_map[tensor] = f;
    files.insert(f);
  }
  for (size_t k = 1; k <= n; ++k) {
    const std::string f = fmt::format("model-{:05}-of-{:05}.safetensors", k, n);
    if (!files.count(f)) fail(path, "weight_map", fmt::format("names no tensor in {} (shard {} of {})", f, k, n));
    idx.shards.push_back(f);
  }
  return idx;
}

}  // namespace

V41Checkpoint read_v41_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(dir, "folder", "not a folder");
  // Both config files, agreeing (load_v41_config_files names every key they disagree on).
  for (const char* f : {"config.json", "inference/config.json"})
    if (!fs::is_regular_file(dir / f, ec)) fail(dir / f, "file", "missing (a release folder has both config files)");
  V41Checkpoint ck;
  ck.config = load_v41_config_files(dir / "config.json", dir / "inference" / "config.json");
  ck.config.name = dir.string();
  const auto schema = v41_schema(ck.config);

  // The index against the schema: the same names.
  const fs::path index_path = dir / "model.safetensors.index.json";
  const Index idx = read_index(index_path);
  {
    auto s = schema.begin();
    auto w = idx.weight_map.begin();
    while (s != schema.end() || w != idx.weight_map.end()) {
      if (w == idx.weight_map.end() || (s != schema.end() && s->name < w->first))
        fail(index_path, s->name, "missing (the config's layout has it)");
      if (s == schema.end() || w->first < s->name) fail(index_path, w->first, "not a tensor of the config's layout");
      ++s, ++w;
    }
  }
  // No other shard files beside the index's.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.ends_with(".safetensors") && !std::binary_search(idx.shards.begin(), idx.shards.end(), f))
      fail(e.path(), "file", "a safetensors file model.safetensors.index.json does not name");
  }
  // Every shard: exactly the tensors the index maps to it, each as the schema has it. A tensor the
  // index maps to a shard that lacks it is looked for after all are read, so that one found in
  // another shard is named there.
  int64_t total = 0;
  std::set<std::string> found;
  for (const std::string& f : idx.shards) {
    const fs::path path = dir / f;
    if (!fs::is_regular_file(path, ec)) fail(path, "file", "missing (model.safetensors.index.json names it)");
    SafetensorsFile part;
    try {
      part = read_safetensors(path);
    } catch (const InputError& e) {
      throw InputError(fmt::format("v41 checkpoint: {}", e.what()));
    }
    for (SafetensorsTensor& t : part.tensors) {
      const auto m = idx.weight_map.find(t.name);
      if (m == idx.weight_map.end()) fail(path, t.name, "not a tensor of the config's layout (nor in the index)");
      if (m->second != f) fail(path, t.name, fmt::format("the index maps it to {}", m->second));
      const auto spec = std::lower_bound(schema.begin(), schema.end(), t.name,
                                         [](const V41TensorSpec& s, const std::string& n) { return s.name < n; });
      // An invariant, not a check of the input: the index names exactly the schema's tensors (above)
      // and t is in the index, so its schema entry exists.
      if (spec == schema.end() || spec->name != t.name) throw std::logic_error("v41 checkpoint: no schema entry for " + t.name);
      const std::string why = v41_tensor_mismatch(schema, *spec, t);
      if (!why.empty()) fail(path, t.name, why);
      total += int64_t(t.bytes.size());
      found.insert(t.name);
      ck.weights.tensors.push_back(std::move(t));
    }
  }
  for (const auto& [tensor, file] : idx.weight_map)
    if (!found.count(tensor)) fail(dir / file, tensor, "missing (the index maps it to this shard)");
  if (total != idx.total_size)
    fail(index_path, "metadata.total_size", fmt::format("{}, the tensors hold {} bytes", idx.total_size, total));
  std::sort(ck.weights.tensors.begin(), ck.weights.tensors.end(),
            [](const auto& x, const auto& y) { return x.name < y.name; });

  // Engram's token map comes from tokenizer.json: it must be the stub tokenizer (docs/v41.md §11.3).
  if (!ck.config.engram_layer_ids.empty()) {
    check_v41_token_map_size(ck.config, (dir / "inference" / "config.json").string());
    const fs::path tok = dir / "tokenizer.json";
    check_v41_stub_tokenizer(read_text(tok, "Engram's token map is built from it"), tok.string(), ck.config);
  }
  return ck;
}

}  // namespace ced::v41
