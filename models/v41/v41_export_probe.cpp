// docs/v41.md §11.6: a test-only driver for the cross-check with the official code.
//   v41_export_probe write DIR [--config NAME] [--seed S] [--shard-bytes B] [--dspark-stages K]
//     (--dspark-stages K: the built-in with K DSpark stages, block size 4, targeting its last 3 layers)
//   v41_export_probe read DIR [--expect NAME]
//   v41_export_probe bump DIR OUT TENSOR INDEX   (OUT: DIR's checkpoint with one BF16 element one ulp up)
// Each prints one JSON line; a refused input is one line on stderr and exit 2.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/numerics.hpp"

using namespace ced::v41;

namespace {

int64_t bytes_of(const ced::SafetensorsFile& f) {
  int64_t n = 0;
  for (const auto& t : f.tensors) n += int64_t(t.bytes.size());
  return n;
}

// One ulp up of element `index` of a BF16 tensor (its bits plus one), written as a new folder.
int bump(const std::string& dir, const std::string& out, const std::string& tensor, const std::string& index) {
  try {
    V41Checkpoint ck = read_v41_checkpoint(dir);
    const size_t i = std::stoul(index);
    for (auto& t : ck.weights.tensors) {
      if (t.name != tensor) continue;
      if (t.dtype != "BF16" || 2 * i + 1 >= t.bytes.size()) throw ced::InputError(tensor + ": not BF16 or too short");
      const uint16_t before = uint16_t(t.bytes[2 * i] | (t.bytes[2 * i + 1] << 8)), after = uint16_t(before + 1);
      t.bytes[2 * i] = uint8_t(after & 0xFF), t.bytes[2 * i + 1] = uint8_t(after >> 8);
      write_v41_checkpoint(out, ck, {.shard_bytes = 2'000'000});
      std::printf("%s\n", nlohmann::ordered_json({{"bump", tensor}, {"index", i}, {"before", f32_from_bf16(before)},
                                                  {"after", f32_from_bf16(after)}, {"out", out}})
                               .dump()
                               .c_str());
      return 0;
    }
    throw ced::InputError(tensor + ": no such tensor");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "v41_export_probe: %s\n", e.what());
    return 2;
  }
}

int usage() {
  std::fprintf(stderr,
               "usage: v41_export_probe write DIR [--config NAME] [--seed S] [--shard-bytes B] [--dspark-stages K]\n"
               "       v41_export_probe read DIR [--expect NAME]\n"
               "       v41_export_probe bump DIR OUT TENSOR INDEX\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string cmd = argv[1], dir = argv[2];
  if (cmd == "bump") return argc == 6 ? bump(dir, argv[3], argv[4], argv[5]) : usage();
  std::string config = "v41-tiny", expect;
  uint64_t seed = 0;
  int64_t dspark_stages = 0;
  V41WriteOptions opt;
  try {
    for (int i = 3; i + 1 < argc; i += 2) {
      const std::string flag = argv[i], value = argv[i + 1];
      if (flag == "--config") config = value;
      else if (flag == "--seed") seed = std::stoull(value);
      else if (flag == "--shard-bytes") opt.shard_bytes = std::stoll(value);
      else if (flag == "--expect") expect = value;
      else if (flag == "--dspark-stages") dspark_stages = std::stoll(value);
      else return usage();
    }
    if ((argc - 3) % 2 != 0) return usage();
    nlohmann::ordered_json line;
    if (cmd == "write") {
      V41Config c = v41_builtin_config(config);
      if (dspark_stages > 0) {
        c.n_mtp_layers = dspark_stages;
        c.dspark_block_size = 4;
        c.dspark_target_layer_ids.clear();
        for (int64_t l = std::max<int64_t>(0, c.n_layers - 3); l < c.n_layers; ++l) c.dspark_target_layer_ids.push_back(l);
        c.compress_ratios.resize(size_t(c.n_layers + dspark_stages), 0);
        validate_v41(c);
      }
      const V41Checkpoint ck = make_v41_random_checkpoint(c, seed);
      const auto files = write_v41_checkpoint(dir, ck, opt);
      line = {{"write", dir}, {"config", config}, {"seed", seed}, {"tensors", ck.weights.tensors.size()},
              {"total_size", bytes_of(ck.weights)}, {"digest", v41_weights_digest(ck.weights)}, {"files", files}};
    } else if (cmd == "read") {
      const V41Checkpoint ck = read_v41_checkpoint(dir);
      line = {{"read", dir}, {"tensors", ck.weights.tensors.size()}, {"total_size", bytes_of(ck.weights)},
              {"digest", v41_weights_digest(ck.weights)}};
      if (!expect.empty()) {
        V41Config want = v41_builtin_config(expect);
        // Labelled as the two files of one folder: "config.json" is the folder's value,
        // "inference/config.json" the built-in's.
        line["config_vs_" + expect] = v41_config_disagreements(want, ck.config);
        line["config_vs_reads"] = "config.json = the folder's value, inference/config.json = " + expect + "'s";
      }
    } else {
      return usage();
    }
    std::printf("%s\n", line.dump().c_str());
    return 0;
  } catch (const ced::InputError& e) {
    std::fprintf(stderr, "v41_export_probe: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "v41_export_probe: %s\n", e.what());
    return 2;
  }
}
