// docs/v41.md §13.5, §13.8: the span searches on the model (checks/v41/spans.hpp) take the cones with the
// floor probe on and judge bits with it off. A bitwise verdict taken with the probe on is a finiteness
// verdict: at the probe's K it holds by construction, so "bitwise at the probe" could never fail. On the
// clean model both give the same answer where the cone is whole, so the verdicts' probe state is watched
// directly: each search reports every replay it judged (its progress line) before it changes the probe,
// and at each report a replay that reads floored keys tells whether the probe is on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "models/v41/checkpoint.hpp"
#include "reference/v41/forward.hpp"
#include "checks/v41/spans.hpp"
#include "unit-tests/v41_test_model.hpp"

using namespace ced;
using namespace ced::v41;
using namespace ced::v41::testing;

namespace {

// Whether the model's floor probe is on: a sglang replay of 4 rows of a 24-token prompt on v41-tiny leaves
// out window keys its last position reads (its cone spans 46 rows), so its last logits are NaN with the
// probe on and finite with it off (asserted both ways by each test before it relies on it).
struct ProbeWatch {
  const V41Model& m;
  const V41EngramHashing& h;
  std::vector<int64_t> short_prompt = prompt(8, m.config().vocab_size, 5);
  bool on() const {
    const V41ForwardResult r = m.forward_ced(short_prompt, h, 1, v41_replay_convention("sglang"));
    return !std::all_of(r.logits.end() - m.config().vocab_size, r.logits.end(), [](double x) { return std::isfinite(x); });
  }
};

struct Report {
  std::string line;
  bool probe_on;
};

// Every progress line of a search with the probe state it was reported under.
std::function<void(const std::string&)> recorder(const ProbeWatch& w, std::vector<Report>& out) {
  return [&w, &out](const std::string& line) { out.push_back({line, w.on()}); };
}

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

}  // namespace

// The encoder replay after a hit (docs/v41.md §13.8): the probe's search runs with the probe on, the bitwise
// search and the bitwise verdict at the probe's K with it off. A short prompt (24 tokens, a hit at 8: every
// row before it rebuilt) keeps the search to a few resumes; what is watched is the probe, not the span.
TEST(V41SpanSearch, TheEncoderSpanJudgesBitsAtTheProbesKWithTheFloorProbeOff) {
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  const ProbeWatch watch{m, h};
  m.set_floor_probe(true);
  ASSERT_TRUE(watch.on());
  m.set_floor_probe(false);
  ASSERT_FALSE(watch.on());
  std::vector<Report> reports;
  const V41FoundEncoderSpan f =
      v41_empirical_encoder_span(m, prompt(24, m.config().vocab_size, 9), h, 8, recorder(watch, reports));
  int64_t at_probe = 0;
  for (const Report& r : reports) {
    if (has(r.line, "(probe)")) EXPECT_TRUE(r.probe_on) << r.line;
    if (has(r.line, "(bitwise")) EXPECT_FALSE(r.probe_on) << r.line << ": a bitwise verdict taken with the probe on";
    at_probe += has(r.line, "(bitwise at the probe's)");
  }
  EXPECT_EQ(at_probe, 1) << "the verdict at the probe's K was not reported";
  EXPECT_GT(f.probe, 0);
  EXPECT_TRUE(f.bitwise_at_probe);
  EXPECT_FALSE(watch.on()) << "the search left the probe on";
}

// The same of the replay spans' search (docs/v41.md §13.5): cones with the probe on, the last logits' bits
// with it off (a prompt of 24 tokens and the decode step's under sglang).
TEST(V41SpanSearch, TheReplaySpanSearchJudgesBitsWithTheFloorProbeOff) {
  V41Model m(tiny_checkpoint().config, tiny_checkpoint().weights, V41Regime::release);
  const V41EngramHashing h = v41_checkpoint_hashing(m.config());
  const ProbeWatch watch{m, h};
  m.set_floor_probe(true);
  ASSERT_TRUE(watch.on());
  m.set_floor_probe(false);
  std::vector<Report> reports;
  const V41FoundSpans f = v41_empirical_spans(m, prompt(25, m.config().vocab_size, 9), h,
                                              v41_replay_convention("sglang"), recorder(watch, reports));
  int64_t bitwise = 0;
  for (const Report& r : reports) {
    if (has(r.line, "(probe)")) EXPECT_TRUE(r.probe_on) << r.line;
    if (has(r.line, "(bitwise)")) {
      EXPECT_FALSE(r.probe_on) << r.line << ": a bitwise verdict taken with the probe on";
      ++bitwise;
    }
  }
  EXPECT_GT(bitwise, 0) << "no bitwise verdict was reported";
  EXPECT_TRUE(f.bitwise_at_probe);
  EXPECT_FALSE(watch.on()) << "the search left the probe on";
  // The prompt is every token but the last (the decode step's): 24 rows, all of which the last position's
  // cone (46 rows) needs, so both searches end at the whole prompt and not past it.
  EXPECT_EQ(f.last_probe, 24);
  EXPECT_EQ(f.last_bitwise, 24);
}
