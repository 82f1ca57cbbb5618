// docs/v41.md §11: v41 checkpoints in the release's layout. The schema against the official module
// tree's tensors for v41-tiny, random weights (determinism in the seed, the statistics), the folder
// round trip, and every refusal of the strict reader with its exact message.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>

#include "io/safetensors.hpp"
#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"
#include "models/v41/numerics.hpp"

using namespace ced::v41;
using ced::InputError;
using ced::SafetensorsFile;
using ced::SafetensorsTensor;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The seed of the random checkpoint; V41_CKPT_SEED replays another.
uint64_t test_seed() {
  const char* s = std::getenv("V41_CKPT_SEED");
  const uint64_t seed = s ? std::stoull(s) : 0;
  static const bool printed = [&] { return std::printf("v41_checkpoint_test: seed %llu\n", (unsigned long long)seed) > 0; }();
  (void)printed;
  return seed;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const V41TensorSpec* find_spec(const std::vector<V41TensorSpec>& schema, const std::string& name) {
  for (const auto& s : schema)
    if (s.name == name) return &s;
  return nullptr;
}

struct Want {
  const char* name;
  const char* dtype;
  std::vector<int64_t> shape;
};
// Each wanted tensor is in the schema with its dtype and shape.
void expect_specs(const std::vector<V41TensorSpec>& schema, const std::vector<Want>& want) {
  for (const Want& w : want) {
    const V41TensorSpec* t = find_spec(schema, w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->dtype, w.dtype) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
  }
}

int64_t schema_bytes(const std::vector<V41TensorSpec>& schema) {
  int64_t bytes = 0;
  for (const auto& t : schema) {
    int64_t n = ced::safetensors_dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= d;
    bytes += n;
  }
  return bytes;
}

// FNV-1a 64 over every tensor's name and bytes in name order: pins the generator's output.
uint64_t digest(const SafetensorsFile& f) {
  uint64_t h = 0xCBF29CE484222325ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001B3ull;
  };
  for (const auto& t : f.tensors) {
    mix(t.name.data(), t.name.size());
    mix(t.bytes.data(), t.bytes.size());
  }
  return h;
}

std::vector<float> bf16_values(const SafetensorsTensor& t) {
  std::vector<float> v(t.bytes.size() / 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = f32_from_bf16(uint16_t(t.bytes[2 * i] | (t.bytes[2 * i + 1] << 8)));
  return v;
}

double mean_of(const std::vector<float>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); }
double rms_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s / double(v.size()));
}

// One written tiny folder per run; each refusal test edits a fresh copy of it.
class V41Folder : public ::testing::Test {
 protected:
  static fs::path root() { return fs::temp_directory_path() / ("v41_checkpoint_test." + std::to_string(::getpid())); }
  static fs::path golden() { return root() / "golden"; }
  static const V41Checkpoint& ckpt() {
    static const V41Checkpoint ck = make_v41_random_checkpoint(v41_builtin_config("v41-tiny"), test_seed());
    return ck;
  }
  static void SetUpTestSuite() {
    fs::remove_all(root());
    fs::create_directories(root());
    // Small shards, so the tiny folder has several main shards besides its two Engram tables.
    write_v41_checkpoint(golden(), ckpt(), {.shard_bytes = 2'000'000});
  }
  static void TearDownTestSuite() { fs::remove_all(root()); }

  fs::path dir;
  void SetUp() override {
    dir = root() / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir);
    fs::copy(golden(), dir, fs::copy_options::recursive);
  }

  json index() const {
    std::ifstream in(dir / "model.safetensors.index.json");
    return json::parse(in);
  }
  void write_index(const json& j) const { std::ofstream(dir / "model.safetensors.index.json") << j.dump(2); }
  std::string shard_of(const std::string& tensor) const { return index()["weight_map"][tensor].get<std::string>(); }
  // Edits the shard holding `tensor`, rewriting it with the same name.
  void edit_shard(const std::string& tensor, const std::function<void(SafetensorsFile&)>& edit) const {
    const fs::path p = dir / shard_of(tensor);
    SafetensorsFile f = ced::read_safetensors(p);
    edit(f);
    fs::remove(p);
    ced::write_safetensors(p, f);
  }
  void edit_tensor(const std::string& tensor, const std::function<void(SafetensorsTensor&)>& edit) const {
    edit_shard(tensor, [&](SafetensorsFile& f) {
      for (auto& t : f.tensors)
        if (t.name == tensor) edit(t);
    });
  }
  std::string refusal() const {
    const std::string e = error_of([&] { read_v41_checkpoint(dir); });
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    return e;
  }
  std::string at(const std::string& file) const { return (dir / file).string(); }
  // The refusal of a scale given another shape, after its "v41 checkpoint: SHARD: NAME: " prefix.
  std::string reblocked(const std::string& scale, std::vector<int64_t> shape) const {
    const std::string prefix = "v41 checkpoint: " + at(shard_of(scale)) + ": " + scale + ": ";
    edit_tensor(scale, [&](SafetensorsTensor& x) {
      x.bytes.assign(size_t(shape[0] * shape[1]), 127);
      x.shape = shape;
    });
    const std::string e = refusal();
    EXPECT_TRUE(e.starts_with(prefix)) << e;
    return e.starts_with(prefix) ? e.substr(prefix.size()) : e;
  }
};

// ---- the schema ---------------------------------------------------------------------------------

// The official code's tiny preset with Engram on layers 0 and 2 (= v41-tiny) exports 501 tensors
// holding 6,671,348 bytes (run_official.py --export, docs/v41.md §11.6).
TEST(V41Schema, TinyHasTheOfficialTinyExportsTensorCountAndBytes) {
  const auto schema = v41_schema(v41_builtin_config("v41-tiny"));
  EXPECT_EQ(schema.size(), 501u);
  EXPECT_EQ(schema_bytes(schema), 6'671'348);
  EXPECT_TRUE(std::is_sorted(schema.begin(), schema.end(), [](auto& a, auto& b) { return a.name < b.name; }));
}

// v41-tiny: 0 SWA-only, 1 ratio-2 Full, 2 ratio-2 Reuse, 3 ratio-1 Full, 4 Reindex, 5 Reuse; Engram 0, 2.
TEST(V41Schema, EachLayerHasTheModulesItsRoleOwns) {
  const auto s = v41_schema(v41_builtin_config("v41-tiny"));
  auto has = [&](const std::string& n) { return find_spec(s, n) != nullptr; };
  for (int l = 0; l < 6; ++l) {
    const std::string L = "layers." + std::to_string(l) + ".attn.";
    const bool kv = l == 1 || l == 3, idx = kv || l == 4;
    EXPECT_EQ(has(L + "compressor.wkv.weight"), kv) << l;
    EXPECT_EQ(has(L + "compressor.norm.weight"), kv) << l;
    EXPECT_EQ(has(L + "compressor.wgate.weight"), l == 1) << l;
    EXPECT_EQ(has(L + "indexer.wq_b.weight"), idx) << l;
    EXPECT_EQ(has(L + "indexer.weights_proj.weight"), idx) << l;
    EXPECT_EQ(has(L + "indexer.wk.weight"), kv) << l;
    EXPECT_EQ(has(L + "indexer.k_norm.weight"), kv) << l;
    EXPECT_TRUE(has(L + "wo_a.scale")) << l;
    EXPECT_TRUE(has("layers." + std::to_string(l) + ".ffn.gate.bias_vl")) << l;
    EXPECT_EQ(has("layers." + std::to_string(l) + ".engram.embed.weight"), l == 0 || l == 2) << l;
  }
}

// Each tensor's dtype and stored shape, and each scale's 32-blocks (v41-notes §2.2-§2.3 at tiny sizes:
// D 256, q 64, H 4 x 64, G 2 x 64, E 8 x 128, IH 4 x 64, Engram rows 660 / 864 x 32).
TEST(V41Schema, EachFormatHasItsDtypeShapeAndScaleBlocks) {
  const auto s = v41_schema(v41_builtin_config("v41-tiny"));
  const std::vector<Want> want = {
      {"embed.weight", "BF16", {1024, 256}},
      {"head.weight", "BF16", {1024, 256}},
      {"norm.weight", "BF16", {256}},
      {"layers.0.hc_attn_fn", "F32", {24, 1024}},
      {"layers.0.hc_ffn_base", "F32", {24}},
      {"layers.0.hc_ffn_scale", "F32", {3}},
      {"layers.0.attn.attn_sink", "F32", {4}},
      {"layers.0.attn.wq_a.weight", "F8_E4M3", {64, 256}},
      {"layers.0.attn.wq_a.scale", "F8_E8M0", {2, 8}},
      {"layers.0.attn.wq_b.weight", "F8_E4M3", {256, 64}},
      {"layers.0.attn.wo_a.weight", "F8_E4M3", {128, 128}},
      {"layers.0.attn.wo_a.scale", "F8_E8M0", {4, 4}},
      {"layers.0.attn.wo_b.weight", "F8_E4M3", {256, 128}},
      {"layers.1.attn.compressor.wgate.weight", "BF16", {64, 256}},
      {"layers.1.attn.indexer.wq_b.scale", "F8_E8M0", {8, 2}},
      {"layers.1.attn.indexer.weights_proj.weight", "BF16", {4, 256}},
      {"layers.1.attn.indexer.wk.weight", "BF16", {64, 64}},
      {"layers.0.ffn.gate.weight", "BF16", {8, 256}},
      {"layers.0.ffn.gate.bias", "F32", {8}},
      {"layers.0.ffn.experts.7.w1.weight", "I8", {128, 128}},
      {"layers.0.ffn.experts.7.w1.scale", "F8_E8M0", {128, 8}},
      {"layers.0.ffn.experts.7.w2.weight", "I8", {256, 64}},
      {"layers.0.ffn.experts.7.w2.scale", "F8_E8M0", {256, 4}},
      {"layers.0.ffn.shared_experts.w2.scale", "F8_E8M0", {8, 4}},
      {"layers.0.engram.embed.weight", "F8_E4M3", {660, 32}},
      {"layers.0.engram.embed.scale", "F8_E8M0", {660, 1}},
      {"layers.2.engram.embed.weight", "F8_E4M3", {864, 32}},
      {"layers.0.engram.wkv.weight", "F8_E4M3", {1280, 192}},
      {"layers.0.engram.q_weight", "BF16", {4, 256}},
  };
  expect_specs(s, want);
  EXPECT_EQ(find_spec(s, "layers.0.ffn.experts.8.w1.weight"), nullptr);
}

// The release's schedule at its sizes: 40 layers x 384 experts x 3 I8 weights (v41-notes §2.1 counts
// 47,232 I8 tensors with the 3 DSpark stages' 3 x 128 x 3, not modelled here).
TEST(V41Schema, ReleaseScheduleHas46080RoutedExpertWeights) {
  V41Config c = v41_builtin_config("v41-flash");
  c.vision_n_layers = 0;
  c.dspark_block_size = 0;
  const auto s = v41_schema(c);
  EXPECT_EQ(std::count_if(s.begin(), s.end(), [](auto& t) { return t.dtype == "I8"; }), 46080);
  EXPECT_EQ(find_spec(s, "layers.14.engram.embed.weight")->shape, (std::vector<int64_t>{384016682, 256}));
  EXPECT_EQ(find_spec(s, "layers.20.attn.compressor.wgate.weight"), nullptr);  // ratio-1 kv source
  EXPECT_NE(find_spec(s, "layers.2.attn.compressor.wgate.weight"), nullptr);
  EXPECT_EQ(find_spec(s, "layers.24.attn.indexer.wk.weight"), nullptr);       // Reindex
  EXPECT_EQ(find_spec(s, "layers.0.attn.wo_a.scale")->shape, (std::vector<int64_t>{256, 128}));
}

TEST(V41Schema, RefusesLayoutsItDoesNotModel) {
  V41Config c = v41_builtin_config("v41-tiny");
  c.dtype = "bf16";
  c.expert_dtype.reset();
  EXPECT_EQ(error_of([&] { v41_schema(c); }),
            "v41 checkpoint: v41-tiny: dtype bf16 with expert_dtype null: only the release's layout (fp8 with fp4 "
            "experts) is modelled");
  EXPECT_EQ(error_of([&] { v41_schema(v41_builtin_config("v41-flash")); }),
            "v41 checkpoint: v41-flash: vision_n_layers > 0: the vision tensors (vision.*, aligner.*) are not modelled");
}

// v41-tiny with two DSpark stages (block size 4, target layers 3, 4, 5): the official driver's export
// of the same config has 662 tensors holding 9,552,452 bytes (docs/v41.md §11.6). A stage is a block without
// compressor, indexer, Engram or VL routing bias, with its own experts; stage 0 adds main_proj and
// main_norm, the last stage norm, the Markov head and the confidence head; embed and head are the
// backbone's, stored once.
V41Config tiny_with_dspark(int64_t stages) {
  V41Config c = v41_builtin_config("v41-tiny");
  c.n_mtp_layers = stages;
  c.dspark_block_size = 4;
  c.dspark_target_layer_ids = {3, 4, 5};
  c.compress_ratios.resize(size_t(6 + stages), 0);
  validate_v41(c);
  return c;
}

TEST(V41Schema, DSparkStagesAddTheOfficialMtpTensors) {
  const auto s = v41_schema(tiny_with_dspark(2));
  EXPECT_EQ(s.size(), 662u);
  EXPECT_EQ(schema_bytes(s), 9'552'452);
  const std::vector<Want> want = {
      {"mtp.0.main_proj.weight", "F8_E4M3", {256, 768}},
      {"mtp.0.main_proj.scale", "F8_E8M0", {8, 24}},
      {"mtp.0.main_norm.weight", "BF16", {256}},
      {"mtp.0.attn.wo_a.weight", "F8_E4M3", {128, 128}},
      {"mtp.0.ffn.experts.7.w2.weight", "I8", {256, 64}},
      {"mtp.1.norm.weight", "BF16", {256}},
      {"mtp.1.markov_head.embed.weight", "BF16", {1024, 256}},
      {"mtp.1.markov_head.head.weight", "BF16", {1024, 256}},
      {"mtp.1.confidence_head.proj.weight", "BF16", {1, 512}},
  };
  expect_specs(s, want);
  for (const char* absent : {"mtp.0.ffn.gate.bias_vl", "mtp.0.embed.weight", "mtp.1.head.weight", "mtp.0.norm.weight",
                             "mtp.1.main_proj.weight", "mtp.0.attn.compressor.wkv.weight", "mtp.0.engram.wkv.weight"})
    EXPECT_EQ(find_spec(s, absent), nullptr) << absent;
}

TEST(V41FolderBuiltins, DSparkStagesReadBackBitwise) {
  const fs::path d = fs::temp_directory_path() / fmt::format("v41_checkpoint_test.{}.dspark", ::getpid());
  fs::remove_all(d);
  const V41Checkpoint ck = make_v41_random_checkpoint(tiny_with_dspark(2), test_seed());
  write_v41_checkpoint(d, ck, {.shard_bytes = 2'000'000});
  const V41Checkpoint back = read_v41_checkpoint(d);
  fs::remove_all(d);
  EXPECT_EQ(digest(back.weights), digest(ck.weights));
  EXPECT_EQ(back.config.n_mtp_layers, 2);
}

// ---- random weights -----------------------------------------------------------------------------

TEST(V41RandomWeights, AreAFunctionOfTheSeedAlone) {
  const V41Config c = v41_builtin_config("v41-tiny");
  const auto a = make_v41_random_checkpoint(c, 7), b = make_v41_random_checkpoint(c, 7);
  const auto other = make_v41_random_checkpoint(c, 8);
  EXPECT_EQ(digest(a.weights), digest(b.weights));
  ASSERT_EQ(a.weights.tensors.size(), other.weights.tensors.size());
  // Every value tensor moves with the seed, bias_vl (zeros) aside; a scale need not (a tile's amax
  // rarely changes its power of two).
  for (size_t i = 0; i < a.weights.tensors.size(); ++i) {
    const std::string& n = a.weights.tensors[i].name;
    if (!n.ends_with("bias_vl") && !n.ends_with(".scale")) {
      EXPECT_FALSE(a.weights.tensors[i].bytes == other.weights.tensors[i].bytes) << n;
    }
  }
  // The generator is integer and IEEE arithmetic only: seed 0 gives these bytes on every platform.
  EXPECT_EQ(digest(make_v41_random_checkpoint(c, 0).weights), 0xe5141202dcb4ac99ull);
}

// docs/v41.md §11.2: norm means by owner, std = gain / sqrt(fan_in), embedding RMS 0.12. The
// tolerances are sampling error (a few thousand draws: a few %) plus FP8 / FP4 rounding (FP4 adds
// ~10 % of RMS).
TEST(V41RandomWeights, HaveTheReleasesStatistics) {
  const V41Checkpoint& ck = make_v41_random_checkpoint(v41_builtin_config("v41-tiny"), test_seed());
  auto get = [&](const std::string& n) -> const SafetensorsTensor& {
    const SafetensorsTensor* t = ck.weights.find(n);
    if (!t) throw std::runtime_error(n + ": not in the checkpoint");
    return *t;
  };
  EXPECT_NEAR(mean_of(bf16_values(get("layers.3.attn_norm.weight"))), 0.025, 0.001);
  EXPECT_NEAR(mean_of(bf16_values(get("layers.3.ffn_norm.weight"))), 0.2, 0.005);
  EXPECT_NEAR(mean_of(bf16_values(get("layers.3.attn.q_norm.weight"))), 0.97, 0.03);
  EXPECT_NEAR(mean_of(bf16_values(get("layers.3.attn.kv_norm.weight"))), 0.4, 0.012);
  EXPECT_NEAR(mean_of(bf16_values(get("layers.3.attn.compressor.norm.weight"))), 0.6, 0.018);
  EXPECT_NEAR(mean_of(bf16_values(get("layers.3.attn.indexer.k_norm.weight"))), 0.5, 0.015);
  EXPECT_NEAR(mean_of(bf16_values(get("norm.weight"))), 1.0, 0.03);
  EXPECT_NEAR(rms_of(bf16_values(get("embed.weight"))), 0.12, 0.002);
  EXPECT_NEAR(rms_of(bf16_values(get("layers.3.ffn.gate.weight"))), 2.9 / 16, 0.01);
  {
    const auto& w = get("layers.3.attn.wq_a.weight");
    const auto& s = get("layers.3.attn.wq_a.scale");
    std::vector<float> v(64 * 256);
    dequant_fp8_weight(w.bytes, s.bytes, 64, 256, v);
    EXPECT_NEAR(rms_of(v), 1.6 / 16, 0.005);
  }
  {
    const auto& w = get("layers.3.ffn.experts.5.w2.weight");
    const auto& s = get("layers.3.ffn.experts.5.w2.scale");
    std::vector<float> v(256 * 128);
    dequant_fp4_weight(w.bytes, s.bytes, 256, 128, v);
    EXPECT_NEAR(rms_of(v), 1.05 / std::sqrt(128.0), 0.1 * 1.05 / std::sqrt(128.0));
  }
  const auto bias_vl = ced::safetensors_values(get("layers.3.ffn.gate.bias_vl"));
  EXPECT_TRUE(std::all_of(bias_vl.begin(), bias_vl.end(), [](double x) { return x == 0; }));
}

// ---- the Engram token map -----------------------------------------------------------------------

// The official driver's stub (run_official.py's StubTokenizer and its tokenizer.json), written by the
// tokenizers library: id 2k "tok{k}", id 2k+1 "  TOK{k}" (a space is U+0120 in the byte-level alphabet).
TEST(V41TokenMap, StubTokenizerIsTheOfficialDriversByteLevelBpe) {
  V41Config c = v41_builtin_config("v41-tiny");
  c.vocab_size = 4;
  const json j = json::parse(v41_stub_tokenizer_json(c));
  EXPECT_EQ(j["model"]["vocab"], json::parse(R"({"tok0": 0, "\u0120\u0120TOK0": 1, "tok1": 2, "\u0120\u0120TOK1": 3})"));
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["model"]["merges"], json::array());
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
  EXPECT_EQ(j["added_tokens"], json::array());
}

TEST(V41TokenMap, MapsEachIdToItsHalf) {
  V41Config c = v41_builtin_config("v41-tiny");
  const auto m = v41_engram_token_map(c);
  ASSERT_EQ(m.size(), 1024u);
  for (int64_t id = 0; id < 1024; ++id) EXPECT_EQ(m[size_t(id)], id / 2);
  c.vocab_size = 1023;
  c.engram_compressed_vocab_size = 511;
  EXPECT_EQ(error_of([&] { check_v41_token_map_size(c, "f"); }),
            "v41 checkpoint: f: engram_compressed_vocab_size: 511, the stub tokenizer's token map (id -> id / 2) has "
            "512 ids");
}

// ---- the folder: round trip ---------------------------------------------------------------------

TEST_F(V41Folder, ReadsBackBitwiseWhatWasWritten) {
  const V41Checkpoint back = read_v41_checkpoint(dir);
  V41Config c = back.config;
  c.name = ckpt().config.name;
  EXPECT_EQ(c, ckpt().config);
  ASSERT_EQ(back.weights.tensors.size(), ckpt().weights.tensors.size());
  for (size_t i = 0; i < back.weights.tensors.size(); ++i) {
    const auto &x = back.weights.tensors[i], &y = ckpt().weights.tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype) << x.name;
    EXPECT_EQ(x.shape, y.shape) << x.name;
    EXPECT_TRUE(x.bytes == y.bytes) << x.name;
  }
}

// v41-ced: the release's 40-layer schedule, Engram layers and 43 compress_ratios (DSpark off). (v41-wide
// round-trips through the official code in docs/v41.md §11.6; v41-flash is analytic only and has vision.)
TEST(V41FolderBuiltins, CedReadsBackBitwise) {
  for (const char* name : {"v41-ced"}) {
    const fs::path d = fs::temp_directory_path() / fmt::format("v41_checkpoint_test.{}.{}", ::getpid(), name);
    fs::remove_all(d);
    const V41Checkpoint ck = make_v41_random_checkpoint(v41_builtin_config(name), test_seed());
    write_v41_checkpoint(d, ck, {.shard_bytes = 8'000'000});
    const V41Checkpoint back = read_v41_checkpoint(d);
    fs::remove_all(d);
    V41Config c = back.config;
    c.name = name;
    EXPECT_EQ(c, ck.config) << name;
    EXPECT_EQ(digest(back.weights), digest(ck.weights)) << name;
    EXPECT_EQ(back.weights.tensors.size(), ck.weights.tensors.size()) << name;
  }
}

// Main shards hold whole groups (embed, one layer, norm + head) in order; each Engram table has the
// last shards to itself, as the release keeps its two tables in shards 47 and 48 of 48.
TEST_F(V41Folder, ShardsCutAtLayersWithEachEngramTableAlone) {
  const json wm = index()["weight_map"];
  std::map<std::string, std::set<std::string>> by_shard;
  for (const auto& [t, f] : wm.items()) by_shard[f.get<std::string>()].insert(t);
  const size_t n = by_shard.size();
  ASSERT_GE(n, 5u);  // at least three main shards at 2 MB
  auto shard = [&](size_t k) { return fmt::format("model-{:05}-of-{:05}.safetensors", k, n); };
  EXPECT_EQ(by_shard[shard(n - 1)], (std::set<std::string>{"layers.0.engram.embed.scale", "layers.0.engram.embed.weight"}));
  EXPECT_EQ(by_shard[shard(n)], (std::set<std::string>{"layers.2.engram.embed.scale", "layers.2.engram.embed.weight"}));
  EXPECT_EQ(wm["embed.weight"], shard(1));
  EXPECT_EQ(wm["head.weight"], shard(n - 2));
  for (int l = 0; l < 6; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    std::set<std::string> shards;
    for (const auto& [t, f] : wm.items())
      if (t.starts_with(p) && t.find("engram.embed") == std::string::npos) shards.insert(f.get<std::string>());
    EXPECT_EQ(shards.size(), 1u) << p;
  }
  EXPECT_EQ(index()["metadata"]["total_size"], 6'671'348);
}

TEST_F(V41Folder, WriterRefusesAFolderThatIsNotEmpty) {
  EXPECT_EQ(error_of([&] { write_v41_checkpoint(dir, ckpt()); }),
            "v41 checkpoint: " + dir.string() + ": exists and is not an empty folder");
}

TEST_F(V41Folder, WriterRefusesWeightsOffTheSchema) {
  V41Checkpoint ck = ckpt();
  ck.weights.tensors.erase(ck.weights.tensors.begin());  // embed.weight
  EXPECT_EQ(error_of([&] { write_v41_checkpoint(root() / "w", ck); }),
            "v41 checkpoint: the checkpoint to write: embed.weight: missing (the config's layout has it)");
  EXPECT_FALSE(fs::exists(root() / "w"));
}

TEST_F(V41Folder, WriterRefusesATensorTwiceOrWithTheWrongByteCount) {
  V41Checkpoint twice = ckpt();
  twice.weights.tensors.push_back(*twice.weights.find("norm.weight"));
  EXPECT_EQ(error_of([&] { write_v41_checkpoint(root() / "w2", twice); }),
            "v41 checkpoint: the checkpoint to write: norm.weight: appears twice");
  V41Checkpoint short_one = ckpt();
  for (auto& t : short_one.weights.tensors)
    if (t.name == "norm.weight") t.bytes.pop_back();
  EXPECT_EQ(error_of([&] { write_v41_checkpoint(root() / "w3", short_one); }),
            "v41 checkpoint: the checkpoint to write: norm.weight: holds 511 bytes, its dtype and shape need 512");
  EXPECT_FALSE(fs::exists(root() / "w2"));
  EXPECT_FALSE(fs::exists(root() / "w3"));
}

// ---- the folder: every refusal ------------------------------------------------------------------

TEST_F(V41Folder, RefusesATensorMissingFromIndexAndShard) {
  const std::string t = "layers.4.attn.indexer.wq_b.scale";
  edit_shard(t, [&](SafetensorsFile& f) { std::erase_if(f.tensors, [&](auto& x) { return x.name == t; }); });
  json j = index();
  j["weight_map"].erase(t);
  write_index(j);
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at("model.safetensors.index.json") + ": " + t +
                           ": missing (the config's layout has it)");
}

TEST_F(V41Folder, RefusesATensorTheIndexMapsButItsShardLacks) {
  const std::string t = "layers.5.ffn.experts.2.w3.weight";
  const std::string f = shard_of(t);
  edit_shard(t, [&](SafetensorsFile& s) { std::erase_if(s.tensors, [&](auto& x) { return x.name == t; }); });
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at(f) + ": " + t + ": missing (the index maps it to this shard)");
}

TEST_F(V41Folder, RefusesAnExtraTensorInIndexAndShard) {
  const std::string t = "layers.0.attn.compressor.norm.weight";  // layer 0 is SWA-only
  const std::string f = shard_of("layers.0.attn.kv_norm.weight");
  edit_shard("layers.0.attn.kv_norm.weight", [&](SafetensorsFile& s) {
    SafetensorsTensor x = *s.find("layers.0.attn.kv_norm.weight");
    x.name = t;
    s.tensors.push_back(x);
  });
  json j = index();
  j["weight_map"][t] = f;
  write_index(j);
  EXPECT_EQ(refusal(),
            "v41 checkpoint: " + at("model.safetensors.index.json") + ": " + t + ": not a tensor of the config's layout");
}

TEST_F(V41Folder, RefusesAnExtraTensorInAShardOnly) {
  const std::string f = shard_of("layers.1.ffn.gate.bias");
  edit_shard("layers.1.ffn.gate.bias", [&](SafetensorsFile& s) {
    SafetensorsTensor x = *s.find("layers.1.ffn.gate.bias");
    x.name = "layers.1.ffn.gate.bias_extra";
    s.tensors.push_back(x);
  });
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at(f) +
                           ": layers.1.ffn.gate.bias_extra: not a tensor of the config's layout (nor in the index)");
}

// The shards are all read before a tensor the index maps to a shard is missed there, so a tensor in
// another shard is named where it is.
TEST_F(V41Folder, RefusesATensorInAnotherShardThanTheIndexSays) {
  const std::string t = "head.weight", f = shard_of(t), other = shard_of("embed.weight");
  ASSERT_NE(f, other);
  json j = index();
  j["weight_map"][t] = other;
  write_index(j);
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at(f) + ": head.weight: the index maps it to " + other);
}

TEST_F(V41Folder, RefusesAMisshapedTensor) {
  const std::string t = "layers.2.attn.kv_norm.weight";
  edit_tensor(t, [](SafetensorsTensor& x) {
    x.shape = {32};
    x.bytes.resize(64);
  });
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at(shard_of(t)) + ": " + t + ": shape [32], the layout has [64]");
}

TEST_F(V41Folder, RefusesAMistypedTensor) {
  const std::string t = "layers.3.attn.wq_b.weight";  // F8_E4M3 written as I8: same bytes
  edit_tensor(t, [](SafetensorsTensor& x) { x.dtype = "I8"; });
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at(shard_of(t)) + ": " + t + ": dtype I8, the layout has F8_E4M3");
}

// A per-row scale where the release has one per 32x32 tile.
TEST_F(V41Folder, RefusesAFp8ScaleThatIsNotPer32x32Tile) {
  EXPECT_EQ(reblocked("layers.0.attn.wq_a.scale", {64, 8}),
            "shape [64, 8] is not one scale per 32x32 tile of layers.0.attn.wq_a.weight [64, 256] (that is [2, 8])");
}

// An NVFP4-style scale per 16 where the release has one per 32 along K.
TEST_F(V41Folder, RefusesAnExpertScaleThatIsNotPer32AlongK) {
  EXPECT_EQ(reblocked("layers.1.ffn.experts.3.w1.scale", {128, 16}),
            "shape [128, 16] is not one scale per 32 along K of layers.1.ffn.experts.3.w1.weight [128, 128] (that is "
            "[128, 8])");
}

TEST_F(V41Folder, RefusesAnEngramTableScaleThatIsNotPer32OfARow) {
  EXPECT_EQ(reblocked("layers.2.engram.embed.scale", {1, 1}),
            "shape [1, 1] is not one scale per 32 of a row of layers.2.engram.embed.weight [864, 32] (that is [864, "
            "1])");
}

TEST_F(V41Folder, RefusesATruncatedShard) {
  const std::string f = shard_of("head.weight");
  fs::resize_file(dir / f, fs::file_size(dir / f) - 1);
  const std::string e = refusal();
  EXPECT_TRUE(e.starts_with("v41 checkpoint: cannot read '" + at(f) + "': ")) << e;
  EXPECT_NE(e.find("(truncated?)"), std::string::npos) << e;
}

TEST_F(V41Folder, RefusesAMissingShard) {
  const std::string f = shard_of("embed.weight");
  fs::remove(dir / f);
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at(f) + ": file: missing (model.safetensors.index.json names it)");
}

TEST_F(V41Folder, RefusesASafetensorsFileTheIndexDoesNotName) {
  fs::copy_file(dir / shard_of("embed.weight"), dir / "model-00009-of-00009.safetensors");
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at("model-00009-of-00009.safetensors") +
                           ": file: a safetensors file model.safetensors.index.json does not name");
}

TEST_F(V41Folder, RefusesAWrongTotalSize) {
  json j = index();
  j["metadata"]["total_size"] = 6'671'349;
  write_index(j);
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at("model.safetensors.index.json") +
                           ": metadata.total_size: 6671349, the tensors hold 6671348 bytes");
}

TEST_F(V41Folder, RefusesABadIndex) {
  const std::string idx = at("model.safetensors.index.json");
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": ";
  EXPECT_TRUE(refusal().starts_with("v41 checkpoint: " + idx + ": file: not JSON (")) << refusal();
  json good;
  {
    std::ifstream in(golden() / "model.safetensors.index.json");
    good = json::parse(in);
  }
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j);
    write_index(j);
    return refusal();
  };
  EXPECT_EQ(with([](json& j) { j["metadata"].erase("total_size"); }),
            "v41 checkpoint: " + idx + ": metadata.total_size: missing or not a non-negative integer");
  EXPECT_EQ(with([](json& j) { j["metadata"]["total_size"] = "6671348"; }),
            "v41 checkpoint: " + idx + ": metadata.total_size: missing or not a non-negative integer");
  EXPECT_EQ(with([](json& j) { j["weight_map"] = json::object(); }),
            "v41 checkpoint: " + idx + ": weight_map: missing, empty or not an object");
  EXPECT_EQ(with([](json& j) { j["shards"] = 3; }),
            "v41 checkpoint: " + idx + ": shards: unknown key (an index has metadata and weight_map)");
  EXPECT_EQ(with([](json& j) { j["weight_map"]["embed.weight"] = "../embed.safetensors"; }),
            "v41 checkpoint: " + idx +
                ": weight_map.embed.weight: ../embed.safetensors is not a shard file name model-0000k-of-0000n.safetensors");
  // The shard names agree on n, and every k = 1..n is named (weight_map is read in name order:
  // embed.weight first).
  const std::string n = good["weight_map"]["head.weight"].get<std::string>().substr(15, 5);
  EXPECT_EQ(with([](json& j) { j["weight_map"]["head.weight"] = "model-00001-of-00099.safetensors"; }),
            "v41 checkpoint: " + idx + ": weight_map.head.weight: model-00001-of-00099.safetensors is not shard k of " +
                std::to_string(std::stoi(n)) + " for k = 1.." + std::to_string(std::stoi(n)));
  EXPECT_EQ(with([&](json& j) {
              for (auto& [t, f] : j["weight_map"].items())
                if (f == "model-00002-of-" + n + ".safetensors") f = "model-00001-of-" + n + ".safetensors";
            }),
            "v41 checkpoint: " + idx + ": weight_map: names no tensor in model-00002-of-" + n +
                ".safetensors (shard 2 of " + std::to_string(std::stoi(n)) + ")");
}

TEST_F(V41Folder, RefusesConfigFilesThatDisagree) {
  V41Config c = ckpt().config;
  c.window_size = 8;
  std::ofstream(dir / "inference" / "config.json") << write_v41_flat_json(c);
  EXPECT_EQ(refusal(), "v41 config: " + at("config.json") + " and " + at("inference/config.json") +
                           " disagree on 1 key(s): window_size (config.json text_config.sliding_window = 16, "
                           "inference/config.json window_size = 8)");
}

TEST_F(V41Folder, RefusesAFolderWithoutBothConfigFiles) {
  fs::remove(dir / "inference" / "config.json");
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at("inference/config.json") +
                           ": file: missing (a release folder has both config files)");
  EXPECT_EQ(error_of([&] { read_v41_checkpoint(dir / "config.json"); }),
            "v41 checkpoint: " + at("config.json") + ": folder: not a folder");
}

TEST_F(V41Folder, RefusesAMissingTokenizerWithEngramOn) {
  fs::remove(dir / "tokenizer.json");
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at("tokenizer.json") +
                           ": file: missing (Engram's token map is built from it)");
}

TEST_F(V41Folder, RefusesATokenizerWithAnotherTokenMap) {
  std::ifstream in(dir / "tokenizer.json");
  json j = json::parse(in);
  in.close();
  j["model"]["vocab"].erase("tok1");  // id 2 now decodes to another text
  j["model"]["vocab"]["tak1"] = 2;
  std::ofstream(dir / "tokenizer.json") << j.dump(2);
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at("tokenizer.json") +
                           ": /model/vocab/tok1: differs from the stub tokenizer of vocab_size 1024 (2 difference(s); "
                           "the token map must be id -> id / 2)");
}

TEST_F(V41Folder, RefusesACompressedVocabularyOffTheStubMap) {
  V41Config c = ckpt().config;
  c.engram_compressed_vocab_size = 500;
  std::ofstream(dir / "inference" / "config.json") << write_v41_flat_json(c);
  std::ofstream(dir / "config.json") << write_v41_hf_json(c);
  EXPECT_EQ(refusal(), "v41 checkpoint: " + at("inference/config.json") +
                           ": engram_compressed_vocab_size: 500, the stub tokenizer's token map (id -> id / 2) has 512 ids");
}

// Never a crash: every cut of the index and of a shard, and a bit flipped at 40 places of a shard's
// header, is either read or refused with one InputError line (any other exception fails the test).
TEST_F(V41Folder, DamagedFilesAreRefusedNeverACrash) {
  auto bytes_of = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  auto put = [](const fs::path& p, const std::string& b) { std::ofstream(p, std::ios::binary) << b; };
  const fs::path idx = dir / "model.safetensors.index.json", shard = dir / shard_of("embed.weight");
  const std::string idx_bytes = bytes_of(idx), shard_bytes = bytes_of(shard);
  for (size_t cut : {size_t(0), size_t(1), size_t(2), size_t(50), idx_bytes.size() / 2, idx_bytes.size() - 3}) {
    put(idx, idx_bytes.substr(0, cut));
    EXPECT_NE(refusal(), "") << "index cut at " << cut;
  }
  put(idx, idx_bytes);
  for (size_t cut : {size_t(0), size_t(4), size_t(8), size_t(9), size_t(100), shard_bytes.size() / 2, shard_bytes.size() - 1}) {
    put(shard, shard_bytes.substr(0, cut));
    EXPECT_NE(refusal(), "") << "shard cut at " << cut;
  }
  uint64_t header = 0;
  std::memcpy(&header, shard_bytes.data(), 8);
  int refused = 0;
  for (int k = 0; k < 40; ++k) {
    std::string b = shard_bytes;
    b[size_t(8 + header * uint64_t(k) / 40)] ^= 1;
    put(shard, b);
    std::string e;
    EXPECT_NO_THROW(e = error_of([&] { read_v41_checkpoint(dir); })) << "flip " << k;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    refused += !e.empty();
  }
  EXPECT_GT(refused, 30);  // most flips break the header; a few land in padding or a digit that still parses
}

}  // namespace
