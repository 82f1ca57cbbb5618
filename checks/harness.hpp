#pragma once
// Runs of the reference model for the property suite.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "model/run.hpp"
#include "models/lab/weights.hpp"
#include "reference/lab/backend.hpp"

namespace ced::prop {

constexpr uint64_t kWeightSeed = 20261129;
constexpr uint64_t kTokenSeed = 7;

// Replaces a backend by a wrapper of it (label: which model of a check it
// serves); the tests of the checks plant differences this way.
using BackendDecorator = std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>, const std::string& label)>;

struct Model {
  Config c;
  Plan p;
  std::unique_ptr<Backend> be;
  Fault fault = Fault::None;  // injected into every request (negative controls)
  explicit Model(const Config& cfg, bool f64 = true, Fault f = Fault::None, uint64_t seed = kWeightSeed)
      : c(cfg), p(make_plan(cfg)), be(make_reference_backend(cfg, seed, f64)), fault(f) {}

  RunRequest request(Mode mode, int64_t N, const std::string& replay = "none", int64_t decode = 0) const {
    RunRequest r;
    r.mode = mode;
    r.n_prompt = N;
    r.replay = ReplayPolicy::parse(mode == Mode::Full ? "none" : replay);
    r.decode_steps = decode;
    r.tokens = make_tokens(kTokenSeed, c.vocab_size, N + decode);
    r.fault = fault;
    return r;
  }
  RunResult run(const RunRequest& r) const { return be->run(r); }
  RunResult full(int64_t N, int64_t decode = 0, bool capture = false) const {
    auto r = request(Mode::Full, N, "none", decode);
    r.capture_layers = capture;
    return run(r);
  }
  RunResult ced(int64_t N, const std::string& replay, int64_t decode = 0, bool capture = false,
                bool poison = false) const {
    auto r = request(Mode::Ced, N, replay, decode);
    r.capture_layers = capture;
    r.poison_truncated = poison;
    return run(r);
  }
};

// Rows of `a` at the given positions equal (bitwise) the rows of `b` there.
inline bool rows_equal(const MatD& a, const std::vector<int64_t>& pa, const MatD& b, const std::vector<int64_t>& pb,
                       int64_t pos) {
  const auto ia = std::find(pa.begin(), pa.end(), pos) - pa.begin();
  const auto ib = std::find(pb.begin(), pb.end(), pos) - pb.begin();
  if (ia == int64_t(pa.size()) || ib == int64_t(pb.size())) return false;
  for (int64_t j = 0; j < a.cols(); ++j)
    if (!(a(ia, j) == b(ib, j)) || std::signbit(a(ia, j)) != std::signbit(b(ib, j))) return false;
  return true;
}

inline bool row_finite(const MatD& a, const std::vector<int64_t>& pa, int64_t pos) {
  const auto ia = std::find(pa.begin(), pa.end(), pos) - pa.begin();
  return a.row(ia).allFinite();
}

// Bitwise equality of two matrices, NaN == NaN with the same bits.
inline bool bits_equal(const MatD& a, const MatD& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  // An empty matrix's data() is null, which memcmp must not get even for 0 bytes.
  return a.size() == 0 || std::memcmp(a.data(), b.data(), sizeof(double) * size_t(a.size())) == 0;
}

}  // namespace ced::prop
