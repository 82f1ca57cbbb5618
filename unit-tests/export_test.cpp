// `ced export` and io/safetensors (docs/spec.md §9.4): the weights read back
// equal the generator's bitwise (f32, f64; bf16 as the generator's value
// rounded double -> f32 -> bf16), the header is well formed and deterministic,
// the reader refuses damaged files with one line, and the command refuses bad
// arguments with exit 2 and leaves no file behind.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "unit-tests/run_ced.hpp"
#include "io/hdf5_file.hpp"
#include "io/safetensors.hpp"
#include "io/weights_export.hpp"
#include "model/error.hpp"
#include "model/weights.hpp"

namespace fs = std::filesystem;
using namespace ced;

namespace {

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("ced-export-test-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}


WeightsExport tiny_export(const std::string& dtype, uint64_t seed = 1) {
  WeightsExport e;
  e.config = builtin_config("tiny");
  e.weight_seed = seed;
  e.dtype = dtype;
  e.generator = "export_test";
  return e;
}

// The expected bits of one generated value in the export's dtype.
uint64_t expected_bits(double v, const std::string& dtype) {
  if (dtype == "f64") return std::bit_cast<uint64_t>(v);
  if (dtype == "f32") return std::bit_cast<uint32_t>(static_cast<float>(v));
  return bf16_bits_of(v);
}
uint64_t stored_bits(const SafetensorsTensor& t, int64_t i) {
  uint64_t b = 0;
  const size_t n = size_t(safetensors_dtype_size(t.dtype));
  std::memcpy(&b, t.bytes.data() + size_t(i) * n, n);
  return b;
}

// "" when every tensor of docs/spec.md §2.2 is in `f` with its name, shape and
// the generator's bits; else the first difference.
std::string first_difference(const SafetensorsFile& f, const WeightsExport& e) {
  const auto specs = weight_specs(e.config, make_plan(e.config));
  size_t weights = 0;
  for (const auto& t : f.tensors) weights += t.name != "tokens";
  if (weights != specs.size()) return fmt::format("{} tensors, want {}", weights, specs.size());
  for (const TensorSpec& s : specs) {
    const SafetensorsTensor* t = f.find(s.name);
    if (!t) return s.name + " missing";
    if (t->shape != s.shape) return s.name + " shape";
    const std::vector<double> v = generate_tensor(s, e.weight_seed);
    for (int64_t i = 0; i < s.numel(); ++i)
      if (stored_bits(*t, i) != expected_bits(v[size_t(i)], e.dtype)) return fmt::format("{}[{}]", s.name, i);
  }
  return "";
}

TEST(SafetensorsExport, EveryTensorReadsBackBitwiseEqualToTheGeneratorInF32F64AndBf16) {
  for (const std::string dtype : {"f32", "f64", "bf16"}) {
    const WeightsExport e = tiny_export(dtype);
    const fs::path p = scratch() / ("w-" + dtype + ".safetensors");
    write_weights_export(p, e, "safetensors");
    const SafetensorsFile f = read_safetensors(p);
    EXPECT_EQ(first_difference(f, e), "") << dtype;
    EXPECT_EQ(f.metadata.at("dtype"), dtype);
    EXPECT_EQ(f.metadata.at("weight_seed"), "1");
  }
}

TEST(SafetensorsExport, ARoundTripCheckFailsOnOnePlantedBitAndOnAnotherSeed) {
  const WeightsExport e = tiny_export("f32");
  SafetensorsFile f = parse_safetensors(safetensors_bytes(weights_safetensors(e)), "mem");
  ASSERT_EQ(first_difference(f, e), "");
  SafetensorsFile planted = f;
  for (auto& t : planted.tensors)
    if (t.name == "layers.3.wkv") t.bytes[4 * 7] ^= 1;  // lowest mantissa bit of element 7
  EXPECT_EQ(first_difference(planted, e), "layers.3.wkv[7]");
  EXPECT_NE(first_difference(f, tiny_export("f32", 2)), "");
}

TEST(SafetensorsExport, Bf16IsTheDoubleRoundedToF32ThenToBf16NearestEven) {
  // 1 + 2^-8 + 2^-40: to f32 it is 1 + 2^-8 (the f32 nearest), exactly halfway
  // between bf16 1 (0x3F80) and 1 + 2^-7 (0x3F81); the tie goes to even 0x3F80.
  // Rounding the double straight to bf16 would give 0x3F81: this pins which.
  EXPECT_EQ(bf16_bits_of(1.0 + 0x1p-8 + 0x1p-40), 0x3F80);
  EXPECT_EQ(bf16_bits_of(1.0 + 0x1p-7 + 0x1p-8), 0x3F82);  // tie from odd 0x3F81 goes up to even
  EXPECT_EQ(bf16_bits_of(-2.0), 0xC000);
  EXPECT_EQ(bf16_bits_of(1.0 + 0x1p-8 + 0x1p-20), 0x3F81);  // above the tie in f32 too
}

TEST(SafetensorsExport, HeaderIsAlignedSortedJsonWithTheConfigAndContiguousOffsets) {
  WeightsExport e = tiny_export("f32");
  e.n_tokens = 20;
  e.token_seed = 2;
  const std::string bytes = safetensors_bytes(weights_safetensors(e));
  EXPECT_EQ(bytes, safetensors_bytes(weights_safetensors(e))) << "same inputs, same bytes";
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  const auto& meta = header.at("__metadata__");
  EXPECT_EQ(meta.at("format"), "ced-harness-weights");
  EXPECT_EQ(meta.at("format_version"), "1");
  EXPECT_EQ(meta.at("token_seed"), "2");
  const auto config = nlohmann::json::parse(meta.at("config").get<std::string>());
  EXPECT_EQ(config.at("name"), "tiny");
  EXPECT_EQ(config.at("window"), 4);
  EXPECT_EQ(config.at("compress_ratios"), nlohmann::json({0, 2, 2, 2, 1, 1, 1, 1}));
  // Data in name order, each tensor right after the previous one.
  uint64_t at = 0;
  std::string last;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    EXPECT_LT(last, name);
    last = name;
    EXPECT_EQ(entry.at("data_offsets")[0], at) << name;
    at = entry.at("data_offsets")[1];
  }
  EXPECT_EQ(8 + n + at, bytes.size());
  EXPECT_EQ(header.at("embed").at("shape"), nlohmann::json({97, 32}));
  EXPECT_EQ(header.at("layers.1.wq_a").at("shape"), nlohmann::json({32, 16}));
  EXPECT_EQ(header.at("tokens").at("dtype"), "I32");
  // The prompt: docs/spec.md §2.4's first 20 tiny tokens of token seed 2.
  const SafetensorsFile f = parse_safetensors(bytes, "mem");
  const std::vector<double> tokens = safetensors_values(*f.find("tokens"));
  const std::vector<double> want = {40, 62, 55, 19, 80, 7, 71, 93, 66, 56, 93, 25, 85, 54, 96, 52, 6, 90, 66, 18};
  EXPECT_EQ(tokens, want);
  // docs/spec.md §2.4: embed[0] of weight seed 1, rounded to f32.
  EXPECT_EQ(float(safetensors_values(*f.find("embed"))[0]), -0.714873552f);
}

// A damaged file is one line: "cannot read '<origin>': <object>: <why>".
void expect_refused(const std::string& bytes, const std::string& word) {
  try {
    parse_safetensors(bytes, "bad.safetensors");
    ADD_FAILURE() << "accepted; want a refusal naming " << word;
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("cannot read 'bad.safetensors': ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find(word), std::string::npos) << m;
  }
}

std::string with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

TEST(SafetensorsReader, RefusesTruncatedCorruptAndInconsistentFilesWithOneLine) {
  const std::string good = safetensors_bytes(weights_safetensors(tiny_export("f32")));
  expect_refused(good.substr(0, good.size() - 1), "truncated");
  expect_refused(good.substr(0, 5), "fewer than the 8");
  std::string huge = good;
  huge[7] = char(0x7F);  // a header length of ~2^62
  expect_refused(huge, "claims");
  std::string broken = good;
  broken[9] = '#';
  expect_refused(broken, "is not JSON");
  expect_refused(good + "x", "follow the last tensor");
  expect_refused(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "1234"), "need 8");
  expect_refused(with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                             "1234"),
                 "starts at byte 0");
  expect_refused(with_header(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", "1234"), "Q4");
  expect_refused(with_header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "1234"), "shape");
  expect_refused(with_header(R"([1,2])", ""), "not a JSON object");
  expect_refused(with_header(R"({"__metadata__":{"k":1}})", ""), "__metadata__/k");
  EXPECT_NO_THROW(parse_safetensors(good, "good"));
}

TEST(SafetensorsReader, AMissingFileIsOneLine) {
  EXPECT_THROW(read_safetensors(scratch() / "absent.safetensors"), InputError);
}

TEST(H5Export, WeightsReadBackAsTheRunFileLayoutInEveryDtype) {
  for (const std::string dtype : {"f32", "f64", "bf16"}) {
    WeightsExport e = tiny_export(dtype);
    e.n_tokens = 8;
    const fs::path p = scratch() / ("w-" + dtype + ".h5");
    write_weights_export(p, e, "h5");
    const RunFile h = read_run_file(p);
    EXPECT_EQ(h.weights_dtype, dtype);
    EXPECT_EQ(h.tokens, make_tokens(0, 97, 8));
    const SafetensorsFile st = weights_safetensors(e);
    for (const auto& t : st.tensors) {
      if (t.name == "tokens") continue;
      const WeightTensor w = read_weight(p, t.name);
      EXPECT_EQ(w.shape, t.shape) << t.name;
      EXPECT_EQ(w.values, safetensors_values(t)) << dtype << " " << t.name;
    }
  }
}

// ---- the command ----------------------------------------------------------

using test::Result;

Result run_ced(const std::string& args) { return test::run_ced_in(scratch(), args); }

TEST(ExportCommand, WritesTheSameBytesAsTheLibraryAndPrintsItsSeeds) {
  const fs::path out = scratch() / "cmd.safetensors";
  const Result r = run_ced(fmt::format("export --config tiny --weight-seed 1 --dtype bf16 --out {}", out.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("weight_seed 1"), std::string::npos) << r.out;
  WeightsExport e = tiny_export("bf16");
  const SafetensorsFile f = read_safetensors(out);
  EXPECT_EQ(first_difference(f, e), "");
  EXPECT_EQ(f.metadata.at("dtype"), "bf16");
}

TEST(ExportCommand, SetOverridesReachTheConfigMetadata) {
  const fs::path out = scratch() / "set.safetensors";
  const Result r = run_ced(fmt::format("export --config tiny --set window=5 --out {}", out.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto config = nlohmann::json::parse(read_safetensors(out).metadata.at("config"));
  EXPECT_EQ(config.at("window"), 5);
}

TEST(ExportCommand, BadArgumentsExitTwoWithOneLineAndNoFile) {
  const fs::path out = scratch() / "never.safetensors";
  for (const std::string args :
       {"--config tiny --dtype f16", "--config tiny --format npz", "--config nope", "--config tiny --tokens 0",
        "--config tiny --tokens 5x", "--config tiny --weight-seed -1", "--config tiny --set window=0",
        "--config v41-flash"}) {
    const Result r = run_ced(fmt::format("export {} --out {}", args, out.string()));
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << args;
  }
  const Result r = run_ced("export --config tiny --out " + (scratch() / "no-dir" / "w.safetensors").string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
