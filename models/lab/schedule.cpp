// docs/spec.md §4–§6 run schedule and persisted-cache check (schedule.hpp).
#include "models/lab/schedule.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "model/error.hpp"

namespace ced {

RunSchedule run_schedule(const Plan& plan, const RunRequest& req, int64_t n_replay) {
  RunSchedule s;
  const int64_t N = req.n_prompt;
  const int64_t B = req.mode == Mode::Full ? N : std::min(N, n_replay);
  if (req.mode == Mode::Resume) {
    const int64_t P = req.prefix_len;
    int64_t span = req.resume_replay < 0 ? plan.W : req.resume_replay;
    if (req.fault == Fault::ResumeReplayShort && req.resume_replay < 0) span = plan.W - 1;
    s.encoder_start = std::max<int64_t>(0, P - span);
    s.resume_start = P;
  }
  s.replay_start = req.mode == Mode::Full ? 0 : std::max(N - B, s.encoder_start);
  s.first_logit = req.logits == LogitsScope::Last ? N - 1 : s.replay_start;
  return s;
}

void check_cache(const Config& c, const Plan& plan, const PersistedCache& pc, int64_t P) {
  auto bad = [](const std::string& why) { throw InputError("cache: " + why); };
  if (pc.prefix_len != P) bad(fmt::format("holds a prefix of {} tokens, --prefix is {}", pc.prefix_len, P));
  if (pc.sources.size() != plan.kv_sources.size())
    bad(fmt::format("{} sources, the config has {} kv sources", pc.sources.size(), plan.kv_sources.size()));
  for (size_t i = 0; i < pc.sources.size(); ++i) {
    const SourceCache& sc = pc.sources[i];
    const int64_t l = plan.kv_sources[i], r = plan[l].ratio;
    const int64_t ne = P / r, np = r >= 2 ? P - ne * r : 0;  // complete entries, pending rows (docs/spec.md §3.3)
    if (sc.layer != l || sc.ratio != r || sc.n_tokens != P)
      bad(fmt::format("source {} is layer {} ratio {} over {} tokens; expected layer {} ratio {} over {}", i, sc.layer,
                      sc.ratio, sc.n_tokens, l, r, P));
    auto shape = [&](const MatD& m, int64_t rows, int64_t cols, const char* what) {
      if (m.rows() != rows || (rows > 0 && m.cols() != cols))
        bad(fmt::format("layer {} {}: [{}, {}], expected [{}, {}]", l, what, m.rows(), m.cols(), rows, cols));
    };
    shape(sc.entries, ne, c.head_dim, "entries");
    shape(sc.index_keys, ne, c.index_head_dim, "index_keys");
    shape(sc.pending_c, np, c.head_dim, "pending_c");
    shape(sc.pending_z, np, c.head_dim, "pending_z");
  }
}

RunResult result_for(const Backend& b, const RunRequest& req, const Plan& p) {
  RunResult res;
  res.backend = b.name();
  res.dtype = b.dtype();
  res.mode = req.mode;
  res.replay = req.replay;
  res.n_prompt = req.n_prompt;
  res.n_replay = req.replay.n_replay(p.W, p.exact_replay(), req.n_prompt);
  res.prefix_len = req.mode == Mode::Resume ? req.prefix_len : -1;
  res.decode_steps = req.decode_steps;
  res.flops.resize(p.L);
  return res;
}

void validate_request(const Config& c, const RunRequest& r) {
  validate_request_shape(r);
  validate_tokens(c, r.tokens);
}

}  // namespace ced
