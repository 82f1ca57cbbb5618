#include "model/run.hpp"

#include <fmt/format.h>

#include <charconv>

#include "model/error.hpp"

namespace ced {

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Full: return "full";
    case Mode::Ced: return "ced";
    case Mode::Resume: return "resume";
  }
  return "?";
}

Mode parse_mode(const std::string& s) {
  if (s == "full") return Mode::Full;
  if (s == "ced") return Mode::Ced;
  if (s == "resume") return Mode::Resume;
  throw InputError(fmt::format("--mode: '{}' is not one of full, ced, resume", s));
}

ReplayPolicy ReplayPolicy::parse(const std::string& s) {
  ReplayPolicy p;
  if (s == "none") p.kind = Kind::None;
  else if (s == "bounded") p.kind = Kind::Bounded;
  else if (s == "exact") p.kind = Kind::Exact;
  else if (s == "full") p.kind = Kind::Full;
  else {
    int64_t k = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), k);
    if (ec != std::errc() || ptr != s.data() + s.size() || k < 1)
      throw InputError(fmt::format("--replay: '{}' is not bounded, exact, full or an integer K >= 1", s));
    p.kind = Kind::Count;
    p.count = k;
  }
  return p;
}

std::string ReplayPolicy::str() const {
  switch (kind) {
    case Kind::None: return "none";
    case Kind::Bounded: return "bounded";
    case Kind::Exact: return "exact";
    case Kind::Full: return "full";
    case Kind::Count: return std::to_string(count);
  }
  return "?";
}

int64_t ReplayPolicy::n_replay(int64_t window, int64_t exact_span, int64_t n_prompt) const {
  switch (kind) {
    case Kind::None: return -1;
    case Kind::Bounded: return window;
    case Kind::Exact: return exact_span;
    case Kind::Full: return n_prompt;
    case Kind::Count: return count;
  }
  return -1;
}

namespace {
struct FaultName {
  Fault f;
  const char* name;
};
constexpr FaultName kFaults[] = {
    {Fault::None, "none"},
    {Fault::WindowOffByOne, "window-off-by-one"},
    {Fault::ReplayStartIgnored, "replay-start-ignored"},
    {Fault::ReuseOwnSelection, "reuse-own-selection"},
    {Fault::TieBreakReversed, "tie-break-reversed"},
    {Fault::SourceOnlyWrongLayer, "source-only-wrong-layer"},
    {Fault::SinkDropped, "sink-dropped"},
    {Fault::CompressorBlockShifted, "compressor-block-shifted"},
    {Fault::PoolPinDropped, "pool-pin-dropped"},
    {Fault::ResumeReplayShort, "resume-replay-short"},
    {Fault::RopeInverseSkipped, "rope-inverse-skipped"},
    {Fault::FfnOutputScaled, "ffn-output-scaled"},
    {Fault::ThreadDependentReduction, "thread-dependent-reduction"},
};
}  // namespace

const std::vector<Fault>& all_faults() {
  static const std::vector<Fault> v = [] {
    std::vector<Fault> out;
    for (const auto& f : kFaults)
      if (f.f != Fault::None) out.push_back(f.f);
    return out;
  }();
  return v;
}

const char* fault_name(Fault f) {
  for (const auto& e : kFaults)
    if (e.f == f) return e.name;
  return "?";
}

Fault parse_fault(const std::string& s) {
  for (const auto& e : kFaults)
    if (s == e.name) return e.f;
  std::string names;
  for (const auto& e : kFaults) names += std::string(names.empty() ? "" : ", ") + e.name;
  throw InputError(fmt::format("--fault: '{}' is not one of {}", s, names));
}

const char* flop_kind_name(int k) {
  static const char* names[kFlopKinds] = {"query",     "local_entry", "compressor", "index_keys",
                                          "indexer_qw", "index_scoring", "attention", "output",
                                          "router",    "experts",     "lm_head"};
  return (k >= 0 && k < kFlopKinds) ? names[k] : "?";
}

int64_t FlopCount::total() const {
  int64_t t = 0;
  for (const auto& row : per_layer)
    for (int64_t v : row) t += v;
  return t;
}
int64_t FlopCount::total_layer(int64_t l) const {
  int64_t t = 0;
  for (int64_t v : per_layer[size_t(l)]) t += v;
  return t;
}
int64_t FlopCount::total_kind(int k) const {
  int64_t t = 0;
  for (const auto& row : per_layer) t += row[size_t(k)];
  return t;
}

void validate_request_shape(const RunRequest& r) {
  if (r.n_prompt < 1) throw InputError(fmt::format("--tokens: N must be >= 1 (got {})", r.n_prompt));
  if (r.decode_steps < 0) throw InputError(fmt::format("--decode: must be >= 0 (got {})", r.decode_steps));
  if (static_cast<int64_t>(r.tokens.size()) < r.n_prompt + r.decode_steps)
    throw InputError(fmt::format("tokens: {} given, N + decode = {} needed", r.tokens.size(),
                                 r.n_prompt + r.decode_steps));
  if (r.mode == Mode::Full && r.replay.kind != ReplayPolicy::Kind::None)
    throw InputError("--replay: full mode takes no replay policy");
  if (r.mode != Mode::Full && r.replay.kind == ReplayPolicy::Kind::None)
    throw InputError(fmt::format("--replay: {} mode needs a replay policy", mode_name(r.mode)));
  if (r.mode == Mode::Resume) {
    if (r.prefix_len < 0 || r.prefix_len > r.n_prompt)
      throw InputError(fmt::format("--prefix: P must satisfy 0 <= P <= N = {} (got {})", r.n_prompt, r.prefix_len));
    if (r.resume_replay == 0 || r.resume_replay < -1)
      throw InputError(fmt::format("resume replay length must be >= 1 (got {})", r.resume_replay));
  } else if (r.prefix_len != -1) {
    throw InputError("--prefix: only resume mode takes a prefix");
  }
}

}  // namespace ced
