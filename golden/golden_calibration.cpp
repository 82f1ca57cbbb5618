#include "golden/golden_calibration.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <toml++/toml.h>

#include "models/lab/hdf5_files.hpp"
#include "model/error.hpp"
#include "compare/run_compare.hpp"
#include "backends/registry.hpp"
#include "golden/golden_set.hpp"

namespace ced::golden {
namespace fs = std::filesystem;
namespace {

std::vector<fs::path> golden_files(const fs::path& dir) {
  if (!fs::is_directory(dir)) throw InputError(fmt::format("golden: '{}' is not a directory", dir.string()));
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".h5") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw InputError(fmt::format("golden: no .h5 files in '{}'", dir.string()));
  return files;
}

// A double that reads back bit for bit, always with a '.' or an exponent so
// TOML reads a float.
std::string real(double v) {
  std::string s = fmt::format("{:.17g}", v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

[[noreturn]] void bad(const fs::path& path, const toml::source_region& src, const std::string& what) {
  throw InputError(fmt::format("{}:{}: {} (measure it again with `ced golden calibrate`)", path.string(),
                               src.begin.line, what));
}

// Every key of `t` is one of `known`: a key this reader does not know (a
// misspelling, another writer's or version's) is refused, not read past.
void only_known_keys(const fs::path& path, const toml::table& t, std::initializer_list<std::string_view> known,
                     const std::string& where) {
  for (const auto& [key, node] : t)
    if (std::find(known.begin(), known.end(), key.str()) == known.end())
      bad(path, node.source(), fmt::format("unknown key '{}' in {}", key.str(), where));
}

double non_negative(const fs::path& path, const toml::table& t, const char* key) {
  const toml::node* n = t.get(key);
  if (!n || !n->is_number()) bad(path, t.source(), fmt::format("'{}' must be a number", key));
  const double v = n->is_integer() ? double(*n->value_exact<int64_t>()) : *n->value<double>();
  if (!(v >= 0) || !std::isfinite(v)) bad(path, n->source(), fmt::format("'{}' = {} must be finite and >= 0", key, v));
  return v;
}

}  // namespace

std::pair<uint64_t, uint64_t> file_fingerprint(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read '{}'", path.string()));
  uint64_t h = 0xCBF29CE484222325ull, n = 0;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    const std::streamsize got = in.gcount();
    for (std::streamsize i = 0; i < got; ++i) h = (h ^ uint8_t(buf[i])) * 0x100000001B3ull;
    n += uint64_t(got);
    if (!in) break;
  }
  return {n, h};
}

GoldenCalibration measure_golden_calibration(const fs::path& dir, bool verbose) {
  GoldenCalibration cal;
  for (const auto& path : golden_files(dir)) {
    const RunFile f = read_run_file(path);
    check_fits_in_memory(f.config, int64_t(f.tokens.size()), "reference");
    auto f32 = make_backend("reference", f.config, f.weight_seed);
    FileCalibration& fc = cal.files[path.filename().string()];
    std::tie(fc.bytes, fc.fnv1a64) = file_fingerprint(path);
    for (const auto& nr : f.runs) {
      const auto m = calibrate_runs(nr.name, f32->run(request_of(f, nr.result)), nr.result);
      fc.tensors.insert(m.begin(), m.end());
    }
    if (verbose) std::printf("calibrated %s (%zu tensors)\n", path.filename().string().c_str(), fc.tensors.size());
  }
  return cal;
}

void write_golden_calibration(const fs::path& dir, const GoldenCalibration& cal) {
  std::string s =
      "# The f32 reference's error against each golden f64 tensor (docs/spec.md §8 self-calibrating rules):\n"
      "# rel_l2 = ||r32 - r64|| / ||r64||, max_abs = max |r32 - r64|. Written by `ced golden calibrate`\n"
      "# (and `ced golden regenerate`); every `ced gate` of a backend other than reference-f64 scales\n"
      "# its bounds from these figures, never from the run it judges. bytes and fnv1a64 name the\n"
      "# golden file each entry was measured on.\n";
  for (const auto& [name, fc] : cal.files) {
    s += fmt::format("\n[[file]]\nname = \"{}\"\nbytes = {}\nfnv1a64 = \"{:#018x}\"\ntensors = [\n", name, fc.bytes,
                     fc.fnv1a64);
    for (const auto& [tensor, c] : fc.tensors)
      s += fmt::format("  {{ name = \"{}\", rel_l2 = {}, max_abs = {} }},\n", tensor, real(c.rel_l2), real(c.max_abs));
    s += "]\n";
  }
  const fs::path path = dir / kCalibrationFile;
  const fs::path tmp = dir / fmt::format("{}.tmp.{}", kCalibrationFile, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << s;
    if (!out.flush()) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw InputError(fmt::format("cannot write '{}'", path.string()));
    }
  }
  fs::rename(tmp, path);
}

GoldenCalibration read_golden_calibration(const fs::path& dir) {
  const fs::path path = dir / kCalibrationFile;
  if (!fs::is_regular_file(path))
    throw InputError(fmt::format("golden: '{}' is missing: measure it with `ced golden calibrate --dir {}`",
                                 path.string(), dir.string()));
  toml::table root;
  try {
    root = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    bad(path, e.source(), std::string(e.description()));
  }
  GoldenCalibration cal;
  only_known_keys(path, root, {"file"}, "the file (only [[file]] tables)");
  const toml::array* files = root["file"].as_array();
  if (!files) bad(path, root.source(), "no [[file]] tables");
  for (const toml::node& fn : *files) {
    const toml::table* ft = fn.as_table();
    if (!ft) bad(path, fn.source(), "'file' must be an array of tables");
    only_known_keys(path, *ft, {"name", "bytes", "fnv1a64", "tensors"}, "a [[file]]");
    const auto name = (*ft)["name"].value_exact<std::string>();
    const auto hash = (*ft)["fnv1a64"].value_exact<std::string>();
    const auto bytes = (*ft)["bytes"].value_exact<int64_t>();
    const toml::array* tensors = (*ft)["tensors"].as_array();
    if (!name || !hash || !bytes || *bytes < 0 || !tensors)
      bad(path, ft->source(), "a [[file]] needs name, bytes, fnv1a64 and tensors");
    FileCalibration fc;
    fc.bytes = uint64_t(*bytes);
    size_t used = 0;
    try {
      fc.fnv1a64 = std::stoull(*hash, &used, 16);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != hash->size() || used == 0) bad(path, ft->source(), fmt::format("fnv1a64 '{}' is not hexadecimal", *hash));
    for (const toml::node& tn : *tensors) {
      const toml::table* tt = tn.as_table();
      const auto tname = tt ? (*tt)["name"].value_exact<std::string>() : std::nullopt;
      if (!tname) bad(path, tn.source(), "a tensor entry needs a name");
      only_known_keys(path, *tt, {"name", "rel_l2", "max_abs"}, fmt::format("tensor '{}'", *tname));
      Calibration c;
      c.rel_l2 = non_negative(path, *tt, "rel_l2");
      c.max_abs = non_negative(path, *tt, "max_abs");
      if (!fc.tensors.emplace(*tname, c).second) bad(path, tn.source(), fmt::format("tensor '{}' twice", *tname));
    }
    if (!cal.files.emplace(*name, std::move(fc)).second) bad(path, ft->source(), fmt::format("file '{}' twice", *name));
  }
  return cal;
}

const FileCalibration& calibration_of_file(const GoldenCalibration& cal, const fs::path& golden_file) {
  const std::string name = golden_file.filename().string();
  const auto it = cal.files.find(name);
  if (it == cal.files.end())
    throw InputError(fmt::format("golden: {} has no entry for {}: measure it with `ced golden calibrate`",
                                 kCalibrationFile, name));
  if (file_fingerprint(golden_file) != std::make_pair(it->second.bytes, it->second.fnv1a64))
    throw InputError(fmt::format("golden: {} was measured on another {} (size or FNV-1a differs): measure it again "
                                 "with `ced golden calibrate`",
                                 kCalibrationFile, name));
  return it->second;
}

}  // namespace ced::golden
