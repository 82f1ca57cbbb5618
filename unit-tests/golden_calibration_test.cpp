// The stored calibration of the golden set (golden/golden_calibration.hpp):
// the f32 gate's self-calibrating bounds come from calibration.toml, measured
// once, so a numerical slip in the f32 reference fails its out and logits
// verdicts; the file reads back bit for bit; a missing, malformed or stale
// file is bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "model/error.hpp"
#include "golden/golden_calibration.hpp"
#include "golden/golden_set.hpp"

using namespace ced;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ced-calibration-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

golden::GateOptions f32_gate(const fs::path& dir, const std::string& only) {
  golden::GateOptions g;
  g.dir = dir;
  g.backend = "reference";
  g.only = only;
  g.quiet = true;
  return g;
}

}  // namespace

// The defect this file fixes: the f32 gate took its bounds from the run it
// judged, so its out and logits verdicts could not fail. ffn-output-scaled
// moves every hidden state by about 2^-10 of the FFN's share and changes no
// selection, so only the out and logits verdicts can catch it.
TEST(GoldenCalibration, F32GateFailsOnASmallNumericalSlipInTheF32Reference) {
  auto g = f32_gate(golden::default_golden_dir(), "tiny.h5:full");
  ASSERT_TRUE(golden::run_gate(g).failures.empty()) << "the unfaulted f32 reference must pass";
  g.fault = Fault::FfnOutputScaled;
  const auto rep = golden::run_gate(g);
  ASSERT_EQ(rep.failures.size(), 1u);
  const std::string& what = rep.failures[0].what;
  EXPECT_TRUE(what.find("/out") != std::string::npos || what.find("/logits") != std::string::npos) << what;
  EXPECT_EQ(what.find("/topk"), std::string::npos) << what;
}

TEST(GoldenCalibration, WrittenCalibrationReadsBackBitForBit) {
  const fs::path dir = scratch("roundtrip");
  golden::GoldenCalibration cal;
  auto& f = cal.files["x.h5"];
  f.bytes = 12345;
  f.fnv1a64 = 0xFEDCBA9876543210ull;
  const double awkward[] = {0.0, 0.1, 1e-300, std::numeric_limits<double>::denorm_min(), 3.0, 1.0 / 3.0,
                            std::numeric_limits<double>::max()};
  for (size_t i = 0; i < std::size(awkward); ++i)
    f.tensors["runs/r/layers/" + std::to_string(i) + "/out"] = Calibration{awkward[i], awkward[std::size(awkward) - 1 - i]};
  golden::write_golden_calibration(dir, cal);
  const auto back = golden::read_golden_calibration(dir);
  ASSERT_EQ(back.files.size(), 1u);
  const auto& b = back.files.at("x.h5");
  EXPECT_EQ(b.bytes, f.bytes);
  EXPECT_EQ(b.fnv1a64, f.fnv1a64);
  ASSERT_EQ(b.tensors.size(), f.tensors.size());
  for (const auto& [name, c] : f.tensors) {
    EXPECT_EQ(b.tensors.at(name).rel_l2, c.rel_l2) << name;
    EXPECT_EQ(b.tensors.at(name).max_abs, c.max_abs) << name;
  }
}

// Measuring prints one line per golden file when asked to (`ced golden calibrate`), and nothing otherwise
// (the gate and the library callers measure quietly).
TEST(GoldenCalibration, MeasuringPrintsALinePerFileOnlyWhenVerbose) {
  const fs::path dir = scratch("verbose");
  fs::copy_file(golden::default_golden_dir() / "tiny.h5", dir / "tiny.h5");
  ::testing::internal::CaptureStdout();
  const auto quiet = golden::measure_golden_calibration(dir, false);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
  ::testing::internal::CaptureStdout();
  const auto loud = golden::measure_golden_calibration(dir, true);
  const std::string said = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(loud.files.size(), 1u);
  EXPECT_EQ(said, "calibrated tiny.h5 (" + std::to_string(loud.files.at("tiny.h5").tensors.size()) + " tensors)\n");
  EXPECT_EQ(quiet.files.at("tiny.h5").tensors.size(), loud.files.at("tiny.h5").tensors.size());
}

TEST(GoldenCalibration, CommittedFileCoversEveryGoldenFileAsItIs) {
  const fs::path dir = golden::default_golden_dir();
  const auto cal = golden::read_golden_calibration(dir);
  for (const char* name : {"tiny.h5", "small.h5", "v41-shape.h5"}) {
    const auto& fc = golden::calibration_of_file(cal, dir / name);  // throws when stale
    EXPECT_FALSE(fc.tensors.empty()) << name;
    // The f32 reference is not exact: a zero error would make the bound a bare floor.
    for (const auto& [t, c] : fc.tensors) EXPECT_GT(c.rel_l2, 0.0) << name << " " << t;
  }
}

TEST(GoldenCalibration, GateRefusesAMissingMalformedOrStaleCalibration) {
  const fs::path dir = scratch("gate");
  for (const char* name : {"tiny.h5", "policy-calibrated.toml"})
    fs::copy_file(golden::default_golden_dir() / name, dir / name);
  const auto g = f32_gate(dir, "tiny.h5:full");
  auto message = [&] {
    try {
      golden::run_gate(g);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no InputError");
  };
  EXPECT_NE(message().find("ced golden calibrate"), std::string::npos) << message();  // missing
  write_text(dir / golden::kCalibrationFile, "[[file]]\nname = \"tiny.h5\"\nbytes = 1\n");
  EXPECT_NE(message().find("calibration.toml:"), std::string::npos) << message();  // malformed
  // each of the four keys of a [[file]] is required on its own: here only the hash is missing
  write_text(dir / golden::kCalibrationFile, "[[file]]\nname = \"tiny.h5\"\nbytes = 1\ntensors = []\n");
  EXPECT_NE(message().find("a [[file]] needs name, bytes, fnv1a64 and tensors"), std::string::npos) << message();
  // Every tensor of the real file, but measured on other bytes.
  auto cal = golden::read_golden_calibration(golden::default_golden_dir());
  cal.files.at("tiny.h5").fnv1a64 ^= 1;
  golden::write_golden_calibration(dir, cal);
  EXPECT_NE(message().find("measured on another tiny.h5"), std::string::npos) << message();  // stale
  cal.files.at("tiny.h5").fnv1a64 ^= 1;
  cal.files.at("tiny.h5").tensors.at("runs/full/logits").rel_l2 = -1;
  golden::write_golden_calibration(dir, cal);
  EXPECT_NE(message().find("must be finite and >= 0"), std::string::npos) << message();  // negative
  cal.files.at("tiny.h5").tensors.at("runs/full/logits").rel_l2 = 1e-7;
  golden::write_golden_calibration(dir, cal);
  EXPECT_EQ(message(), "no InputError");  // and the copy then gates
  fs::remove_all(dir.parent_path());
}

// A calibration file is read key by key: a key the format does not have, at
// the top, in a [[file]] or in a tensor entry, is refused with one line naming
// it and its line, not read past (a file of another writer or version would
// otherwise gate with what this reader took of it). The file without the
// planted key reads.
TEST(GoldenCalibration, AnUnknownKeyAtEveryLevelIsRefusedNamingItAndItsLine) {
  const fs::path dir = scratch("unknown-keys");
  const std::string good =
      "[[file]]\n"
      "name = \"x.h5\"\n"
      "bytes = 12\n"
      "fnv1a64 = \"0x00000000000000ff\"\n"
      "tensors = [\n"
      "  { name = \"runs/full/logits\", rel_l2 = 1e-7, max_abs = 2e-6 },\n"
      "]\n";
  write_text(dir / golden::kCalibrationFile, good);
  const auto cal = golden::read_golden_calibration(dir);
  ASSERT_EQ(cal.files.at("x.h5").tensors.at("runs/full/logits").max_abs, 2e-6);
  auto refusal = [&](const std::string& text) {
    write_text(dir / golden::kCalibrationFile, text);
    try {
      golden::read_golden_calibration(dir);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no InputError");
  };
  auto planted = [&](const std::string& text, const std::string& want) {
    const std::string msg = refusal(text);
    EXPECT_NE(msg.find((dir / golden::kCalibrationFile).string() + want), std::string::npos) << msg << "; want " << want;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  planted("generator = \"me\"\n" + good, ":1: unknown key 'generator' in the file");
  std::string in_file = good;
  in_file.insert(in_file.find("bytes"), "hash = \"0xff\"\n");
  planted(in_file, ":3: unknown key 'hash' in a [[file]]");
  std::string in_tensor = good;
  in_tensor.insert(in_tensor.find(" }"), ", max_abs_err = 1.0");
  planted(in_tensor, ":6: unknown key 'max_abs_err' in tensor 'runs/full/logits'");
  fs::remove_all(dir.parent_path());
}
