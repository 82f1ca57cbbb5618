// reference/lab/replays.hpp: the backend-independent part of a replay session.
#include "reference/lab/replays.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "reference/lab/backend.hpp"

namespace ced {
namespace {

// Any backend: one run per request.
class RunEach final : public ReplaySession {
 public:
  RunEach(Backend& be, const RunRequest& base) : be_(be), base_(base) {}
  RunResult run(const RunRequest& r) override {
    require_same_prefill(base_, r);
    return be_.run(r);
  }

 private:
  Backend& be_;
  RunRequest base_;
};

}  // namespace

void require_same_prefill(const RunRequest& base, const RunRequest& r) {
  auto differs = [](const char* what) {
    throw std::logic_error(std::string("replay session: the request's ") + what + " differs from the opening request's");
  };
  // Every field of RunRequest except replay, decode_steps, poison_truncated
  // and logits, which a session's runs may vary.
  if (r.mode != base.mode) differs("mode");
  if (r.n_prompt != base.n_prompt) differs("n_prompt");
  if (r.prefix_len != base.prefix_len) differs("prefix_len");
  if (r.resume_replay != base.resume_replay) differs("resume_replay");
  const auto N = size_t(std::max<int64_t>(0, base.n_prompt));
  if (r.tokens.size() < N || base.tokens.size() < N || !std::equal(base.tokens.begin(), base.tokens.begin() + long(N), r.tokens.begin()))
    differs("prompt tokens");
  if (r.capture_layers != base.capture_layers) differs("capture_layers");
  if (r.fault != base.fault) differs("fault");
  if (r.fault_layer != base.fault_layer) differs("fault_layer");
  if (r.cache_in != base.cache_in) differs("cache_in");
  if (r.want_cache != base.want_cache) differs("want_cache");
}

std::unique_ptr<ReplaySession> open_replays(Backend& be, const RunRequest& base) {
  if (auto s = open_reference_replays(be, base)) return s;
  return std::make_unique<RunEach>(be, base);
}

void run_replays(Backend& be, const RunRequest& req, const std::vector<ReplayPolicy>& replays,
                 const std::function<void(RunResult&&)>& each) {
  if (replays.empty()) return;  // nothing to share
  const auto session = open_replays(be, req);
  for (const ReplayPolicy& rp : replays) {
    RunRequest r = req;
    r.replay = rp;
    each(session->run(r));
  }
}

}  // namespace ced
