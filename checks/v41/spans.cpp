// docs/v41.md §13.5: the spans found on the model. See spans.hpp.
#include "checks/v41/spans.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "model/bisect.hpp"
#include "model/error.hpp"

namespace ced::v41 {
namespace {

bool finite(std::span<const double> v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

std::span<const double> last_row(const V41ForwardResult& r, int64_t V) {
  return std::span<const double>(r.logits).last(static_cast<size_t>(V));
}

// Restores the model's floor probe however the search leaves.
struct ProbeOff {
  V41Model& m;
  ~ProbeOff() { m.set_floor_probe(false); }
};

}  // namespace

V41FoundSpans v41_empirical_spans(V41Model& m, std::span<const int64_t> tokens, const V41EngramHashing& hashing,
                                  const V41ReplayConvention& convention,
                                  const std::function<void(const std::string&)>& progress) {
  if (tokens.size() < 2) throw InputError("v41 spans: the search needs a prompt and a decode token");
  const std::span<const int64_t> prompt = tokens.first(tokens.size() - 1);
  const int64_t N = static_cast<int64_t>(prompt.size()), V = m.config().vocab_size;
  const int64_t step_token = tokens.back();
  V41FoundSpans found;
  auto say = [&](const char* what, int64_t K, bool ok) {
    if (progress) progress(fmt::format("{} {}: K = {}: {}", convention.name, what, K, ok ? "exact" : "inexact"));
  };
  ProbeOff restore{m};
  // The layers below the cut are the same for every K: computed once per search kind (the probe's
  // NaN keys never reach them, but its encoding keeps the decode buffers).
  m.set_floor_probe(true);
  const V41CedEncoding probed_enc = m.ced_encoding(prompt, hashing, convention, true);
  std::map<int64_t, std::pair<bool, bool>> probed;  // K -> (last logits finite, the step's finite)
  auto probe = [&](int64_t K) {
    auto it = probed.find(K);
    if (it == probed.end()) {
      V41DecodeState state;
      const V41ForwardResult r = m.forward_ced(probed_enc, K, convention, &state);
      const V41ForwardResult step = m.decode_step(step_token, hashing, state);
      ++found.runs;
      it = probed.emplace(K, std::pair{finite(last_row(r, V)), finite(step.logits)}).first;
    }
    return it->second;
  };
  found.last_probe = fewest_true(N, [&](int64_t K) {
    const bool ok = probe(K).first;
    say("last logits (probe)", K, ok);
    return ok;
  });
  found.decode_probe = fewest_true(N, [&](int64_t K) {
    const bool ok = probe(K).second;
    say("next decode step (probe)", K, ok);
    return ok;
  });
  m.set_floor_probe(false);
  const V41CedEncoding enc = m.ced_encoding(prompt, hashing, convention, false);
  const V41ForwardResult full = m.forward_ced(enc, N, convention);
  const std::span<const double> want = last_row(full, V);
  auto bitwise = [&](int64_t K) {
    const V41ForwardResult r = m.forward_ced(enc, K, convention);
    ++found.runs;
    const std::span<const double> got = last_row(r, V);
    return std::equal(got.begin(), got.end(), want.begin());
  };
  found.last_bitwise = fewest_true(N, [&](int64_t K) {
    const bool ok = bitwise(K);
    say("last logits (bitwise)", K, ok);
    return ok;
  });
  found.bitwise_at_probe = found.last_probe > 0 && bitwise(found.last_probe);
  return found;
}

V41FoundEncoderSpan v41_empirical_encoder_span(V41Model& m, std::span<const int64_t> prompt,
                                               const V41EngramHashing& hashing, int64_t H,
                                               const std::function<void(const std::string&)>& progress) {
  const int64_t N = static_cast<int64_t>(prompt.size()), V = m.config().vocab_size;
  if (H < 1 || H >= N) throw InputError(fmt::format("v41 spans: the hit {} must be in [1, N = {})", H, N));
  // TensorRT-LLM's rule: every hit adopted as it is, the window rebuilt from H - K.
  const V41EncoderReplayRule& rule = v41_encoder_replay_rule("trtllm");
  V41DecodeState cold_state;
  const V41ForwardResult cold = m.forward(prompt, hashing, &cold_state);
  const V41PrefixHit hit = m.prefix_hit(cold_state, H);
  const std::span<const double> want = last_row(cold, V);
  V41FoundEncoderSpan found;
  ProbeOff restore{m};
  auto resumed = [&](int64_t K, bool probe, const char* what) {
    m.set_floor_probe(probe);
    const V41ForwardResult r = m.forward_resume(prompt, hashing, hit, rule, K, N, nullptr);
    ++found.runs;
    const std::span<const double> got = last_row(r, V);
    const bool ok = probe ? finite(got) : std::equal(got.begin(), got.end(), want.begin());
    if (progress) progress(fmt::format("encoder replay at H = {} {}: K = {}: {}", H, what, K, ok ? "exact" : "inexact"));
    return ok;
  };
  found.probe = fewest_true(H, [&](int64_t K) { return resumed(K, true, "(probe)"); });
  found.bitwise = fewest_true(H, [&](int64_t K) { return resumed(K, false, "(bitwise)"); });
  found.bitwise_at_probe = found.probe > 0 && resumed(found.probe, false, "(bitwise at the probe's)");
  return found;
}

}  // namespace ced::v41
