#pragma once
// Planted differences for the tests of the checks: a Backend wrapper that
// changes one thing in the results of the runs a plant selects, so that a
// check fed the plant must fail. A plant that is never applied (its run
// never happens) or cannot be applied (nothing there to change) is reported
// as such, never as a pass.
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "checks/harness.hpp"

namespace ced::prop {

enum class PlantKind {
  Logit,              // logits(row, 0): one ulp up (0 when not finite)
  LogitsRowFinite,    // logits rows from `row` to the last, their finiteness as a whole flipped (flip_finite)
  LayerOut,           // layers[layer].out(row, 0): one ulp up (0 when not finite)
  LayerOutRowFinite,  // as LogitsRowFinite, on layers[layer].out (rows from `row` to the last)
  Topk,               // layers[layer].topk(row, 0) + 1
  TopkFlagDropped,    // layers[layer].has_topk = false
  Position,           // positions[row] + 1 (the rows stay)
  LayerPosition,      // layers[layer].positions[row] + 1
  LayerDropped,       // the last captured layer removed
  Flops,              // flops.per_layer[layer][kind] + 2
  FlopsExtraRow,      // one more per-layer row, 2 FLOPs in it
  CacheMatrix,        // cache->sources[layer].{entries, index_keys, pending_c, pending_z}[kind] × (1 + 2^-10)
  CacheSourceDropped, // the last kv source removed from the cache
  CopyLogits,         // logits rows at shared positions copied from the last run `source` matched
  CopyLayerOut,       // layers[layer].out rows at shared positions copied from that run
};

// Which runs a plant changes: (label of the model, request) -> bool; the label
// is "m" for a check's own model, or what check_shared_kv names.
using RunMatch = std::function<bool(const std::string& label, const RunRequest& r)>;

struct Plant {
  std::string name;  // where, in words: "ced run, layer 4 out"
  RunMatch match;
  PlantKind kind = PlantKind::Logit;
  int64_t layer = 0;   // layer (negative: from the end), kv source index, or FLOP row
  int64_t row = -1;    // row (negative: from the end)
  int kind_index = 0;  // FLOP kind, or cache matrix 0..3
  int occurrence = -1; // >= 0: only the occurrence-th run the plant matches (0-based); -1: every one
  RunMatch source;     // Copy*: the run whose values are copied
};

struct PlantState {
  Plant plant;
  int matched = 0, applied = 0;
  std::shared_ptr<RunResult> copy;  // last run `source` matched
};

// Thrown when a plant finds nothing to change: a failure of the test, never a catch.
struct PlantNotApplicable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace plant_detail {

inline int64_t from_end(int64_t i, int64_t n) { return i < 0 ? n + i : i; }
[[noreturn]] inline void not_applicable(const Plant& p, const std::string& why) {
  throw PlantNotApplicable("plant '" + p.name + "' cannot be applied: " + why);
}
inline double ulp_up(double v) { return std::isfinite(v) ? std::nextafter(v, std::numeric_limits<double>::infinity()) : 0.0; }
// The finiteness of rows first..last, as a whole, flipped: all finite -> the
// last gets a NaN; otherwise every non-finite row becomes 0.
inline void flip_finite(const Plant& p, MatD& m, int64_t first) {
  if (first < 0 || first >= m.rows() || m.cols() == 0) not_applicable(p, "no such row");
  if (m.bottomRows(m.rows() - first).allFinite()) {
    m(m.rows() - 1, 0) = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  for (int64_t row = first; row < m.rows(); ++row)
    if (!m.row(row).allFinite()) m.row(row).setZero();
}
inline LayerCapture& layer(const Plant& p, RunResult& r) {
  const int64_t l = from_end(p.layer, int64_t(r.layers.size()));
  if (l < 0 || l >= int64_t(r.layers.size())) not_applicable(p, "the run captured no such layer");
  return r.layers[size_t(l)];
}
inline void copy_rows(const Plant& p, MatD& dst, const std::vector<int64_t>& pd, const MatD& src,
                      const std::vector<int64_t>& ps) {
  int64_t copied = 0;
  for (size_t i = 0; i < pd.size(); ++i)
    for (size_t j = 0; j < ps.size(); ++j)
      if (pd[i] == ps[j] && dst.cols() == src.cols()) {
        dst.row(int64_t(i)) = src.row(int64_t(j));
        ++copied;
      }
  if (!copied) not_applicable(p, "no shared position to copy");
}

inline void apply(const PlantState& st, RunResult& r) {
  const Plant& p = st.plant;
  switch (p.kind) {
    case PlantKind::Logit: {
      const int64_t i = from_end(p.row, r.logits.rows());
      if (i < 0 || i >= r.logits.rows() || r.logits.cols() == 0) not_applicable(p, "no such logits row");
      r.logits(i, 0) = ulp_up(r.logits(i, 0));
      break;
    }
    case PlantKind::LogitsRowFinite: flip_finite(p, r.logits, from_end(p.row, r.logits.rows())); break;
    case PlantKind::LayerOut: {
      auto& c = layer(p, r);
      const int64_t i = from_end(p.row, c.out.rows());
      if (i < 0 || i >= c.out.rows() || c.out.cols() == 0) not_applicable(p, "no such layer row");
      c.out(i, 0) = ulp_up(c.out(i, 0));
      break;
    }
    case PlantKind::LayerOutRowFinite: {
      auto& c = layer(p, r);
      flip_finite(p, c.out, from_end(p.row, c.out.rows()));
      break;
    }
    case PlantKind::Topk: {
      auto& c = layer(p, r);
      const int64_t i = from_end(p.row, c.topk.rows());
      if (!c.has_topk || i < 0 || i >= c.topk.rows() || c.topk.cols() == 0) not_applicable(p, "no such selection row");
      c.topk(i, 0) += 1;
      break;
    }
    case PlantKind::TopkFlagDropped: {
      auto& c = layer(p, r);
      if (!c.has_topk) not_applicable(p, "the layer has no selection");
      c.has_topk = false;
      break;
    }
    case PlantKind::Position: {
      const int64_t i = from_end(p.row, int64_t(r.positions.size()));
      if (i < 0 || i >= int64_t(r.positions.size())) not_applicable(p, "no such position");
      r.positions[size_t(i)] += 1;
      break;
    }
    case PlantKind::LayerPosition: {
      auto& c = layer(p, r);
      const int64_t i = from_end(p.row, int64_t(c.positions.size()));
      if (i < 0 || i >= int64_t(c.positions.size())) not_applicable(p, "no such layer position");
      c.positions[size_t(i)] += 1;
      break;
    }
    case PlantKind::LayerDropped:
      if (r.layers.empty()) not_applicable(p, "no captured layer");
      r.layers.pop_back();
      break;
    case PlantKind::Flops: {
      const int64_t l = from_end(p.layer, int64_t(r.flops.per_layer.size()));
      if (l < 0 || l >= int64_t(r.flops.per_layer.size())) not_applicable(p, "no such FLOP row");
      r.flops.per_layer[size_t(l)][size_t(p.kind_index)] += 2;
      break;
    }
    case PlantKind::FlopsExtraRow: {
      std::array<int64_t, kFlopKinds> extra{};
      extra[0] = 2;
      r.flops.per_layer.push_back(extra);
      break;
    }
    case PlantKind::CacheMatrix: {
      if (!r.cache) not_applicable(p, "the run returned no cache");
      const int64_t s = from_end(p.layer, int64_t(r.cache->sources.size()));
      if (s < 0 || s >= int64_t(r.cache->sources.size())) not_applicable(p, "no such kv source");
      auto& src = r.cache->sources[size_t(s)];
      MatD* m[] = {&src.entries, &src.index_keys, &src.pending_c, &src.pending_z};
      MatD& x = *m[p.kind_index];
      if (x.size() == 0) not_applicable(p, "the cache matrix is empty");
      x *= 1.0 + 1.0 / 1024;
      break;
    }
    case PlantKind::CacheSourceDropped:
      if (!r.cache || r.cache->sources.empty()) not_applicable(p, "no kv source in the cache");
      r.cache->sources.pop_back();
      break;
    case PlantKind::CopyLogits:
      if (!st.copy) not_applicable(p, "the source run has not run yet");
      copy_rows(p, r.logits, r.positions, st.copy->logits, st.copy->positions);
      break;
    case PlantKind::CopyLayerOut: {
      if (!st.copy) not_applicable(p, "the source run has not run yet");
      auto& c = layer(p, r);
      const int64_t l = from_end(p.layer, int64_t(st.copy->layers.size()));
      if (l < 0 || l >= int64_t(st.copy->layers.size())) not_applicable(p, "the source run has no such layer");
      copy_rows(p, c.out, c.positions, st.copy->layers[size_t(l)].out, st.copy->layers[size_t(l)].positions);
      break;
    }
  }
}

}  // namespace plant_detail

// The wrapper: runs the real backend, then plants into the matched results.
class PlantingBackend final : public Backend {
 public:
  PlantingBackend(std::unique_ptr<Backend> inner, std::string label, std::shared_ptr<PlantState> st)
      : inner_(std::move(inner)), label_(std::move(label)), st_(std::move(st)) {}
  std::string name() const override { return inner_->name(); }
  std::string dtype() const override { return inner_->dtype(); }
  RunResult run(const RunRequest& req) override {
    RunResult r = inner_->run(req);
    // A cache is shared by pointer: plant into a copy, never into the backend's.
    if (r.cache) r.cache = std::make_shared<PersistedCache>(*r.cache);
    const Plant& p = st_->plant;
    if (p.source && p.source(label_, req)) st_->copy = std::make_shared<RunResult>(r);
    if (p.match && p.match(label_, req)) {
      const int k = st_->matched++;
      if (p.occurrence < 0 || p.occurrence == k) {
        plant_detail::apply(*st_, r);
        ++st_->applied;
      }
    }
    return r;
  }

 private:
  std::unique_ptr<Backend> inner_;
  std::string label_;
  std::shared_ptr<PlantState> st_;
};

inline BackendDecorator planting(const std::shared_ptr<PlantState>& st) {
  return [st](std::unique_ptr<Backend> be, const std::string& label) -> std::unique_ptr<Backend> {
    return std::make_unique<PlantingBackend>(std::move(be), label, st);
  };
}

}  // namespace ced::prop
