// The run request's grammars and validation (docs/spec.md §10): modes, replay policies and faults parse
// exactly their names (an unknown one is an InputError that lists every valid name), and
// validate_request refuses each inconsistent request with the rule it breaks. Written for the
// mutation pass (docs/mutation.md).
#include <gtest/gtest.h>

#include <string>

#include "models/lab/config.hpp"
#include "model/error.hpp"
#include "models/lab/plan.hpp"
#include "model/run.hpp"
#include "models/lab/schedule.hpp"
#include "models/lab/weights.hpp"

using namespace ced;

namespace {

// The message of the InputError `f` throws, or "" when it throws none.
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

RunRequest request(Mode mode, const char* replay, int64_t n, int64_t prefix = -1, int64_t decode = 0) {
  RunRequest r;
  r.mode = mode;
  r.replay = ReplayPolicy::parse(replay);
  r.n_prompt = n;
  r.prefix_len = prefix;
  r.decode_steps = decode;
  r.tokens = make_tokens(0, load_config("tiny").vocab_size, n + std::max<int64_t>(decode, 0));
  return r;
}

}  // namespace

TEST(RunRequest, ModesParseByNameOnly) {
  EXPECT_EQ(parse_mode("full"), Mode::Full);
  EXPECT_EQ(parse_mode("ced"), Mode::Ced);
  EXPECT_EQ(parse_mode("resume"), Mode::Resume);
  EXPECT_NE(input_error([] { parse_mode("Full"); }).find("not one of full, ced, resume"), std::string::npos);
}

TEST(RunRequest, ReplayPoliciesParseTheirNamesAndPositiveCounts) {
  EXPECT_EQ(ReplayPolicy::parse("none").kind, ReplayPolicy::Kind::None);
  EXPECT_EQ(ReplayPolicy::parse("bounded").kind, ReplayPolicy::Kind::Bounded);
  EXPECT_EQ(ReplayPolicy::parse("exact").kind, ReplayPolicy::Kind::Exact);
  EXPECT_EQ(ReplayPolicy::parse("full").kind, ReplayPolicy::Kind::Full);
  const ReplayPolicy k = ReplayPolicy::parse("7");
  EXPECT_EQ(k.kind, ReplayPolicy::Kind::Count);
  EXPECT_EQ(k.count, 7);
  for (const char* bad : {"0", "-3", "7x", "", "Bounded"})
    EXPECT_NE(input_error([&] { ReplayPolicy::parse(bad); }).find("--replay"), std::string::npos) << bad;
}

TEST(RunRequest, ReplayLengthsFollowThePolicy) {
  const Plan p = make_plan(load_config("tiny"));
  EXPECT_EQ(ReplayPolicy::parse("none").n_replay(p.W, p.exact_replay(), 50), -1);
  EXPECT_EQ(ReplayPolicy::parse("bounded").n_replay(p.W, p.exact_replay(), 50), p.W);
  EXPECT_EQ(ReplayPolicy::parse("exact").n_replay(p.W, p.exact_replay(), 50), 1 + p.D * (p.W - 1));
  EXPECT_EQ(ReplayPolicy::parse("full").n_replay(p.W, p.exact_replay(), 50), 50);
  EXPECT_EQ(ReplayPolicy::parse("9").n_replay(p.W, p.exact_replay(), 50), 9);
}

TEST(RunRequest, EveryFaultParsesAndAnUnknownOneListsThemAll) {
  EXPECT_EQ(parse_fault("none"), Fault::None);
  for (Fault f : all_faults()) EXPECT_EQ(parse_fault(fault_name(f)), f) << fault_name(f);
  const std::string msg = input_error([] { parse_fault("bogus"); });
  EXPECT_NE(msg.find("--fault: 'bogus' is not one of none, "), std::string::npos) << msg;
  for (Fault f : all_faults()) EXPECT_NE(msg.find(fault_name(f)), std::string::npos) << fault_name(f) << ": " << msg;
}

TEST(RunRequest, ValidRequestsOfEveryModePass) {
  const Config c = load_config("tiny");
  EXPECT_EQ(input_error([&] { validate_request(c, request(Mode::Full, "none", 6)); }), "");
  EXPECT_EQ(input_error([&] { validate_request(c, request(Mode::Ced, "bounded", 6, -1, 2)); }), "");
  EXPECT_EQ(input_error([&] { validate_request(c, request(Mode::Resume, "bounded", 6, 0)); }), "");
  EXPECT_EQ(input_error([&] { validate_request(c, request(Mode::Resume, "bounded", 6, 6)); }), "");
}

TEST(RunRequest, EachInconsistentRequestIsRefusedWithItsRule) {
  const Config c = load_config("tiny");
  auto refused = [&](RunRequest r, const std::string& rule) {
    const std::string msg = input_error([&] { validate_request(c, r); });
    EXPECT_NE(msg.find(rule), std::string::npos) << "want '" << rule << "', got '" << msg << "'";
  };
  refused(request(Mode::Full, "none", 0), "--tokens: N must be >= 1");
  RunRequest neg = request(Mode::Full, "none", 6);
  neg.decode_steps = -1;
  refused(neg, "--decode: must be >= 0");
  RunRequest few = request(Mode::Full, "none", 6, -1, 2);
  few.tokens.pop_back();
  refused(few, "tokens: 7 given, N + decode = 8 needed");
  refused(request(Mode::Full, "bounded", 6), "--replay: full mode takes no replay policy");
  refused(request(Mode::Ced, "none", 6), "--replay: ced mode needs a replay policy");
  refused(request(Mode::Resume, "none", 6, 2), "--replay: resume mode needs a replay policy");
  refused(request(Mode::Resume, "bounded", 6, 7), "--prefix: P must satisfy 0 <= P <= N = 6 (got 7)");
  refused(request(Mode::Resume, "bounded", 6, -2), "--prefix: P must satisfy 0 <= P <= N = 6 (got -2)");
  RunRequest rr = request(Mode::Resume, "bounded", 6, 3);
  rr.resume_replay = 0;
  refused(rr, "resume replay length must be >= 1");
  rr.resume_replay = -2;
  refused(rr, "resume replay length must be >= 1");
  refused(request(Mode::Ced, "bounded", 6, 3), "--prefix: only resume mode takes a prefix");
  RunRequest tok = request(Mode::Full, "none", 6);
  tok.tokens[2] = int32_t(c.vocab_size);
  EXPECT_NE(input_error([&] { validate_request(c, tok); }), "");
}

namespace {
// A cache of `c` after a prefix of P, zeros of the right shapes.
ced::PersistedCache zero_cache(const Config& c, int64_t P) {
  ced::PersistedCache cache;
  cache.prefix_len = P;
  cache.dtype = "f64";
  for (const int64_t l : c.kv_source_layers) {
    ced::SourceCache sc;
    sc.layer = l;
    sc.ratio = c.compress_ratios[size_t(l)];
    sc.n_tokens = P;
    const int64_t ne = P / sc.ratio, np = sc.ratio >= 2 ? P % sc.ratio : 0;
    sc.entries = ced::MatD::Zero(ne, c.head_dim);
    sc.index_keys = ced::MatD::Zero(ne, c.index_head_dim);
    sc.pending_c = ced::MatD::Zero(np, c.head_dim);
    sc.pending_z = ced::MatD::Zero(np, c.head_dim);
    cache.sources.push_back(sc);
  }
  return cache;
}
}  // namespace

// check_cache (models/lab/schedule.hpp): a cache of the wrong shape is refused,
// naming the layer, the matrix, its shape and the shape it must have.
TEST(CacheCheck, WrongShapeIsNamedWithTheShapeItMustHave) {
  const Config c = builtin_config("tiny");
  const Plan p = make_plan(c);
  const int64_t P = 6;
  ced::PersistedCache cache = zero_cache(c, P);
  EXPECT_NO_THROW(ced::check_cache(c, p, cache, P));
  // tiny: layer 1 has r = 2, so a prefix of 6 holds 3 entries of head_dim 16
  cache.sources[0].entries = ced::MatD::Zero(2, c.head_dim);
  try {
    ced::check_cache(c, p, cache, P);
    ADD_FAILURE() << "a cache with 2 entries where 3 belong was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 entries: [2, 16], expected [3, 16]"), std::string::npos) << e.what();
  }
}

// What a backend checks of a RunRequest's cache_in (the library's path, beside
// `ced run --cache-in`'s own check): a cache of another prefix length, shorter
// or longer, is refused as such, before its shapes are looked at.
TEST(CacheCheck, PrefixOfAnotherLengthIsRefusedNamingBothLengths) {
  const Config c = builtin_config("tiny");
  const Plan p = make_plan(c);
  const ced::PersistedCache cache = zero_cache(c, 6);
  EXPECT_EQ(input_error([&] { ced::check_cache(c, p, cache, 6); }), "");
  EXPECT_EQ(input_error([&] { ced::check_cache(c, p, cache, 7); }), "cache: holds a prefix of 6 tokens, --prefix is 7");
  EXPECT_EQ(input_error([&] { ced::check_cache(c, p, cache, 5); }), "cache: holds a prefix of 6 tokens, --prefix is 5");
}
