// docs/spec.md §9 runs and docs/spec.md §6 persisted caches in HDF5; see hdf5_run.hpp.
#include "models/lab/hdf5_runs.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "io/h5_util.hpp"
#include "model/error.hpp"
#include "models/lab/plan.hpp"

namespace ced::h5 {
namespace {

using MatI = Eigen::Matrix<int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

[[noreturn]] void fail(const std::string& obj, const std::string& what) {
  throw InputError(fmt::format("{}: {}", obj, what));
}

// ---- matrices -------------------------------------------------------------

bool survives_float(const double* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double x = v[i];
    if (!std::isnan(x) && static_cast<double>(static_cast<float>(x)) != x) return false;
  }
  return true;
}

// f32 and bf16 results are floats; store them as such unless a value would
// change (then double: the file never rounds what a backend returned).
void write_matrix(hid_t file, const std::string& path, const MatD& m, const std::string& dtype) {
  const bool as_float = dtype != "f64" && survives_float(m.data(), size_t(m.size()));
  write_reals(file, path, m.data(), {hsize_t(m.rows()), hsize_t(m.cols())}, as_float);
}

// The same rule for a 1-D dataset.
void write_real_vector(hid_t file, const std::string& path, const std::vector<double>& v, const std::string& dtype) {
  const bool as_float = dtype != "f64" && survives_float(v.data(), v.size());
  write_reals(file, path, v.data(), {hsize_t(v.size())}, as_float);
}

MatD read_matrix(hid_t file, const std::string& path) {
  Array<double> a = read_reals(file, path, 2);
  return Eigen::Map<const MatD>(a.values.data(), a.dims[0], a.dims[1]);
}

void write_int_matrix(hid_t file, const std::string& path, const MatI& m) {
  write_ints(file, path, m.data(), {hsize_t(m.rows()), hsize_t(m.cols())});
}

MatI read_int_matrix(hid_t file, const std::string& path) {
  Array<int64_t> a = read_ints(file, path, 2);
  return Eigen::Map<const MatI>(a.values.data(), a.dims[0], a.dims[1]);
}

void write_vector(hid_t file, const std::string& path, const std::vector<int64_t>& v) {
  write_ints(file, path, v.data(), {hsize_t(v.size())});
}

std::vector<int64_t> read_vector(hid_t file, const std::string& path) { return read_ints(file, path, 1).values; }

// ---- checks ---------------------------------------------------------------

// Columns must match unless there are no rows (an empty matrix may be 0 x 0).
void check_cols(const std::string& path, Eigen::Index rows, Eigen::Index cols, int64_t want, const char* key) {
  if (rows > 0 && cols != want) fail(path, fmt::format("has {} columns, but {} is {}", cols, key, want));
}

void check_positions(const std::string& path, const std::vector<int64_t>& pos, int64_t end, Eigen::Index rows,
                     const char* rows_of) {
  if (static_cast<Eigen::Index>(pos.size()) != rows)
    fail(path, fmt::format("has {} entries, but {} has {} rows", pos.size(), rows_of, rows));
  for (size_t i = 0; i < pos.size(); ++i) {
    if (pos[i] < 0 || pos[i] >= end)
      fail(path, fmt::format("position {} at index {} is outside [0, n_prompt + decode_steps = {})", pos[i], i, end));
    if (i > 0 && pos[i] <= pos[i - 1]) fail(path, fmt::format("is not ascending at index {}", i));
  }
}

void check_capture(const std::string& path, const LayerCapture& cap, const Config& c, int64_t end) {
  check_positions(path + "/positions", cap.positions, end, cap.out.rows(), "out");
  check_cols(path + "/out", cap.out.rows(), cap.out.cols(), c.d_model, "d_model");
  if (!cap.has_topk) {
    if (cap.has_scores) fail(path + "/topk_scores", "given without topk");
    return;
  }
  if (c.compress_ratios[size_t(cap.layer)] == 0) fail(path + "/topk", "given for an SWA-only layer");
  if (cap.topk.rows() != cap.out.rows())
    fail(path + "/topk", fmt::format("has {} rows, but out has {}", cap.topk.rows(), cap.out.rows()));
  check_cols(path + "/topk", cap.topk.rows(), cap.topk.cols(), c.index_topk, "index_topk");
  if (cap.topk.size() > 0 && cap.topk.minCoeff() < -1) fail(path + "/topk", "holds an entry id below -1");
  if (!cap.has_scores) return;
  // docs/spec.md §9.1: the index scores, one row (or value) per row of topk
  if (cap.topk_scores.rows() != cap.topk.rows())
    fail(path + "/topk_scores", fmt::format("has {} rows, but topk has {}", cap.topk_scores.rows(), cap.topk.rows()));
  check_cols(path + "/topk_scores", cap.topk_scores.rows(), cap.topk_scores.cols(), c.index_topk, "index_topk");
  if (static_cast<Eigen::Index>(cap.kth_score.size()) != cap.topk.rows())
    fail(path + "/kth_score", fmt::format("has {} entries, but topk has {} rows", cap.kth_score.size(), cap.topk.rows()));
  if (static_cast<Eigen::Index>(cap.left_out_score.size()) != cap.topk.rows())
    fail(path + "/left_out_score",
         fmt::format("has {} entries, but topk has {} rows", cap.left_out_score.size(), cap.topk.rows()));
}

Mode parse_mode_attr(const std::string& obj, const std::string& s) {
  try {
    return parse_mode(s);
  } catch (const InputError&) {
    fail(obj, fmt::format("attribute 'mode' is '{}', not full, ced or resume", s));
  }
}

ReplayPolicy parse_replay_attr(const std::string& obj, const std::string& s) {
  try {
    return ReplayPolicy::parse(s);
  } catch (const InputError&) {
    fail(obj, fmt::format("attribute 'replay' is '{}', not none, bounded, exact, full or an integer K >= 1", s));
  }
}

int64_t parse_layer_name(const std::string& group, const std::string& name, const Config& c) {
  int64_t l = -1;
  const auto [ptr, ec] = std::from_chars(name.data(), name.data() + name.size(), l);
  if (ec != std::errc() || ptr != name.data() + name.size() || l < 0 || l >= c.n_layers || name != std::to_string(l))
    fail(group + "/" + name, fmt::format("is not a layer number in [0, n_layers = {})", c.n_layers));
  return l;
}

std::string layer_path(const std::string& group, int64_t l) { return fmt::format("{}/{}", group, l); }

std::string flop_columns() {
  std::string s;
  for (int k = 0; k < kFlopKinds; ++k) s += fmt::format("{}{}", k ? "," : "", flop_kind_name(k));
  return s;
}

}  // namespace

void check_dtype(const std::string& obj, const std::string& dtype) {
  if (dtype != "f32" && dtype != "f64" && dtype != "bf16")
    fail(obj, fmt::format("dtype '{}' is not f32, f64 or bf16", dtype));
}

// ---- runs -----------------------------------------------------------------

void check_run(const std::string& path, const RunResult& r, const Config& c, int64_t n_tokens) {
  check_dtype(path, r.dtype);
  if (r.n_prompt < 1) fail(path, fmt::format("n_prompt {} is not >= 1", r.n_prompt));
  if (r.decode_steps < 0) fail(path, fmt::format("decode_steps {} is negative", r.decode_steps));
  const int64_t end = r.n_prompt + r.decode_steps;
  if (end > n_tokens)
    fail(path, fmt::format("needs n_prompt + decode_steps = {} tokens, but /inputs/tokens holds {}", end, n_tokens));
  if ((r.mode == Mode::Full) != (r.replay.kind == ReplayPolicy::Kind::None))
    fail(path, fmt::format("mode {} with replay '{}' (full mode, and only full mode, has replay none)",
                           mode_name(r.mode), r.replay.str()));
  if (r.mode != Mode::Resume && r.prefix_len != -1)
    fail(path, fmt::format("prefix_len {} in {} mode (-1 unless resume)", r.prefix_len, mode_name(r.mode)));
  if (r.mode == Mode::Resume && (r.prefix_len < 0 || r.prefix_len > r.n_prompt))
    fail(path, fmt::format("prefix_len {} is outside [0, n_prompt = {}]", r.prefix_len, r.n_prompt));
  check_positions(path + "/positions", r.positions, end, r.logits.rows(), "logits");
  check_cols(path + "/logits", r.logits.rows(), r.logits.cols(), c.vocab_size, "vocab_size");
  if (!r.flops.per_layer.empty() && static_cast<int64_t>(r.flops.per_layer.size()) != c.n_layers + 1)
    fail(path + "/flops_per_layer",
         fmt::format("has {} rows, n_layers + 1 = {} expected", r.flops.per_layer.size(), c.n_layers + 1));
  for (size_t i = 0; i < r.layers.size(); ++i) {
    const LayerCapture& cap = r.layers[i];
    if (cap.layer < 0 || cap.layer >= c.n_layers)
      fail(path + "/layers", fmt::format("layer {} is outside [0, n_layers = {})", cap.layer, c.n_layers));
    if (i > 0 && cap.layer <= r.layers[i - 1].layer)
      fail(path + "/layers", fmt::format("layers are not ascending at layer {}", cap.layer));
    check_capture(layer_path(path + "/layers", cap.layer), cap, c, end);
  }
  if (r.cache) check_cache(path + "/cache", *r.cache, c);
}

void write_run(hid_t file, const std::string& path, const RunResult& r, const Config& c, int64_t n_tokens) {
  check_run(path, r, c, n_tokens);
  create_group(file, path);
  write_string_attr(file, path, "backend", r.backend);
  write_string_attr(file, path, "dtype", r.dtype);
  write_string_attr(file, path, "mode", mode_name(r.mode));
  write_int_attr(file, path, "n_prompt", r.n_prompt);
  write_string_attr(file, path, "replay", r.replay.str());
  write_int_attr(file, path, "n_replay", r.n_replay);
  write_int_attr(file, path, "replay_start", r.replay_start);
  write_int_attr(file, path, "prefix_len", r.prefix_len);
  write_int_attr(file, path, "decode_steps", r.decode_steps);
  write_vector(file, path + "/positions", r.positions);  // [P]
  write_matrix(file, path + "/logits", r.logits, r.dtype);  // [P, V]
  if (!r.flops.per_layer.empty()) {
    write_int_attr(file, path, "flops", r.flops.total());
    static_assert(sizeof(r.flops.per_layer[0]) == kFlopKinds * sizeof(int64_t), "rows are contiguous");
    const std::string fp = path + "/flops_per_layer";  // [L + 1, kFlopKinds]; row L is the lm_head
    write_ints(file, fp, r.flops.per_layer.front().data(), {hsize_t(r.flops.per_layer.size()), hsize_t(kFlopKinds)});
    write_string_attr(file, fp, "columns", flop_columns());
  }
  if (!r.layers.empty()) {
    create_group(file, path + "/layers");
    for (const LayerCapture& cap : r.layers) {
      const std::string lp = layer_path(path + "/layers", cap.layer);
      create_group(file, lp);
      write_vector(file, lp + "/positions", cap.positions);  // [P_l]
      write_matrix(file, lp + "/out", cap.out, r.dtype);      // [P_l, d]
      if (cap.has_topk) write_int_matrix(file, lp + "/topk", cap.topk);  // [P_l, index_topk]
      if (cap.has_scores) {
        write_matrix(file, lp + "/topk_scores", cap.topk_scores, r.dtype);         // [P_l, index_topk]
        write_real_vector(file, lp + "/kth_score", cap.kth_score, r.dtype);        // [P_l]
        write_real_vector(file, lp + "/left_out_score", cap.left_out_score, r.dtype);  // [P_l]
      }
    }
  }
  if (r.cache) write_cache(file, path + "/cache", *r.cache, c);
}

RunResult read_run(hid_t file, const std::string& path, const Config& c, int64_t n_tokens, int64_t format_version) {
  if (!exists(file, path)) fail(path, "is missing");
  RunResult r;
  r.backend = read_string_attr(file, path, "backend");
  r.dtype = read_string_attr(file, path, "dtype");
  r.mode = parse_mode_attr(path, read_string_attr(file, path, "mode"));
  r.n_prompt = read_int_attr(file, path, "n_prompt");
  r.replay = parse_replay_attr(path, read_string_attr(file, path, "replay"));
  r.n_replay = read_int_attr(file, path, "n_replay");
  r.replay_start = read_int_attr(file, path, "replay_start");
  r.prefix_len = read_int_attr(file, path, "prefix_len");
  r.decode_steps = read_int_attr(file, path, "decode_steps");
  r.positions = read_vector(file, path + "/positions");
  r.logits = read_matrix(file, path + "/logits");
  const std::string fp = path + "/flops_per_layer";
  if (exists(file, fp)) {
    const MatI f = read_int_matrix(file, fp);
    if (f.rows() != c.n_layers + 1 || f.cols() != kFlopKinds)
      fail(fp, fmt::format("has shape [{}, {}], [n_layers + 1, {}] = [{}, {}] expected", f.rows(), f.cols(),
                           kFlopKinds, c.n_layers + 1, kFlopKinds));
    r.flops.resize(c.n_layers);
    for (Eigen::Index l = 0; l < f.rows(); ++l)
      for (int k = 0; k < kFlopKinds; ++k) r.flops.per_layer[size_t(l)][size_t(k)] = f(l, k);
  }
  if (exists(file, path + "/layers")) {
    for (const std::string& name : list(file, path + "/layers")) {
      LayerCapture cap;
      cap.layer = parse_layer_name(path + "/layers", name, c);
      const std::string lp = layer_path(path + "/layers", cap.layer);
      cap.positions = read_vector(file, lp + "/positions");
      cap.out = read_matrix(file, lp + "/out");
      cap.has_topk = exists(file, lp + "/topk");
      if (cap.has_topk) cap.topk = read_int_matrix(file, lp + "/topk");
      // version 2 (docs/spec.md §9.1): the three score datasets, all or none
      const int scored = format_version < 2 ? 0
                                            : int(exists(file, lp + "/topk_scores")) + int(exists(file, lp + "/kth_score")) +
                                                  int(exists(file, lp + "/left_out_score"));
      if (scored != 0 && scored != 3) fail(lp, "holds some of topk_scores, kth_score, left_out_score but not all three");
      cap.has_scores = scored == 3;
      if (cap.has_scores) {
        cap.topk_scores = read_matrix(file, lp + "/topk_scores");
        cap.kth_score = read_reals(file, lp + "/kth_score", 1).values;
        cap.left_out_score = read_reals(file, lp + "/left_out_score", 1).values;
      }
      r.layers.push_back(std::move(cap));
    }
    std::sort(r.layers.begin(), r.layers.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  }
  if (exists(file, path + "/cache")) r.cache = std::make_shared<PersistedCache>(read_cache(file, path + "/cache", c));
  check_run(path, r, c, n_tokens);
  return r;
}

// ---- persisted caches (docs/spec.md §6) -------------------------------------------

void check_cache(const std::string& path, const PersistedCache& cache, const Config& c) {
  check_dtype(path, cache.dtype);
  if (cache.prefix_len < 0) fail(path, fmt::format("prefix_len {} is negative", cache.prefix_len));
  const Plan plan = make_plan(c);
  std::vector<int64_t> layers;
  for (const SourceCache& s : cache.sources) layers.push_back(s.layer);
  if (layers != plan.kv_sources)
    fail(path, fmt::format("holds layers [{}], but the kv sources are [{}]", fmt::join(layers, ", "),
                           fmt::join(plan.kv_sources, ", ")));
  for (const SourceCache& s : cache.sources) {
    const std::string sp = layer_path(path, s.layer);
    if (s.ratio != plan[s.layer].ratio)
      fail(sp, fmt::format("ratio {}, but compress_ratios gives {}", s.ratio, plan[s.layer].ratio));
    if (s.n_tokens != cache.prefix_len)
      fail(sp, fmt::format("n_tokens {}, but the cache's prefix_len is {}", s.n_tokens, cache.prefix_len));
    check_cols(sp + "/entries", s.entries.rows(), s.entries.cols(), c.head_dim, "head_dim");
    check_cols(sp + "/index_keys", s.index_keys.rows(), s.index_keys.cols(), c.index_head_dim, "index_head_dim");
    if (s.index_keys.rows() != s.entries.rows())
      fail(sp + "/index_keys", fmt::format("has {} rows, but entries has {}", s.index_keys.rows(), s.entries.rows()));
    check_cols(sp + "/pending_c", s.pending_c.rows(), s.pending_c.cols(), c.head_dim, "head_dim");
    check_cols(sp + "/pending_z", s.pending_z.rows(), s.pending_z.cols(), c.head_dim, "head_dim");
    if (s.pending_z.rows() != s.pending_c.rows())
      fail(sp + "/pending_z", fmt::format("has {} rows, but pending_c has {}", s.pending_z.rows(), s.pending_c.rows()));
  }
}

void write_cache(hid_t file, const std::string& path, const PersistedCache& cache, const Config& c) {
  check_cache(path, cache, c);
  create_group(file, path);
  write_int_attr(file, path, "prefix_len", cache.prefix_len);
  write_string_attr(file, path, "dtype", cache.dtype);
  for (const SourceCache& s : cache.sources) {
    const std::string sp = layer_path(path, s.layer);
    create_group(file, sp);
    write_int_attr(file, sp, "ratio", s.ratio);
    write_int_attr(file, sp, "n_tokens", s.n_tokens);
    write_matrix(file, sp + "/entries", s.entries, cache.dtype);        // [n_entries, head_dim]
    write_matrix(file, sp + "/index_keys", s.index_keys, cache.dtype);  // [n_entries, index_head_dim]
    write_matrix(file, sp + "/pending_c", s.pending_c, cache.dtype);    // [n_pending, head_dim]
    write_matrix(file, sp + "/pending_z", s.pending_z, cache.dtype);    // [n_pending, head_dim]
  }
}

PersistedCache read_cache(hid_t file, const std::string& path, const Config& c) {
  PersistedCache cache;
  cache.prefix_len = read_int_attr(file, path, "prefix_len");
  cache.dtype = read_string_attr(file, path, "dtype");
  for (const std::string& name : list(file, path)) {
    SourceCache s;
    s.layer = parse_layer_name(path, name, c);
    const std::string sp = layer_path(path, s.layer);
    s.ratio = read_int_attr(file, sp, "ratio");
    s.n_tokens = read_int_attr(file, sp, "n_tokens");
    s.entries = read_matrix(file, sp + "/entries");
    s.index_keys = read_matrix(file, sp + "/index_keys");
    s.pending_c = read_matrix(file, sp + "/pending_c");
    s.pending_z = read_matrix(file, sp + "/pending_z");
    cache.sources.push_back(std::move(s));
  }
  std::sort(cache.sources.begin(), cache.sources.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  check_cache(path, cache, c);
  return cache;
}

}  // namespace ced::h5
