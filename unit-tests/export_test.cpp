// `ced export` and io/safetensors (docs/spec.md §9.4): the weights read back
// equal the generator's bitwise (f32, f64; bf16 as the generator's value
// rounded double -> f32 -> bf16), the header is well formed and deterministic,
// the reader refuses damaged files with one line, and the command refuses bad
// arguments with exit 2 and leaves no file behind.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "unit-tests/run_ced.hpp"
#include "models/lab/hdf5_files.hpp"
#include "io/safetensors.hpp"
#include "models/lab/weights_export.hpp"
#include "model/error.hpp"
#include "models/lab/weights.hpp"

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

// docs/spec.md §9.4: without --tokens there is no prompt, so no tokens tensor
// (an empty one would read as a prompt of length 0) and no token seed; with
// --tokens 1 the smallest prompt is there.
TEST(SafetensorsExport, WithoutTokensTheFileHoldsNoTokensTensorAndNoTokenSeed) {
  WeightsExport e = tiny_export("f32");
  e.token_seed = 2;
  const std::string bytes = safetensors_bytes(weights_safetensors(e));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_FALSE(header.contains("tokens")) << header.dump();
  EXPECT_FALSE(header.at("__metadata__").contains("token_seed")) << header.dump();
  e.n_tokens = 1;
  const SafetensorsFile one = weights_safetensors(e);
  ASSERT_NE(one.find("tokens"), nullptr);
  EXPECT_EQ(safetensors_values(*one.find("tokens")), std::vector<double>{40});  // docs/spec.md §2.4, token seed 2
  EXPECT_EQ(one.metadata.at("token_seed"), "2");
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
                 "'b' [0, 4] overlaps 'a' [0, 4]");
  expect_refused(with_header(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", "1234"), "Q4");
  expect_refused(with_header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "1234"), "shape");
  expect_refused(with_header(R"([1,2])", ""), "not a JSON object");
  expect_refused(with_header(R"({"__metadata__":{"k":1}})", ""), "__metadata__/k");
  EXPECT_NO_THROW(parse_safetensors(good, "good"));
}

// The release checkpoint's one-byte formats are read with their bytes as stored: I8 as signed values,
// the FP8 codes and scales as bytes only (a code's value needs its scale, so asking for values is refused).
TEST(SafetensorsReader, OneByteReleaseFormatsAreReadAsStored) {
  const SafetensorsFile f = parse_safetensors(
      with_header(R"({"c":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]},)"
                  R"("s":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[2,3]},)"
                  R"("p":{"dtype":"I8","shape":[3],"data_offsets":[3,6]}})",
                  std::string("\x38\xb8\x7f\x01\xff\x80", 6)),
      "release");
  EXPECT_EQ(f.find("c")->bytes, (std::vector<uint8_t>{0x38, 0xb8}));
  EXPECT_EQ(f.find("s")->bytes, (std::vector<uint8_t>{0x7f}));
  EXPECT_EQ(safetensors_values(*f.find("p")), (std::vector<double>{1, -1, -128}));
  for (const char* scaled : {"c", "s"}) {
    try {
      safetensors_values(*f.find(scaled));
      ADD_FAILURE() << scaled << " read as values";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("block-scaled format"), std::string::npos) << e.what();
    }
  }
  // one byte per element: two I8 values in four bytes is a size mismatch
  expect_refused(with_header(R"({"p":{"dtype":"I8","shape":[2],"data_offsets":[0,4]}})", "1234"), "need 2");
}

// docs/spec.md §9.4: the byte ranges tile the data exactly. Each case below is
// one range moved off an exact tiling; the tiling itself (written in another
// order, with an empty tensor between) is read, so refusing every two-tensor
// file cannot pass.
std::string two_tensors(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1, const std::string& data) {
  return with_header(fmt::format(R"({{"b":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}},)"
                                 R"("a":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}}}})",
                                 b0, b1, a0, a1),
                     data);
}

TEST(SafetensorsReader, TensorsThatTileTheDataInAnyHeaderOrderAreRead) {
  const SafetensorsFile f = parse_safetensors(two_tensors(4, 8, 0, 4, "BBBBAAAA"), "ok");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(std::string(f.find("a")->bytes.begin(), f.find("a")->bytes.end()), "AAAA");
  EXPECT_EQ(std::string(f.find("b")->bytes.begin(), f.find("b")->bytes.end()), "BBBB");
  // an empty tensor takes no bytes: at the seam between two others it leaves no gap
  EXPECT_NO_THROW(parse_safetensors(with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                                R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                                "AAAABBBB"),
                                    "ok"));
}

TEST(SafetensorsReader, AGapBetweenTwoTensorsIsRefusedNamingBoth) {
  expect_refused(two_tensors(0, 4, 8, 12, "AAAA....BBBB"),
                 "data_offsets: 4 bytes between 'a' [0, 4] and 'b' [8, 12] belong to no tensor");
}

TEST(SafetensorsReader, AGapBeforeTheFirstTensorIsRefusedNamingIt) {
  expect_refused(two_tensors(4, 8, 8, 12, "....AAAABBBB"),
                 "data_offsets: 4 bytes before 'a' [4, 8], the first tensor, belong to no tensor");
}

// The smallest gap is one byte, and it is a gap: a tiling check with any slack (a range may start a byte
// late) reads a file whose tensors sit one byte off where the header says, which is how a writer's
// misaligned offset shows.
TEST(SafetensorsReader, AOneByteGapIsRefusedLikeAnyOther) {
  expect_refused(two_tensors(0, 4, 5, 9, "AAAA.BBBB"),
                 "data_offsets: 1 bytes between 'a' [0, 4] and 'b' [5, 9] belong to no tensor");
  expect_refused(two_tensors(1, 5, 5, 9, ".AAAABBBB"),
                 "data_offsets: 1 bytes before 'a' [1, 5], the first tensor, belong to no tensor");
}

TEST(SafetensorsReader, OverlappingTensorsAreRefusedNamingBoth) {
  expect_refused(two_tensors(0, 4, 2, 6, "AABBBB"), "data_offsets: 'b' [2, 6] overlaps 'a' [0, 4]");
  // an empty tensor inside another's bytes overlaps it too
  expect_refused(with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]}})",
                             "AAAA"),
                 "data_offsets: 'e' [2, 2] overlaps 'a' [0, 4]");
}

TEST(SafetensorsReader, BytesAfterTheLastTensorAreRefusedNamingIt) {
  expect_refused(two_tensors(0, 4, 4, 8, "AAAABBBB...."),
                 "data: 4 bytes follow the last tensor's data ('b' [4, 8] ends at byte 8)");
  expect_refused(with_header(R"({"__metadata__":{}})", "...."),
                 "data: 4 bytes follow the last tensor's data (the header names no tensor)");
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

// Whether the HDF5 file at `p` has an object at `path` (read without the
// harness's reader, which would hide an empty dataset behind "no tokens").
bool h5_has(const fs::path& p, const char* path) {
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0) << p;
  const bool has = H5Lexists(f, "/inputs", H5P_DEFAULT) > 0 && H5Lexists(f, path, H5P_DEFAULT) > 0;
  H5Fclose(f);
  return has;
}

TEST(H5Export, WithoutTokensTheFileHoldsNoInputsTokensAndKeepsItsWeightSeed) {
  WeightsExport e = tiny_export("f32", 3);
  const fs::path p = scratch() / "no-tokens.h5";
  write_weights_export(p, e, "h5");
  EXPECT_FALSE(h5_has(p, "/inputs/tokens"));
  const RunFile h = read_run_file(p);
  EXPECT_TRUE(h.tokens.empty());
  EXPECT_EQ(h.weight_seed, 3u);  // from /weights
  EXPECT_EQ(h.weights_dtype, "f32");
  const auto spec = weight_specs(e.config, make_plan(e.config)).front();
  EXPECT_EQ(read_weight(p, spec.name).values[0], double(float(generate_tensor(spec, 3)[0])));
  e.n_tokens = 1;
  write_weights_export(p, e, "h5");
  EXPECT_TRUE(h5_has(p, "/inputs/tokens"));
  EXPECT_EQ(read_run_file(p).tokens, std::vector<int32_t>{64});  // docs/spec.md §2.4, token seed 0
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

TEST(ExportCommand, WithoutTokensNeitherFormatHoldsATokensTensor) {
  const fs::path st = scratch() / "cmd-no-tokens.safetensors", h5 = scratch() / "cmd-no-tokens.h5";
  for (const auto& [format, out] : {std::pair{"safetensors", st}, {"h5", h5}}) {
    const Result r = run_ced(fmt::format("export --config tiny --format {} --out {}", format, out.string()));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.find("tokens)"), std::string::npos) << r.out;  // "wrote F (N weight tensors)"
  }
  EXPECT_EQ(read_safetensors(st).find("tokens"), nullptr);
  EXPECT_FALSE(h5_has(h5, "/inputs/tokens"));
}

TEST(ExportCommand, SetOverridesReachTheConfigMetadata) {
  const fs::path out = scratch() / "set.safetensors";
  const Result r = run_ced(fmt::format("export --config tiny --set window=5 --out {}", out.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto config = nlohmann::json::parse(read_safetensors(out).metadata.at("config"));
  EXPECT_EQ(config.at("window"), 5);
}

// The memory estimate of an export is for the scalar it generates: f64 values for --dtype f64, f32 for the
// others; the refusal names which (the lab model at the released sizes needs more than any CI machine).
TEST(ExportCommand, TheMemoryRefusalEstimatesTheDtypesOwnScalar) {
  const fs::path out = scratch() / "never-flash.safetensors";
  for (const auto& [dtype, run] : {std::pair{"f32", "a reference run"}, {"bf16", "a reference run"},
                                   {"f64", "a reference-f64 run"}}) {
    const Result r = run_ced(fmt::format("export --config lab-flash --dtype {} --out {}", dtype, out.string()));
    EXPECT_EQ(r.code, 2) << dtype << ": " << r.err;
    EXPECT_NE(r.err.find(fmt::format("config lab-flash: {} of 1 positions needs about", run)), std::string::npos)
        << dtype << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << dtype;
  }
}

TEST(ExportCommand, BadArgumentsExitTwoWithOneLineAndNoFile) {
  const fs::path out = scratch() / "never.safetensors";
  for (const std::string args :
       {"--config tiny --dtype f16", "--config tiny --format npz", "--config nope", "--config tiny --tokens 0",
        "--config tiny --tokens 5x", "--config tiny --weight-seed -1", "--config tiny --set window=0",
        "--config lab-flash", "--config v41-flash"}) {
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
