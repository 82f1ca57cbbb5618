// docs/spec.md §9: run files and cache files; see hdf5_file.hpp.
#include "models/lab/hdf5_files.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <limits>
#include <set>
#include <stdexcept>

#include "io/h5_file_ops.hpp"
#include "io/h5_util.hpp"
#include "models/lab/hdf5_runs.hpp"
#include "models/lab/weights_export.hpp"
#include "model/error.hpp"
#include "models/lab/plan.hpp"
#include "models/lab/weights.hpp"

namespace ced {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& obj, const std::string& what) {
  throw InputError(fmt::format("{}: {}", obj, what));
}

// ---- root -----------------------------------------------------------------

void write_root(hid_t file, const std::string& generator) { write_file_identity(file, "lab", generator); }

struct Root {
  std::string generator;
  int64_t version = 0;
};

// Checks format and version (kOldestFormatVersion .. kFileFormatVersion).
Root read_root(hid_t file) {
  const FileIdentity id = read_file_identity(file);
  if (id.family != "lab")
    fail("/", fmt::format("format is '{}' of the {} family, not the lab family's '{}' (its commands read it: "
                          "docs/v41.md §12)", id.format, id.family, kFileFormat));
  const int64_t version = id.version;
  if (version < kOldestFormatVersion || version > kFileFormatVersion)
    fail("/", fmt::format("format_version {} is not supported (this build reads {} to {}); regenerate with `{}`",
                          version, kOldestFormatVersion, kFileFormatVersion, kRegenerateCommand));
  return {id.generator, version};
}

// ---- config (docs/spec.md §1) -----------------------------------------------------

using IntKey = ConfigIntKey;
using RealKey = ConfigRealKey;
using ListKey = ConfigListKey;
constexpr const char* kTieKey = "tie_decoder_kv";  // int64 0/1

template <class Entry>
const Entry* find_key(std::span<const Entry> table, const std::string& key) {
  for (const auto& e : table)
    if (key == e.key) return &e;
  return nullptr;
}

[[noreturn]] void unmapped(const std::string& key) {
  throw std::logic_error(fmt::format("io: config key '{}' has no HDF5 mapping (update models/lab/hdf5_files.cpp)", key));
}

void write_config(hid_t file, const Config& c) {
  const std::string g = "/config";
  h5::create_group(file, g);
  for (const std::string& key : scalar_keys()) {
    if (const IntKey* k = find_key(config_int_keys(), key)) h5::write_int_attr(file, g, key, c.*(k->member));
    else if (const RealKey* r = find_key(config_real_keys(), key)) h5::write_real_attr(file, g, key, c.*(r->member));
    else if (key == kTieKey) h5::write_int_attr(file, g, key, c.tie_decoder_kv ? 1 : 0);
    else unmapped(key);
  }
  for (const std::string& key : list_keys()) {
    const ListKey* k = find_key(config_list_keys(), key);
    if (!k) unmapped(key);
    const std::vector<int64_t>& v = c.*(k->member);
    h5::write_ints(file, g + "/" + key, v.data(), {hsize_t(v.size())});
  }
  h5::write_string_attr(file, g, "name", c.name);
}

// Validated (ced::validate). A file without a "name" attr gets `fallback_name`.
Config read_config(hid_t file, const std::string& fallback_name) {
  const std::string g = "/config";
  if (!h5::exists(file, g)) fail(g, "is missing");
  Config c;
  for (const std::string& key : scalar_keys()) {
    if (const IntKey* k = find_key(config_int_keys(), key)) {
      c.*(k->member) = h5::read_int_attr(file, g, key);
    } else if (const RealKey* r = find_key(config_real_keys(), key)) {
      c.*(r->member) = h5::read_real_attr(file, g, key);
    } else if (key == kTieKey) {  // optional, as in a TOML file
      const int64_t v = h5::has_attr(file, g, key) ? h5::read_int_attr(file, g, key) : 0;
      if (v != 0 && v != 1) fail(g, fmt::format("attribute '{}' is {}, not 0 or 1", key, v));
      c.tie_decoder_kv = v == 1;
    } else {
      unmapped(key);
    }
  }
  for (const std::string& key : list_keys()) {
    const ListKey* k = find_key(config_list_keys(), key);
    if (!k) unmapped(key);
    c.*(k->member) = h5::read_ints(file, g + "/" + key, 1).values;
  }
  c.name = h5::has_attr(file, g, "name") ? h5::read_string_attr(file, g, "name") : fallback_name;
  validate(c);
  return c;
}

// ---- inputs ---------------------------------------------------------------

const std::string kTokens = "/inputs/tokens";

void check_tokens(const Config& c, const std::vector<int32_t>& tokens, uint64_t token_seed, bool tokens_explicit) {
  try {
    validate_tokens(c, tokens);
  } catch (const InputError& e) {
    throw InputError(fmt::format("/inputs/{}", e.what()));  // "tokens: token 5 at index ..."
  }
  if (tokens_explicit) return;
  const std::vector<int32_t> made = make_tokens(token_seed, c.vocab_size, static_cast<int64_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] != made[i])
      fail(kTokens, fmt::format("token {} at index {} differs from token_seed {}'s {} (tokens_explicit is 0)",
                                tokens[i], i, token_seed, made[i]));
}

void write_inputs(hid_t file, const RunFile& f) {
  check_tokens(f.config, f.tokens, f.token_seed, f.tokens_explicit);
  // docs/spec.md §9.1: weights without a prompt (`ced export --format h5`
  // without --tokens) have no /inputs/tokens; /weights records the weight seed.
  if (f.tokens.empty() && !f.weights_dtype.empty()) return;
  h5::create_group(file, "/inputs");
  h5::write_dataset(file, kTokens, H5T_STD_I32LE, H5T_NATIVE_INT32, f.tokens.data(), {hsize_t(f.tokens.size())});
  h5::write_uint_attr(file, kTokens, "weight_seed", f.weight_seed);
  h5::write_uint_attr(file, kTokens, "token_seed", f.token_seed);
  h5::write_int_attr(file, kTokens, "tokens_explicit", f.tokens_explicit ? 1 : 0);
}

void read_inputs(hid_t file, RunFile& f) {
  const std::vector<int64_t> raw = h5::read_ints(file, kTokens, 1).values;
  f.tokens.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] < std::numeric_limits<int32_t>::min() || raw[i] > std::numeric_limits<int32_t>::max())
      fail(kTokens, fmt::format("token {} at index {} is out of range [0, {})", raw[i], i, f.config.vocab_size));
    f.tokens[i] = static_cast<int32_t>(raw[i]);
  }
  f.weight_seed = h5::read_uint_attr(file, kTokens, "weight_seed");
  f.token_seed = h5::read_uint_attr(file, kTokens, "token_seed");
  f.tokens_explicit = h5::has_attr(file, kTokens, "tokens_explicit") &&
                      h5::read_int_attr(file, kTokens, "tokens_explicit") != 0;
  check_tokens(f.config, f.tokens, f.token_seed, f.tokens_explicit);
}

// ---- weights (docs/spec.md §2) ----------------------------------------------------

void write_weights(hid_t file, const Config& c, uint64_t weight_seed, const std::string& dtype) {
  if (dtype != "f32" && dtype != "f64" && dtype != "bf16")
    fail("/weights", fmt::format("dtype '{}' is not f32, f64 or bf16", dtype));
  h5::create_group(file, "/weights");
  h5::write_string_attr(file, "/weights", "dtype", dtype);
  h5::write_uint_attr(file, "/weights", "weight_seed", weight_seed);
  for (const TensorSpec& t : weight_specs(c, make_plan(c))) {
    std::vector<double> v = generate_tensor(t, weight_seed);
    // bf16 values are stored as the float32 they stand for (exact; docs/spec.md §9.1).
    if (dtype == "bf16")
      for (double& x : v) x = std::bit_cast<float>(uint32_t(bf16_bits_of(x)) << 16);
    const std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    h5::write_reals(file, "/weights/" + t.name, v.data(), dims, dtype != "f64");
  }
}

// ---- runs -----------------------------------------------------------------

void check_run_name(const std::string& name) {
  if (name.empty() || name == "." || name.find('/') != std::string::npos)
    fail(fmt::format("/runs/{}", name), "a run name must be non-empty, not '.', and hold no '/'");
}

RunFile read_header(hid_t file, const fs::path& path) {
  RunFile f;
  const Root root = read_root(file);
  f.generator = root.generator;
  f.format_version = root.version;
  f.config = read_config(file, path.string());
  f.weights_dtype = h5::exists(file, "/weights") ? h5::read_string_attr(file, "/weights", "dtype") : "";
  if (!f.weights_dtype.empty() && !h5::exists(file, kTokens))  // weights without a prompt (write_inputs)
    f.weight_seed = h5::read_uint_attr(file, "/weights", "weight_seed");
  else
    read_inputs(file, f);
  return f;
}

}  // namespace

const NamedRun* RunFile::find_run(std::string_view name) const {
  for (const NamedRun& r : runs)
    if (r.name == name) return &r;
  return nullptr;
}

void write_run_file(const fs::path& path, const RunFile& f) {
  h5::write_atomically(path, [&](hid_t file) {
    validate(f.config);
    write_root(file, f.generator);
    write_config(file, f.config);
    write_inputs(file, f);
    if (!f.weights_dtype.empty()) write_weights(file, f.config, f.weight_seed, f.weights_dtype);
    h5::create_group(file, "/runs", /*track_order=*/true);
    std::set<std::string> names;
    for (const NamedRun& r : f.runs) {
      check_run_name(r.name);
      if (!names.insert(r.name).second) fail("/runs/" + r.name, "two runs have this name");
      h5::write_run(file, "/runs/" + r.name, r.result, f.config, static_cast<int64_t>(f.tokens.size()));
    }
  });
}

RunFile read_run_file_header(const fs::path& path) {
  return h5::read_file(path, [&](hid_t file) { return read_header(file, path); });
}

RunFile read_run_file(const fs::path& path) {
  return h5::read_file(path, [&](hid_t file) {
    RunFile f = read_header(file, path);
    for (const std::string& name : h5::list(file, "/runs"))
      f.runs.push_back({name, h5::read_run(file, "/runs/" + name, f.config, static_cast<int64_t>(f.tokens.size()),
                                           f.format_version)});
    return f;
  });
}

std::vector<std::string> list_runs(const fs::path& path) {
  return h5::read_file(path, [&](hid_t file) {
    read_root(file);
    return h5::list(file, "/runs");
  });
}

RunResult read_run(const fs::path& path, const std::string& run) {
  return h5::read_file(path, [&](hid_t file) {
    const RunFile f = read_header(file, path);
    const std::string rp = "/runs/" + run;
    if (run.empty() || run == "." || run.find('/') != std::string::npos || !h5::exists(file, rp)) {
      const std::vector<std::string> names = h5::list(file, "/runs");
      std::string all;
      for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
      fail(rp, fmt::format("no such run (the file holds: {})", all.empty() ? "none" : all));
    }
    return h5::read_run(file, rp, f.config, static_cast<int64_t>(f.tokens.size()), f.format_version);
  });
}

WeightTensor read_weight(const fs::path& path, const std::string& name) {
  return h5::read_file(path, [&](hid_t file) {
    read_root(file);
    if (!h5::exists(file, "/weights")) fail("/weights", "is missing (the file was written without weights)");
    const std::string wp = "/weights/" + name;
    if (name.empty() || name == "." || name.find('/') != std::string::npos || !h5::exists(file, wp))
      fail(wp, "no such tensor");
    h5::Array<double> a = h5::read_reals(file, wp, -1);
    return WeightTensor{std::move(a.dims), std::move(a.values)};
  });
}

namespace {

// The prompt prefix of a cache file, in the layout of a run file's
// /inputs/tokens (docs/spec.md §9); its length must be the cache's prefix_len.
RunFile cache_inputs(const CacheFile& f) {
  RunFile r;
  r.config = f.config;
  r.tokens = f.tokens;
  r.weight_seed = f.weight_seed;
  r.token_seed = f.token_seed;
  r.tokens_explicit = f.tokens_explicit;
  return r;
}

void check_cache_prefix(const CacheFile& f) {
  if (int64_t(f.tokens.size()) != f.cache.prefix_len)
    fail(kTokens, fmt::format("holds {} tokens, the cache covers a prefix of {}", f.tokens.size(), f.cache.prefix_len));
}

void write_cache_inputs(hid_t file, const CacheFile& f) {
  check_cache_prefix(f);
  write_inputs(file, cache_inputs(f));
}

void read_cache_inputs(hid_t file, CacheFile& f) {
  if (!h5::exists(file, kTokens))
    fail(kTokens, "is missing: the cache file predates recorded prompts, so what it belongs to cannot be checked; "
                  "write it again with `ced run ... --cache-out`");
  RunFile r;
  r.config = f.config;
  read_inputs(file, r);
  if (r.weight_seed != f.weight_seed)
    fail(kTokens, fmt::format("weight_seed {} differs from the root's {}", r.weight_seed, f.weight_seed));
  f.tokens = std::move(r.tokens);
  f.token_seed = r.token_seed;
  f.tokens_explicit = r.tokens_explicit;
  check_cache_prefix(f);
}

}  // namespace

void write_cache_file(const fs::path& path, const CacheFile& f) {
  h5::write_atomically(path, [&](hid_t file) {
    validate(f.config);
    write_root(file, f.generator);
    write_config(file, f.config);
    h5::write_uint_attr(file, "/", "weight_seed", f.weight_seed);
    h5::write_cache(file, "/cache", f.cache, f.config);
    write_cache_inputs(file, f);
  });
}

CacheFile read_cache_file(const fs::path& path) {
  return h5::read_file(path, [&](hid_t file) {
    CacheFile f;
    f.generator = read_root(file).generator;
    f.config = read_config(file, path.string());
    f.weight_seed = h5::read_uint_attr(file, "/", "weight_seed");
    if (!h5::exists(file, "/cache")) fail("/cache", "is missing (not a cache file?)");
    f.cache = h5::read_cache(file, "/cache", f.config);
    read_cache_inputs(file, f);
    return f;
  });
}

void write_table_file(const fs::path& path, const TableFile& t) {
  h5::write_atomically(path, [&](hid_t file) {
    write_root(file, t.generator);
    write_config(file, t.config);
    for (const auto& [k, v] : t.attrs) h5::write_string_attr(file, "/", k, v);
    auto write_group = [&](const std::string& g, const auto& columns) {
      h5::create_group(file, g, /*track_order=*/true);
      for (const auto& [name, col] : columns) {
        if (col.size() != columns.front().second.size()) fail(g + "/" + name, "columns differ in length");
        h5::write_reals(file, g + "/" + name, col.data(), {hsize_t(col.size())}, /*as_float=*/false);
      }
    };
    if (!t.columns.empty() || t.groups.empty()) write_group("/table", t.columns);
    for (const auto& [g, columns] : t.groups) write_group("/" + g, columns);
  });
}

TableFile read_table_file(const fs::path& path, const std::vector<std::string>& attr_names,
                          const std::vector<std::string>& group_names) {
  return h5::read_file(path, [&](hid_t file) {
    TableFile t;
    if (!h5::has_attr(file, "/", "format") || h5::read_string_attr(file, "/", "format") != kFileFormat)
      fail("/", fmt::format("not a {} file", kFileFormat));
    // The table layout is the same in every format version so far.
    const int64_t version = read_file_identity(file).version;
    if (version < 1 || version > kFileFormatVersion)
      fail("/", fmt::format("format_version {} is not supported (this build reads 1 to {})", version,
                            kFileFormatVersion));
    t.generator = h5::read_string_attr(file, "/", "generator");
    t.config = read_config(file, path.string());
    for (const std::string& a : attr_names)
      if (h5::has_attr(file, "/", a)) t.attrs.emplace_back(a, h5::read_string_attr(file, "/", a));
    auto read_group = [&](const std::string& g) {
      std::vector<std::pair<std::string, std::vector<double>>> columns;
      for (const std::string& name : h5::list(file, g)) {
        std::vector<double> col = h5::read_reals(file, g + "/" + name, 1).values;
        if (!columns.empty() && col.size() != columns.front().second.size())
          fail(g + "/" + name, "columns differ in length");
        columns.emplace_back(name, std::move(col));
      }
      return columns;
    };
    if (h5::exists(file, "/table")) t.columns = read_group("/table");
    for (const std::string& g : group_names)
      if (h5::exists(file, "/" + g)) t.groups.emplace_back(g, read_group("/" + g));
    return t;
  });
}

}  // namespace ced
