// Planted differences; see plant.hpp.
#include "unit-tests/plant.hpp"

#include <fmt/format.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

#include "model/error.hpp"
#include "models/lab/weights.hpp"

namespace ced::plant {
namespace {

using MatI = Eigen::Matrix<int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

[[noreturn]] void misfit(const Plant& p, const std::string& why) {
  throw std::invalid_argument(fmt::format("plant {}: {}", p.describe(), why));
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void drop_scores(LayerCapture& c) {
  c.has_scores = false;
  c.topk_scores.resize(0, 0);
  c.kth_score.clear();
  c.left_out_score.clear();
}

template <class M>
M drop_row(const M& m, int64_t row) {
  M out(m.rows() - 1, m.cols());
  for (Eigen::Index i = 0, k = 0; i < m.rows(); ++i)
    if (i != row) out.row(k++) = m.row(i);
  return out;
}

template <class M>
M insert_row(const M& m, int64_t at, const M& row) {
  M out(m.rows() + 1, m.cols());
  for (Eigen::Index i = 0, k = 0; i < out.rows(); ++i) out.row(i) = i == at ? row.row(0) : m.row(k++);
  return out;
}

}  // namespace

const std::vector<Kind>& all_kinds() {
  static const std::vector<Kind> k = {
      Kind::Scaled,           Kind::NaN,          Kind::PosInf,          Kind::NegInf,
      Kind::NegZero,          Kind::RunRemoved,   Kind::RunAdded,        Kind::LayerRemoved,
      Kind::LayerAdded,       Kind::TopkRemoved,  Kind::PositionRemoved, Kind::PositionAdded,
      Kind::SelectionRowCleared, Kind::SelectionChanged, Kind::SelectionNearTie, Kind::PositionsDuplicated,
      Kind::PositionsPermuted,
      Kind::AttributeChanged, Kind::ConfigKeyChanged, Kind::WeightSeedChanged, Kind::TokenChanged};
  return k;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Scaled: return "scaled";
    case Kind::NaN: return "nan";
    case Kind::PosInf: return "+inf";
    case Kind::NegInf: return "-inf";
    case Kind::NegZero: return "-0";
    case Kind::RunRemoved: return "run-removed";
    case Kind::RunAdded: return "run-added";
    case Kind::LayerRemoved: return "layer-removed";
    case Kind::LayerAdded: return "layer-added";
    case Kind::TopkRemoved: return "topk-removed";
    case Kind::PositionRemoved: return "position-removed";
    case Kind::PositionAdded: return "position-added";
    case Kind::SelectionRowCleared: return "selection-row-cleared";
    case Kind::SelectionChanged: return "selection-changed";
    case Kind::SelectionNearTie: return "selection-near-tie";
    case Kind::PositionsDuplicated: return "positions-duplicated";
    case Kind::PositionsPermuted: return "positions-permuted";
    case Kind::AttributeChanged: return "attribute-changed";
    case Kind::ConfigKeyChanged: return "config-key-changed";
    case Kind::WeightSeedChanged: return "weight-seed-changed";
    case Kind::TokenChanged: return "token-changed";
  }
  return "?";
}

bool is_value_kind(Kind k) {
  return k == Kind::Scaled || k == Kind::NaN || k == Kind::PosInf || k == Kind::NegInf || k == Kind::NegZero;
}
bool is_malformed_kind(Kind k) { return k == Kind::PositionsDuplicated || k == Kind::PositionsPermuted; }

const std::vector<std::string>& attributes() {
  static const std::vector<std::string> a = {"backend",  "dtype",      "mode",         "n_prompt",   "replay",
                                             "n_replay", "replay_start", "prefix_len", "decode_steps"};
  return a;
}
bool attribute_judged(const std::string& attr) { return attr != "backend" && attr != "dtype"; }

std::vector<std::string> config_keys(const Config& c) {
  std::vector<std::string> out;
  for (const std::string& key : scalar_keys()) {
    Config changed = c;
    bool ok = false;
    for (const auto& k : config_int_keys())
      if (key == k.key) {
        for (int64_t delta : {1, -1}) {
          try {
            changed = with_override(c, fmt::format("{}={}", key, c.*k.member + delta));
            ok = true;
            break;
          } catch (const InputError&) {
          }
        }
      }
    for (const auto& k : config_real_keys())
      if (key == k.key) {
        try {
          changed = with_override(c, fmt::format("{}={:.17g}", key, c.*k.member * 1.5 + 0.25));
          ok = true;
        } catch (const InputError&) {
        }
      }
    if (key == "tie_decoder_kv") {
      try {
        changed = with_override(c, fmt::format("tie_decoder_kv={}", c.tie_decoder_kv ? "false" : "true"));
        ok = true;
      } catch (const InputError&) {
      }
    }
    // A changed key must keep the shapes of the base's tensors (d_model,
    // vocab, layers, index_topk, compressors), or the planted file is simply
    // invalid rather than different.
    if (ok && changed.d_model == c.d_model && changed.vocab_size == c.vocab_size && changed.n_layers == c.n_layers &&
        changed.index_topk == c.index_topk && changed.compress_ratios == c.compress_ratios)
      out.push_back(key);
  }
  return out;
}

std::string Plant::describe() const {
  return fmt::format("{} on the {} side, run {} layer {} row {} col {} rel {} {}", kind_name(kind),
                     on_reference ? "reference" : "test", run, layer, row, col, rel, attr);
}

RunFile make_base(uint64_t seed, int runs, double range) {
  const Config c = builtin_config("tiny");
  std::mt19937_64 rng(seed);
  std::mt19937_64 score_rng(seed ^ 0x5c0e5);  // apart, so the other values do not depend on the scores
  std::uniform_real_distribution<double> u(-range, range);
  RunFile f;
  f.generator = "plant::make_base";
  f.config = c;
  f.weight_seed = 1;
  f.token_seed = 2;
  const int64_t N = 9, decode = 2;
  f.tokens = make_tokens(f.token_seed, c.vocab_size, N + decode + 2);  // 2 spare tokens: n_prompt / decode plants
  // Values with ties: a quarter repeat the previous value; column 0 is +0.
  auto fill = [&](MatD& m) {
    for (Eigen::Index i = 0; i < m.size(); ++i)
      m.data()[i] = (i > 0 && rng() % 4 == 0) ? m.data()[i - 1] : u(rng);
    for (Eigen::Index i = 0; i < m.rows(); ++i) m(i, 0) = 0.0;
  };
  const char* modes[] = {"full", "ced", "resume"};
  for (int k = 0; k < runs; ++k) {
    RunResult r;
    r.backend = "reference-f64";
    r.dtype = "f64";
    r.mode = parse_mode(modes[k % 3]);
    r.n_prompt = N;
    r.decode_steps = r.mode == Mode::Full ? decode : 0;
    r.replay = ReplayPolicy::parse(r.mode == Mode::Full ? "none" : "bounded");
    r.n_replay = r.mode == Mode::Full ? -1 : c.window;
    r.replay_start = r.mode == Mode::Full ? 0 : N - c.window;
    r.prefix_len = r.mode == Mode::Resume ? 5 : -1;
    const int64_t end = N + r.decode_steps;
    for (int64_t p = 1; p < end; ++p) r.positions.push_back(p);
    r.logits.resize(int64_t(r.positions.size()), c.vocab_size);
    fill(r.logits);
    for (int64_t l = 0; l + 1 < c.n_layers; ++l) {
      LayerCapture cap;
      cap.layer = l;
      for (int64_t p = 1; p < end; ++p) cap.positions.push_back(p);
      cap.out.resize(int64_t(cap.positions.size()), c.d_model);
      fill(cap.out);
      cap.has_topk = c.compress_ratios[size_t(l)] > 0;
      if (cap.has_topk) {
        cap.topk = MatI::Constant(int64_t(cap.positions.size()), c.index_topk, -1);
        for (Eigen::Index i = 0; i < cap.topk.rows(); ++i) {
          // distinct entry ids in [0, 12), some rows shorter (-1 padded)
          const int64_t n = 1 + int64_t(rng() % uint64_t(c.index_topk));
          std::vector<int64_t> ids(12);
          for (size_t j = 0; j < ids.size(); ++j) ids[j] = int64_t(j);
          std::shuffle(ids.begin(), ids.end(), rng);
          for (int64_t j = 0; j < n; ++j) cap.topk(i, j) = ids[size_t(j)];
        }
        // scores in rank order (make_base's comment)
        const double nan = std::numeric_limits<double>::quiet_NaN();
        std::uniform_real_distribution<double> kth(-range, range), step(1, 2), margin(0.01, 0.5);
        cap.has_scores = true;
        cap.topk_scores = MatD::Constant(cap.topk.rows(), cap.topk.cols(), nan);
        for (Eigen::Index i = 0; i < cap.topk.rows(); ++i) {
          int64_t n = 0;
          while (n < cap.topk.cols() && cap.topk(i, n) >= 0) ++n;
          const double k = kth(score_rng), s = step(score_rng), m = margin(score_rng);
          for (int64_t x = 0; x < n; ++x) cap.topk_scores(i, x) = k + double(n - 1 - x) * s;
          cap.kth_score.push_back(k);
          cap.left_out_score.push_back(n == cap.topk.cols() ? k - m : nan);
        }
      }
      r.layers.push_back(std::move(cap));
    }
    f.runs.push_back({fmt::format("{}-{}", modes[k % 3], k), std::move(r)});
  }
  return f;
}

double boundary_margin(const RunFile& base, const Plant& p) {
  for (const auto& c : base.runs.at(size_t(p.run)).result.layers)
    if (c.layer == p.layer && c.has_scores) return c.kth_score.at(size_t(p.row)) - c.left_out_score.at(size_t(p.row));
  misfit(p, "no scored selection");
}

int64_t position_of(const RunFile& f, const Plant& p) {
  const RunResult& r = f.runs.at(size_t(p.run)).result;
  if (p.layer < 0) return r.positions.at(size_t(p.row));
  for (const auto& cap : r.layers)
    if (cap.layer == p.layer) return cap.positions.at(size_t(p.row));
  return -1;
}

RunFile apply(const RunFile& base, const Plant& p) {
  RunFile f = base;
  if (p.run < 0 || p.run >= int64_t(f.runs.size())) misfit(p, "no such run");
  RunResult& r = f.runs[size_t(p.run)].result;
  LayerCapture* cap = nullptr;
  if (p.layer >= 0) {
    for (auto& c : r.layers)
      if (c.layer == p.layer) cap = &c;
    if (!cap && p.kind != Kind::LayerAdded) misfit(p, "layer not captured");
  }
  MatD& m = cap ? cap->out : r.logits;
  std::vector<int64_t>& pos = cap ? cap->positions : r.positions;
  auto need_element = [&] {
    if (p.row < 0 || p.row >= m.rows() || p.col < 0 || p.col >= m.cols()) misfit(p, "no such element");
  };
  switch (p.kind) {
    case Kind::Scaled:
      need_element();
      m(p.row, p.col) *= 1.0 + p.rel;
      break;
    case Kind::NaN:
      need_element();
      m(p.row, p.col) = std::numeric_limits<double>::quiet_NaN();
      break;
    case Kind::PosInf:
      need_element();
      m(p.row, p.col) = std::numeric_limits<double>::infinity();
      break;
    case Kind::NegInf:
      need_element();
      m(p.row, p.col) = -std::numeric_limits<double>::infinity();
      break;
    case Kind::NegZero:
      need_element();
      if (m(p.row, p.col) != 0) misfit(p, "-0 replaces a zero only (column 0 of the base)");
      m(p.row, p.col) = -0.0;
      break;
    case Kind::RunRemoved:
      f.runs.erase(f.runs.begin() + p.run);
      break;
    case Kind::RunAdded: {
      NamedRun copy = f.runs[size_t(p.run)];
      copy.name += "-extra";
      f.runs.push_back(std::move(copy));
      break;
    }
    case Kind::LayerRemoved:
      r.layers.erase(r.layers.begin() + (cap - r.layers.data()));
      break;
    case Kind::LayerAdded: {
      if (cap) misfit(p, "layer already captured");
      if (r.layers.empty()) misfit(p, "no capture to copy");
      LayerCapture add = r.layers.front();
      add.layer = p.layer;
      add.has_topk = false;
      add.topk.resize(0, 0);
      drop_scores(add);
      r.layers.push_back(std::move(add));
      std::sort(r.layers.begin(), r.layers.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
      break;
    }
    case Kind::TopkRemoved:
      if (!cap || !cap->has_topk) misfit(p, "no selection");
      cap->has_topk = false;
      cap->topk.resize(0, 0);
      drop_scores(*cap);
      break;
    case Kind::PositionRemoved:
      if (p.row < 0 || p.row >= m.rows()) misfit(p, "no such row");
      m = drop_row(m, p.row);
      pos.erase(pos.begin() + p.row);
      if (cap && cap->has_topk) cap->topk = drop_row(cap->topk, p.row);
      if (cap && cap->has_scores) {
        cap->topk_scores = drop_row(cap->topk_scores, p.row);
        cap->kth_score.erase(cap->kth_score.begin() + p.row);
        cap->left_out_score.erase(cap->left_out_score.begin() + p.row);
      }
      break;
    case Kind::PositionAdded: {
      if (pos.empty() || pos.front() == 0) misfit(p, "position 0 is taken");
      MatD row = MatD::Constant(1, m.cols(), 0.5);
      m = insert_row(m, 0, row);
      pos.insert(pos.begin(), 0);
      if (cap && cap->has_topk) cap->topk = insert_row(cap->topk, 0, MatI::Constant(1, cap->topk.cols(), -1).eval());
      if (cap && cap->has_scores) {  // nothing visible at position 0: nothing selected, nothing left out
        cap->topk_scores = insert_row(cap->topk_scores, 0, MatD::Constant(1, cap->topk.cols(), kNaN).eval());
        cap->kth_score.insert(cap->kth_score.begin(), kNaN);
        cap->left_out_score.insert(cap->left_out_score.begin(), kNaN);
      }
      break;
    }
    case Kind::SelectionRowCleared:
      if (!cap || !cap->has_topk || p.row < 0 || p.row >= cap->topk.rows()) misfit(p, "no selection row");
      cap->topk.row(p.row).setConstant(-1);
      if (cap->has_scores) {  // everything left out: the best of it is the former top entry
        cap->left_out_score[size_t(p.row)] = cap->topk_scores(p.row, 0);
        cap->topk_scores.row(p.row).setConstant(kNaN);
        cap->kth_score[size_t(p.row)] = kNaN;
      }
      break;
    case Kind::SelectionChanged: {
      if (!cap || !cap->has_topk || p.row < 0 || p.row >= cap->topk.rows()) misfit(p, "no selection row");
      auto row = cap->topk.row(p.row);
      const int64_t j = p.col % row.size();
      int64_t id = 12 + p.col;  // base ids are < 12: never in the row
      row(j) = id;
      break;
    }
    case Kind::SelectionNearTie: {
      if (!cap || !cap->has_topk || !cap->has_scores || p.row < 0 || p.row >= cap->topk.rows())
        misfit(p, "no scored selection row");
      if (std::isnan(cap->left_out_score[size_t(p.row)])) misfit(p, "the row left nothing out");
      cap->topk(p.row, cap->topk.cols() - 1) = 20;  // base ids are < 12: never in the row
      break;
    }
    case Kind::PositionsDuplicated:
      if (pos.size() < 2) misfit(p, "fewer than two positions");
      pos[size_t(std::max<int64_t>(1, p.row % int64_t(pos.size())))] = pos[size_t(std::max<int64_t>(1, p.row % int64_t(pos.size()))) - 1];
      break;
    case Kind::PositionsPermuted: {
      if (pos.size() < 2) misfit(p, "fewer than two positions");
      const size_t i = size_t(std::max<int64_t>(1, p.row % int64_t(pos.size())));
      std::swap(pos[i], pos[i - 1]);
      break;
    }
    case Kind::AttributeChanged: {
      const std::string& a = p.attr;
      if (a == "backend") r.backend += "-x";
      else if (a == "dtype") r.dtype = r.dtype == "f64" ? "f32" : "f64";
      else if (a == "mode") {
        if (r.mode == Mode::Full) misfit(p, "full mode changes with its replay");
        r.mode = r.mode == Mode::Ced ? Mode::Resume : Mode::Ced;
        r.prefix_len = r.mode == Mode::Resume ? 5 : -1;
      } else if (a == "n_prompt") ++r.n_prompt;
      else if (a == "replay") {
        if (r.mode == Mode::Full) misfit(p, "full mode has replay none");
        r.replay = ReplayPolicy::parse("exact");
      } else if (a == "n_replay") ++r.n_replay;
      else if (a == "replay_start") ++r.replay_start;
      else if (a == "prefix_len") {
        if (r.mode != Mode::Resume) misfit(p, "prefix_len is -1 unless resume");
        --r.prefix_len;
      } else if (a == "decode_steps") ++r.decode_steps;
      else misfit(p, "unknown attribute");
      break;
    }
    case Kind::ConfigKeyChanged: {
      const Config& c = f.config;
      Config changed = c;
      bool done = false;
      for (const auto& k : config_int_keys())
        if (p.attr == k.key)
          for (int64_t delta : {1, -1}) {
            try {
              changed = with_override(c, fmt::format("{}={}", p.attr, c.*k.member + delta));
              done = true;
              break;
            } catch (const InputError&) {
            }
          }
      for (const auto& k : config_real_keys())
        if (p.attr == k.key) {
          changed = with_override(c, fmt::format("{}={:.17g}", p.attr, c.*k.member * 1.5 + 0.25));
          done = true;
        }
      if (p.attr == "tie_decoder_kv") {
        changed = with_override(c, fmt::format("tie_decoder_kv={}", c.tie_decoder_kv ? "false" : "true"));
        done = true;
      }
      if (!done) misfit(p, "key cannot change alone");
      f.config = changed;
      break;
    }
    case Kind::WeightSeedChanged:
      ++f.weight_seed;
      break;
    case Kind::TokenChanged:
      f.tokens[size_t(p.row % int64_t(f.tokens.size()))] =
          (f.tokens[size_t(p.row % int64_t(f.tokens.size()))] + 1) % int32_t(f.config.vocab_size);
      f.tokens_explicit = true;
      break;
  }
  return f;
}

void rewrite_int_dataset(const std::filesystem::path& file, const std::string& dataset, const std::vector<int64_t>& v) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("rewrite: cannot open " + file.string());
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  const herr_t e = d < 0 ? -1 : H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  if (d >= 0) H5Dclose(d);
  H5Fclose(f);
  if (e < 0) throw std::runtime_error("rewrite: cannot write " + dataset);
}

void rewrite_real_element(const std::filesystem::path& file, const std::string& dataset, int64_t row, int64_t col,
                          double value) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("rewrite: cannot open " + file.string());
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  hid_t s = H5Dget_space(d);
  hsize_t dims[2] = {0, 0};
  H5Sget_simple_extent_dims(s, dims, nullptr);
  std::vector<double> v(dims[0] * dims[1]);
  H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  v.at(size_t(row) * dims[1] + size_t(col)) = value;
  const herr_t e = H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(f);
  if (e < 0) throw std::runtime_error("rewrite: cannot write " + dataset);
}

void write_planted(const RunFile& base, const Plant& p, const std::filesystem::path& planted) {
  if (!is_malformed_kind(p.kind)) {
    write_run_file(planted, apply(base, p));
    return;
  }
  write_run_file(planted, base);
  const RunFile bad = apply(base, p);
  const RunResult& r = bad.runs[size_t(p.run)].result;
  std::string ds = fmt::format("/runs/{}/positions", bad.runs[size_t(p.run)].name);
  const std::vector<int64_t>* pos = &r.positions;
  if (p.layer >= 0) {
    ds = fmt::format("/runs/{}/layers/{}/positions", bad.runs[size_t(p.run)].name, p.layer);
    for (const auto& c : r.layers)
      if (c.layer == p.layer) pos = &c.positions;
  }
  rewrite_int_dataset(planted, ds, *pos);
}

}  // namespace ced::plant
