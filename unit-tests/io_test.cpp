// docs/spec.md §9: HDF5 run and cache files: bitwise round trips, atomic writes, and
// one clear InputError for every kind of bad file. The RunResults here are
// fabricated by hand; nothing runs the model.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/time.h>
#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "models/lab/hdf5_files.hpp"
#include "io/untrusted.hpp"
#include "model/error.hpp"
#include "models/lab/plan.hpp"
#include "models/lab/weights.hpp"

namespace ced {
namespace {

namespace fs = std::filesystem;
using MatI = Eigen::Matrix<int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr uint64_t kWeightSeed = 7;
constexpr uint64_t kTokenSeed = 11;

// A fresh directory per test, removed afterwards.
class IoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("ced_io_test." + std::to_string(::getpid()) + "." + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path path(const std::string& name) const { return dir_ / name; }
  std::vector<std::string> dir_entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    return names;
  }

  fs::path dir_;
};

// Deterministic values in [-4, 4); `as_float` makes every one exact in float.
MatD values(Eigen::Index rows, Eigen::Index cols, uint64_t seed, bool as_float) {
  MatD m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) {
    const double v = 8.0 * (static_cast<double>(splitmix64(seed + uint64_t(i)) >> 11) * 0x1.0p-53) - 4.0;
    m.data()[i] = as_float ? static_cast<double>(static_cast<float>(v)) : v;
  }
  return m;
}

bool same_bits(const MatD& a, const MatD& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * size_t(a.size())) == 0;
}

PersistedCache fabricated_cache(const Config& c, int64_t prefix_len, const std::string& dtype) {
  const bool f = dtype != "f64";
  PersistedCache cache;
  cache.prefix_len = prefix_len;
  cache.dtype = dtype;
  for (int64_t l : make_plan(c).kv_sources) {
    SourceCache s;
    s.layer = l;
    s.ratio = c.compress_ratios[size_t(l)];
    s.n_tokens = prefix_len;
    const int64_t n_entries = prefix_len / s.ratio;
    const int64_t n_pending = s.ratio >= 2 ? prefix_len % s.ratio : 0;
    s.entries = values(n_entries, c.head_dim, 100 + uint64_t(l), f);
    s.index_keys = values(n_entries, c.index_head_dim, 200 + uint64_t(l), f);
    s.pending_c = values(n_pending, c.head_dim, 300 + uint64_t(l), f);
    s.pending_z = values(n_pending, c.head_dim, 400 + uint64_t(l), f);
    cache.sources.push_back(std::move(s));
  }
  return cache;
}

// A full-mode f32 run over N = 6 plus 2 decode steps, with captures of an
// SWA-only layer (no topk), a Full layer and a Reuse layer, FLOPs and a cache.
RunResult full_f32_run(const Config& c) {
  RunResult r;
  r.backend = "reference";
  r.dtype = "f32";
  r.mode = Mode::Full;
  r.replay = ReplayPolicy::parse("none");
  r.n_prompt = 6;
  r.decode_steps = 2;
  r.n_replay = -1;
  r.replay_start = 0;
  r.prefix_len = -1;
  r.positions = {0, 1, 2, 3, 4, 5, 6, 7};
  r.logits = values(8, c.vocab_size, 1, /*as_float=*/true);
  for (int64_t l : {0, 1, 3}) {
    LayerCapture cap;
    cap.layer = l;
    cap.positions = {4, 5, 6, 7};
    cap.out = values(4, c.d_model, 10 + uint64_t(l), true);
    cap.has_topk = c.compress_ratios[size_t(l)] > 0;
    if (cap.has_topk) {
      cap.topk = MatI::Constant(4, c.index_topk, -1);
      cap.topk(1, 0) = 1;
      cap.topk(3, 0) = 2;
      cap.topk(3, 1) = 0;
      // docs/spec.md §9.1 scores: NaN where topk is -1; 1/3 does not survive a
      // float, so the left-out scores must be stored as double
      const double nan = std::numeric_limits<double>::quiet_NaN();
      cap.has_scores = true;
      cap.topk_scores = MatD::Constant(4, c.index_topk, nan);
      cap.topk_scores(1, 0) = 0.75;
      cap.topk_scores(3, 0) = 2.5;
      cap.topk_scores(3, 1) = -0.0;
      cap.kth_score = {nan, 0.75, nan, -0.0};
      cap.left_out_score = {nan, 0.5, nan, 1.0 / 3.0};
    }
    r.layers.push_back(std::move(cap));
  }
  r.flops.resize(c.n_layers);
  for (int64_t l = 0; l <= c.n_layers; ++l)
    for (int k = 0; k < kFlopKinds; ++k) r.flops.add(l, k, 1000 * l + k + 1);
  r.cache = std::make_shared<PersistedCache>(fabricated_cache(c, 6, "f32"));
  return r;
}

// A ced f64 run with an integer replay policy K = 3: logits at s..N-1.
RunResult ced_f64_run(const Config& c) {
  RunResult r;
  r.backend = "reference-f64";
  r.dtype = "f64";
  r.mode = Mode::Ced;
  r.replay = ReplayPolicy::parse("3");
  r.n_prompt = 7;
  r.decode_steps = 0;
  r.n_replay = 3;
  r.replay_start = 4;
  r.prefix_len = -1;
  r.positions = {4, 5, 6};
  r.logits = values(3, c.vocab_size, 2, /*as_float=*/false);
  return r;
}

RunFile two_run_file() {
  RunFile f;
  f.generator = "io_test";
  f.config = builtin_config("tiny");
  f.weight_seed = kWeightSeed;
  f.token_seed = kTokenSeed;
  f.tokens = make_tokens(kTokenSeed, f.config.vocab_size, 8);
  f.runs.push_back({"full-f32", full_f32_run(f.config)});
  f.runs.push_back({"ced-f64", ced_f64_run(f.config)});
  return f;
}

void expect_config_eq(const Config& a, const Config& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(to_toml(a), to_toml(b));
  // to_toml prints reals; compare their bits as well.
  EXPECT_EQ(std::memcmp(&a.rms_eps, &b.rms_eps, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.rope_theta, &b.rope_theta, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.routed_scaling_factor, &b.routed_scaling_factor, sizeof(double)), 0);
  EXPECT_EQ(a.tie_decoder_kv, b.tie_decoder_kv);
}

void expect_cache_eq(const PersistedCache& a, const PersistedCache& b) {
  EXPECT_EQ(a.prefix_len, b.prefix_len);
  EXPECT_EQ(a.dtype, b.dtype);
  ASSERT_EQ(a.sources.size(), b.sources.size());
  for (size_t i = 0; i < a.sources.size(); ++i) {
    const SourceCache &x = a.sources[i], &y = b.sources[i];
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.ratio, y.ratio);
    EXPECT_EQ(x.n_tokens, y.n_tokens);
    EXPECT_TRUE(same_bits(x.entries, y.entries)) << "layer " << x.layer;
    EXPECT_TRUE(same_bits(x.index_keys, y.index_keys)) << "layer " << x.layer;
    EXPECT_TRUE(same_bits(x.pending_c, y.pending_c)) << "layer " << x.layer;
    EXPECT_TRUE(same_bits(x.pending_z, y.pending_z)) << "layer " << x.layer;
  }
}

void expect_run_eq(const RunResult& a, const RunResult& b) {
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.mode, b.mode);
  EXPECT_EQ(a.replay.str(), b.replay.str());
  EXPECT_EQ(a.n_prompt, b.n_prompt);
  EXPECT_EQ(a.n_replay, b.n_replay);
  EXPECT_EQ(a.replay_start, b.replay_start);
  EXPECT_EQ(a.prefix_len, b.prefix_len);
  EXPECT_EQ(a.decode_steps, b.decode_steps);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_TRUE(same_bits(a.logits, b.logits));
  EXPECT_EQ(a.flops.per_layer, b.flops.per_layer);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerCapture &x = a.layers[i], &y = b.layers[i];
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.positions, y.positions);
    EXPECT_TRUE(same_bits(x.out, y.out)) << "layer " << x.layer;
    ASSERT_EQ(x.has_topk, y.has_topk) << "layer " << x.layer;
    if (x.has_topk) {
      EXPECT_EQ(x.topk, y.topk) << "layer " << x.layer;
    }
    ASSERT_EQ(x.has_scores, y.has_scores) << "layer " << x.layer;
    if (x.has_scores) {
      EXPECT_TRUE(same_bits(x.topk_scores, y.topk_scores)) << "layer " << x.layer;
      auto vec = [](const std::vector<double>& v) { return MatD(Eigen::Map<const MatD>(v.data(), 1, Eigen::Index(v.size()))); };
      EXPECT_TRUE(same_bits(vec(x.kth_score), vec(y.kth_score))) << "layer " << x.layer;
      EXPECT_TRUE(same_bits(vec(x.left_out_score), vec(y.left_out_score))) << "layer " << x.layer;
    }
  }
  ASSERT_EQ(a.cache == nullptr, b.cache == nullptr);
  if (a.cache) expect_cache_eq(*a.cache, *b.cache);
}

// The InputError message of `f`, or a test failure if it throws none.
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no InputError";
  return {};
}

// Opens a written file read-write for a test to damage it.
class RawFile {
 public:
  explicit RawFile(const fs::path& p) : id_(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) { EXPECT_GE(id_, 0); }
  ~RawFile() { H5Fclose(id_); }
  hid_t id() const { return id_; }
  // Overwrites an existing attribute (the object is opened first: HDF5 1.10
  // cannot write a dense-storage attribute opened by name).
  void set_int_attr(const char* obj, const char* name, int64_t v) {
    const hid_t o = H5Oopen(id_, obj, H5P_DEFAULT);
    const hid_t a = H5Aopen(o, name, H5P_DEFAULT);
    EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT64, &v), 0) << obj << " " << name;
    H5Aclose(a);
    H5Oclose(o);
  }

 private:
  hid_t id_;
};

// ---- round trips ----------------------------------------------------------

TEST_F(IoTest, RoundTripPreservesEveryRunFieldBitwise) {
  const RunFile f = two_run_file();
  write_run_file(path("runs.h5"), f);
  const RunFile g = read_run_file(path("runs.h5"));
  EXPECT_EQ(g.generator, f.generator);
  expect_config_eq(g.config, f.config);
  EXPECT_EQ(g.tokens, f.tokens);
  EXPECT_EQ(g.weight_seed, f.weight_seed);
  EXPECT_EQ(g.token_seed, f.token_seed);
  EXPECT_EQ(g.tokens_explicit, f.tokens_explicit);
  EXPECT_EQ(g.weights_dtype, "");
  ASSERT_EQ(g.runs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(f.runs[i].name);
    EXPECT_EQ(g.runs[i].name, f.runs[i].name);  // file order is write order, not name order
    expect_run_eq(g.runs[i].result, f.runs[i].result);
  }
}

TEST_F(IoTest, RunsAreListedInWriteOrderAndReadOneByOne) {
  const RunFile f = two_run_file();
  write_run_file(path("runs.h5"), f);
  EXPECT_EQ(list_runs(path("runs.h5")), (std::vector<std::string>{"full-f32", "ced-f64"}));
  expect_run_eq(read_run(path("runs.h5"), "ced-f64"), f.runs[1].result);
  const RunFile header = read_run_file_header(path("runs.h5"));
  EXPECT_TRUE(header.runs.empty());
  EXPECT_EQ(header.tokens, f.tokens);
  const std::string msg = input_error([&] { read_run(path("runs.h5"), "nope"); });
  EXPECT_NE(msg.find("/runs/nope"), std::string::npos) << msg;
  EXPECT_NE(msg.find("full-f32"), std::string::npos) << "lists the runs there are: " << msg;
}

TEST_F(IoTest, ConfigRoundTripEqualsEveryBuiltin) {
  for (const std::string& name : builtin_names()) {
    SCOPED_TRACE(name);
    RunFile f;
    f.config = builtin_config(name);
    f.token_seed = kTokenSeed;
    f.tokens = make_tokens(kTokenSeed, f.config.vocab_size, 5);
    write_run_file(path(name + ".h5"), f);
    expect_config_eq(read_run_file(path(name + ".h5")).config, f.config);
  }
}

TEST_F(IoTest, TiedDecoderKvAndExplicitTokensRoundTrip) {
  RunFile f = two_run_file();
  f.runs.clear();
  f.config.tie_decoder_kv = true;
  f.tokens = {0, 96, 5, 5};  // given, not generated
  f.tokens_explicit = true;
  f.token_seed = ~uint64_t(0);  // all 64 bits survive
  f.weight_seed = uint64_t(1) << 63;
  write_run_file(path("t.h5"), f);
  const RunFile g = read_run_file(path("t.h5"));
  EXPECT_TRUE(g.config.tie_decoder_kv);
  EXPECT_TRUE(g.tokens_explicit);
  EXPECT_EQ(g.tokens, f.tokens);
  EXPECT_EQ(g.token_seed, f.token_seed);
  EXPECT_EQ(g.weight_seed, f.weight_seed);
}

TEST_F(IoTest, StoredWeightsEqualTheGeneratedTensors) {
  for (const std::string dtype : {"f64", "f32"}) {
    SCOPED_TRACE(dtype);
    RunFile f = two_run_file();
    f.weights_dtype = dtype;
    const fs::path p = path("w" + dtype + ".h5");
    write_run_file(p, f);
    EXPECT_EQ(read_run_file_header(p).weights_dtype, dtype);
    for (const TensorSpec& t : weight_specs(f.config, make_plan(f.config))) {
      const WeightTensor w = read_weight(p, t.name);
      ASSERT_EQ(w.shape, t.shape) << t.name;
      std::vector<double> want = generate_tensor(t, kWeightSeed);
      if (dtype == "f32")  // an f32 model rounds each value (docs/spec.md §2)
        for (double& v : want) v = static_cast<double>(static_cast<float>(v));
      ASSERT_EQ(w.values, want) << t.name;
    }
  }
  const std::string msg = input_error([&] { read_weight(path("wf64.h5"), "layers.0.nope"); });
  EXPECT_NE(msg.find("/weights/layers.0.nope"), std::string::npos) << msg;
}

TEST_F(IoTest, F32RunWithValuesBeyondFloatIsStoredWithoutRounding) {
  RunFile f = two_run_file();
  f.runs.resize(1);
  f.runs[0].result.logits = values(8, f.config.vocab_size, 5, /*as_float=*/false);
  write_run_file(path("r.h5"), f);
  EXPECT_TRUE(same_bits(read_run_file(path("r.h5")).runs[0].result.logits, f.runs[0].result.logits));
}

TEST_F(IoTest, NonFiniteLogitsAreReadBackNotRejected) {
  RunFile f = two_run_file();
  MatD& logits = f.runs[0].result.logits;
  logits(0, 0) = std::nan("");
  logits(1, 1) = INFINITY;
  logits(2, 2) = -INFINITY;
  write_run_file(path("nan.h5"), f);
  const MatD got = read_run_file(path("nan.h5")).runs[0].result.logits;
  EXPECT_TRUE(std::isnan(got(0, 0)));
  EXPECT_EQ(got(1, 1), INFINITY);
  EXPECT_EQ(got(2, 2), -INFINITY);
}

TEST_F(IoTest, PersistedCacheRoundTripsBitwise) {
  CacheFile f;
  f.generator = "io_test";
  f.config = builtin_config("tiny");
  f.weight_seed = kWeightSeed;
  f.token_seed = 5;
  f.cache = fabricated_cache(f.config, 7, "f64");  // 7 = odd: the ratio-2 source has a pending row
  f.tokens = make_tokens(f.token_seed, f.config.vocab_size, 7);
  ASSERT_EQ(f.cache.sources[0].pending_c.rows(), 1);
  write_cache_file(path("cache.h5"), f);
  const CacheFile g = read_cache_file(path("cache.h5"));
  EXPECT_EQ(g.generator, f.generator);
  EXPECT_EQ(g.weight_seed, f.weight_seed);
  EXPECT_EQ(g.token_seed, f.token_seed);
  EXPECT_EQ(g.tokens, f.tokens);
  expect_config_eq(g.config, f.config);
  expect_cache_eq(g.cache, f.cache);
}

TEST_F(IoTest, CacheFileWithoutItsPromptIsRefusedSayingHowToRewriteIt) {
  CacheFile f;
  f.generator = "io_test";
  f.config = builtin_config("tiny");
  f.weight_seed = kWeightSeed;
  f.token_seed = kTokenSeed;
  f.cache = fabricated_cache(f.config, 4, "f32");
  f.tokens = make_tokens(kTokenSeed, f.config.vocab_size, 4);
  write_cache_file(path("old.h5"), f);
  // an old cache file: everything but the prompt prefix
  hid_t file = H5Fopen(path("old.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(H5Ldelete(file, "/inputs/tokens", H5P_DEFAULT), 0);
  H5Fclose(file);
  const std::string msg = input_error([&] { (void)read_cache_file(path("old.h5")); });
  EXPECT_NE(msg.find("/inputs/tokens: is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--cache-out"), std::string::npos) << msg;
}

TEST_F(IoTest, CachePrefixOfTheWrongLengthIsRefusedOnWrite) {
  CacheFile f;
  f.config = builtin_config("tiny");
  f.cache = fabricated_cache(f.config, 4, "f32");
  f.tokens = make_tokens(kTokenSeed, f.config.vocab_size, 3);
  f.token_seed = kTokenSeed;
  const std::string msg = input_error([&] { write_cache_file(path("c.h5"), f); });
  EXPECT_NE(msg.find("holds 3 tokens, the cache covers a prefix of 4"), std::string::npos) << msg;
  EXPECT_TRUE(dir_entries().empty());
}

// ---- untrusted files: the child process (io/untrusted.hpp) ----------------

TEST(Isolation, AnswerOfAHealthyChildComesBack) {
  EXPECT_EQ(run_isolated("f.h5", {10, 1ull << 30}, [] { return std::string("fine"); }), "fine");
}

TEST(Isolation, InputErrorOfTheChildComesBackUnchanged) {
  const std::string msg = input_error([] {
    run_isolated("f.h5", {10, 1ull << 30}, []() -> std::string { throw InputError("cannot read 'f.h5': /x: bad"); });
  });
  EXPECT_EQ(msg, "cannot read 'f.h5': /x: bad");
}

TEST(Isolation, CrashOfTheChildIsACorruptFileErrorNamingTheSignal) {
  const std::string msg = input_error([] {
    run_isolated("f.h5", {10, 1ull << 30}, []() -> std::string {
      std::raise(SIGSEGV);
      return "survived";
    });
  });
  EXPECT_EQ(msg, "cannot read 'f.h5': corrupt or unreadable HDF5 file (the reader was killed by SIGSEGV)");
}

TEST(Isolation, ChildRunningPastItsTimeIsStopped) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = input_error([] {
    run_isolated("f.h5", {1, 1ull << 30}, []() -> std::string {
      std::atomic<uint64_t> spins{0};
      for (;;) spins.fetch_add(1, std::memory_order_relaxed);  // a library stuck in a loop
    });
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(msg.find("corrupt or unreadable HDF5 file (the reader ran past the limit of 1 s)"), std::string::npos) << msg;
  EXPECT_LT(secs, 5.0);  // the 1 s alarm, with room for a loaded machine
}

TEST(Isolation, ChildThatBlocksItsAlarmIsKilledByTheParentsDeadline) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = input_error([] {
    run_isolated("f.h5", {0.5, 1ull << 30}, []() -> std::string {
      sigset_t alarm;  // a library that blocks the signal its time limit rests on
      sigemptyset(&alarm);
      sigaddset(&alarm, SIGALRM);
      sigprocmask(SIG_BLOCK, &alarm, nullptr);
      // stuck in the kernel, asleep; bounded so that a parent without its own deadline fails this test
      // with the answer instead of hanging it
      for (int i = 0; i < 300; ++i) ::usleep(100000);
      return "woke after 30 s";
    });
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(msg.find("corrupt or unreadable HDF5 file (the reader ran past the limit of 0.5 s)"), std::string::npos)
      << msg;
  EXPECT_LT(secs, 20.0);  // the parent kills at the limit + 5 s; the rest is room for a loaded machine
}

// A limit below one second is a limit: the child's alarm is rounded up to
// whole seconds (alarm's unit), never down to 0, which would set no alarm and
// leave only the parent's backup deadline at the limit + 5 s.
TEST(Isolation, ALimitBelowOneSecondStopsALoopingChildByItsAlarm) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = input_error([] {
    run_isolated("f.h5", {0.5, 1ull << 30}, []() -> std::string {
      std::atomic<uint64_t> spins{0};
      for (;;) spins.fetch_add(1, std::memory_order_relaxed);
    });
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(msg.find("corrupt or unreadable HDF5 file (the reader ran past the limit of 0.5 s)"), std::string::npos)
      << msg;
  EXPECT_GE(secs, 0.5);  // not before its limit
  // the 1 s alarm; the parent's deadline would take 5.5 s, and 1.5 s of room below it is for a loaded machine
  EXPECT_LT(secs, 4.0);
}

// CED_READ_TIMEOUT_S set for the life of one object, then restored.
struct ReadTimeoutSet {
  std::optional<std::string> old;
  explicit ReadTimeoutSet(const char* v) {
    if (const char* o = std::getenv("CED_READ_TIMEOUT_S")) old = o;
    if (v) ::setenv("CED_READ_TIMEOUT_S", v, 1);
    else ::unsetenv("CED_READ_TIMEOUT_S");
  }
  ~ReadTimeoutSet() {
    if (old) ::setenv("CED_READ_TIMEOUT_S", old->c_str(), 1);
    else ::unsetenv("CED_READ_TIMEOUT_S");
  }
};

// The override is a whole number of seconds or a fraction, in (0, 1e6], and
// nothing after it; anything else is one line naming the variable and the
// value. Unset or empty, it is the default: 20 s for a file of no bytes (an
// empty value is unset, as for CED_GOLDEN_DIR and CED_GEMM_ISA).
TEST(Isolation, ReadTimeoutOverrideIsAPositiveNumberOfSecondsWithNothingAfterIt) {
  const fs::path none = fs::temp_directory_path() / "ced-io-test-no-such-file.h5";
  for (const char* bad : {"5x", "1.5 s", "0", "-1", "nan", "inf", "1e7", "s", " "}) {
    const ReadTimeoutSet set(bad);
    EXPECT_EQ(input_error([&] { isolation_limits(none); }),
              fmt::format("CED_READ_TIMEOUT_S: '{}' is not a number of seconds in (0, 1e6]", bad));
  }
  for (const auto& [good, secs] : {std::pair{"0.5", 0.5}, {"3", 3.0}, {"1e6", 1e6}, {"2.25", 2.25}}) {
    const ReadTimeoutSet set(good);
    EXPECT_EQ(isolation_limits(none).seconds, secs) << good;
  }
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const ReadTimeoutSet set(unset);
    EXPECT_EQ(isolation_limits(none).seconds, 20.0) << (unset ? "empty" : "unset");
  }
}

// A process may catch signals without SA_RESTART (the Python module's interpreter does): a signal that
// interrupts the wait for the reader must not lose the reader's exit status.
TEST(Isolation, ExitStatusOfTheChildSurvivesASignalInterruptingTheWait) {
  struct sigaction caught {}, old {};
  caught.sa_handler = [](int) {};
  caught.sa_flags = 0;  // no SA_RESTART: a blocking waitpid returns EINTR
  sigemptyset(&caught.sa_mask);
  ASSERT_EQ(sigaction(SIGALRM, &caught, &old), 0);
  const itimerval every_50ms{{0, 50000}, {0, 50000}}, off{};
  ASSERT_EQ(setitimer(ITIMER_REAL, &every_50ms, nullptr), 0);
  const std::string msg = input_error([] {
    run_isolated("f.h5", {10, 1ull << 30}, []() -> std::string {
      // close the answer pipe at once, so the parent sits in waitpid while the timer fires, then fail
      for (int fd = 3; fd < 1024; ++fd) ::close(fd);
      ::usleep(500000);
      ::_exit(7);
    });
  });
  setitimer(ITIMER_REAL, &off, nullptr);
  sigaction(SIGALRM, &old, nullptr);
  EXPECT_EQ(msg, "cannot read 'f.h5': corrupt or unreadable HDF5 file (the reader exited with status 7)");
}

// The child inherits the parent's signal handlers (the Python module's interpreter installs some without
// SA_RESTART): a signal that interrupts its write of the answer, with the pipe full and nothing written yet,
// must not cut the answer short. The body floods its own main thread with a caught signal while the
// 16 MiB answer goes through the 64 KiB pipe, so such an interruption comes many times per run.
TEST(Isolation, AnswerOfTheChildSurvivesSignalsInterruptingItsWrite) {
  const size_t size = size_t(16) << 20;
  const std::string got = run_isolated("f.h5", {30, 1ull << 30}, [size]() -> std::string {
    struct sigaction caught {};
    caught.sa_handler = [](int) {};
    caught.sa_flags = 0;  // no SA_RESTART: a blocked write returns EINTR
    sigemptyset(&caught.sa_mask);
    sigaction(SIGUSR1, &caught, nullptr);
    const pthread_t writer = pthread_self();
    std::thread([writer] {
      for (;;) {  // until _exit ends the child
        pthread_kill(writer, SIGUSR1);
        ::usleep(50);
      }
    }).detach();
    return std::string(size, 'x');
  });
  EXPECT_EQ(got.size(), size);
  EXPECT_EQ(got.find_first_not_of('x'), std::string::npos);
}

#if !defined(__SANITIZE_ADDRESS__)
TEST(Isolation, ChildAllocatingPastItsMemoryLimitIsRefused) {
  const std::string msg = input_error([] {
    run_isolated("f.h5", {10, 64ull << 20}, []() -> std::string {
      std::vector<char> big(size_t(1) << 30, 1);  // 1 GiB against a 64 MiB allowance
      return std::to_string(big[12345]);
    });
  });
  EXPECT_NE(msg.find("corrupt or unreadable HDF5 file (the reader ran out of its 64 MiB of memory)"), std::string::npos)
      << msg;
}
#endif

TEST_F(IoTest, UntrustedReadGivesTheSameRunFileAsTheDirectRead) {
  write_run_file(path("r.h5"), two_run_file());
  const RunFile a = read_run_file(path("r.h5")), b = read_untrusted_run_file(path("r.h5"));
  EXPECT_EQ(a.generator, b.generator);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(to_toml(a.config), to_toml(b.config));
  ASSERT_EQ(a.runs.size(), b.runs.size());
  for (size_t i = 0; i < a.runs.size(); ++i) {
    EXPECT_EQ(a.runs[i].name, b.runs[i].name);
    EXPECT_TRUE(same_bits(a.runs[i].result.logits, b.runs[i].result.logits)) << a.runs[i].name;
    EXPECT_EQ(a.runs[i].result.positions, b.runs[i].result.positions);
    EXPECT_EQ(a.runs[i].result.layers.size(), b.runs[i].result.layers.size());
  }
}

TEST_F(IoTest, CacheMissingAKvSourceIsRefusedOnWrite) {
  CacheFile f;
  f.config = builtin_config("tiny");
  f.cache = fabricated_cache(f.config, 4, "f32");
  f.cache.sources.pop_back();
  const std::string msg = input_error([&] { write_cache_file(path("c.h5"), f); });
  EXPECT_NE(msg.find("kv sources"), std::string::npos) << msg;
  EXPECT_TRUE(dir_entries().empty());
}

// ---- atomic writes --------------------------------------------------------

TEST_F(IoTest, WriteIntoMissingDirectoryThrowsAndLeavesNoFile) {
  const fs::path p = path("no-such-dir") / "x.h5";
  const std::string msg = input_error([&] { write_run_file(p, two_run_file()); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("x.h5"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(dir_entries().empty());
}

TEST_F(IoTest, WriteOntoADirectoryThrowsInputError) {
  fs::create_directory(path("d.h5"));
  input_error([&] { write_run_file(path("d.h5"), two_run_file()); });
  EXPECT_TRUE(fs::is_directory(path("d.h5")));
}

TEST_F(IoTest, FailedWriteMidwayLeavesNoFileAndNoTempFile) {
  RunFile f = two_run_file();
  // The second run is inconsistent: it fails after the first has been written.
  f.runs[1].result.logits = values(3, f.config.vocab_size - 1, 3, false);
  const std::string msg = input_error([&] { write_run_file(path("bad.h5"), f); });
  EXPECT_NE(msg.find("/runs/ced-f64/logits"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab_size"), std::string::npos) << msg;
  EXPECT_TRUE(dir_entries().empty()) << "found " << ::testing::PrintToString(dir_entries());
}

TEST_F(IoTest, FailedWriteKeepsThePreviousFile) {
  const RunFile good = two_run_file();
  write_run_file(path("f.h5"), good);
  const auto size = fs::file_size(path("f.h5"));
  RunFile bad = good;
  bad.runs[0].result.positions.pop_back();  // positions no longer match the logits rows
  const std::string msg = input_error([&] { write_run_file(path("f.h5"), bad); });
  EXPECT_NE(msg.find("/runs/full-f32/positions"), std::string::npos) << msg;
  EXPECT_EQ(fs::file_size(path("f.h5")), size);
  EXPECT_EQ(read_run_file(path("f.h5")).runs.size(), 2u);
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"f.h5"});
}

TEST_F(IoTest, InconsistentRunFilesAreRefusedOnWrite) {
  struct Case {
    const char* what;
    void (*spoil)(RunFile&);
    const char* expect;
  };
  const Case cases[] = {
      {"tokens shorter than N + decode", [](RunFile& f) { f.tokens.resize(7); }, "/runs/full-f32"},
      {"token out of vocab", [](RunFile& f) { f.tokens[2] = 97; f.tokens_explicit = true; }, "/inputs/tokens"},
      {"tokens not from token_seed", [](RunFile& f) { f.tokens[2] = (f.tokens[2] + 1) % 97; }, "token_seed"},
      {"unknown dtype", [](RunFile& f) { f.runs[0].result.dtype = "f16"; }, "f16"},
      {"duplicate run name", [](RunFile& f) { f.runs[1].name = "full-f32"; }, "two runs"},
      {"run name with a slash", [](RunFile& f) { f.runs[1].name = "a/b"; }, "run name"},
      {"positions not ascending", [](RunFile& f) { f.runs[1].result.positions = {4, 6, 5}; }, "ascending"},
      {"out columns != d_model",
       [](RunFile& f) { f.runs[0].result.layers[0].out = values(4, 31, 1, true); }, "/runs/full-f32/layers/0/out"},
      {"topk columns != index_topk",
       [](RunFile& f) { f.runs[0].result.layers[1].topk = MatI::Constant(4, 2, -1); }, "/runs/full-f32/layers/1/topk"},
      {"topk on an SWA-only layer",
       [](RunFile& f) {
         auto& cap = f.runs[0].result.layers[0];
         cap.has_topk = true;
         cap.topk = MatI::Constant(4, 3, -1);
       },
       "SWA-only"},
      {"invalid config", [](RunFile& f) { f.config.n_encoder_layers = 0; }, "n_encoder_layers"},
      // a resume run's prefix P lies in [0, N]: both ends, just outside
      {"resume without a prefix",
       [](RunFile& f) { f.runs[1].result.mode = Mode::Resume; f.runs[1].result.prefix_len = -1; },
       "prefix_len -1 is outside [0, n_prompt = 7]"},
      {"resume prefix past the prompt",
       [](RunFile& f) { f.runs[1].result.mode = Mode::Resume; f.runs[1].result.prefix_len = 8; },
       "prefix_len 8 is outside [0, n_prompt = 7]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    RunFile f = two_run_file();
    c.spoil(f);
    const std::string msg = input_error([&] { write_run_file(path("x.h5"), f); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_TRUE(dir_entries().empty());
  }
}

TEST_F(IoTest, ResumeRunsWithPrefixAtEitherEndOfTheirRangeAreWritten) {
  for (const int64_t P : {int64_t(0), int64_t(7)}) {
    RunFile f = two_run_file();
    f.runs[1].result.mode = Mode::Resume;
    f.runs[1].result.prefix_len = P;
    EXPECT_NO_THROW(write_run_file(path("resume.h5"), f)) << "P = " << P;
  }
}

TEST_F(IoTest, NoHdf5HandleOutlivesACallEvenWhenItFails) {
  RunFile f = two_run_file();
  write_run_file(path("ok.h5"), f);
  read_run_file(path("ok.h5"));
  f.runs[1].result.logits.resize(3, 5);  // fails mid-way, with the file and groups open
  input_error([&] { write_run_file(path("bad.h5"), f); });
  {
    RawFile raw(path("ok.h5"));
    ASSERT_GE(H5Ldelete(raw.id(), "/runs/full-f32/layers/1/out", H5P_DEFAULT), 0);
  }
  input_error([&] { read_run_file(path("ok.h5")); });  // fails deep inside a run
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
}

// ---- bad files ------------------------------------------------------------

TEST_F(IoTest, MissingFileIsNamed) {
  const std::string msg = input_error([&] { read_run_file(path("absent.h5")); });
  EXPECT_NE(msg.find("absent.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;
}

TEST_F(IoTest, TextFileIsNotHdf5) {
  std::ofstream(path("notes.h5")) << "this is not HDF5\n";
  const std::string msg = input_error([&] { read_run_file(path("notes.h5")); });
  EXPECT_NE(msg.find("notes.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not an HDF5 file"), std::string::npos) << msg;
}

TEST_F(IoTest, TruncatedFileIsReportedNotCrashed) {
  write_run_file(path("t.h5"), two_run_file());
  fs::resize_file(path("t.h5"), fs::file_size(path("t.h5")) / 2);
  const std::string msg = input_error([&] { read_run_file(path("t.h5")); });
  EXPECT_NE(msg.find("t.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST_F(IoTest, EveryTruncationIsAnInputError) {
  write_run_file(path("full.h5"), two_run_file());
  const auto size = fs::file_size(path("full.h5"));
  for (uintmax_t keep = 0; keep < size; keep += std::max<uintmax_t>(1, size / 97)) {  // 97: an odd stride
    SCOPED_TRACE(keep);
    fs::copy_file(path("full.h5"), path("cut.h5"), fs::copy_options::overwrite_existing);
    fs::resize_file(path("cut.h5"), keep);
    input_error([&] { read_run_file(path("cut.h5")); });
  }
}

TEST_F(IoTest, ForeignHdf5FileSaysWhichFormatItLacks) {
  const hid_t id = H5Fcreate(path("other.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(id, 0);
  H5Fclose(id);
  const std::string msg = input_error([&] { read_run_file(path("other.h5")); });
  EXPECT_NE(msg.find("ced-harness"), std::string::npos) << msg;
}

TEST_F(IoTest, UnknownFormatVersionIsRefusedNamingTheRegenerateCommand) {
  for (int64_t version : {int64_t(0), kFileFormatVersion + 1}) {
    write_run_file(path("v.h5"), two_run_file());
    {
      RawFile raw(path("v.h5"));
      raw.set_int_attr("/", "format_version", version);
    }
    for (const auto& read : {+[](const fs::path& p) { read_run_file(p); },
                             +[](const fs::path& p) { list_runs(p); }}) {
      const std::string msg = input_error([&] { read(path("v.h5")); });
      EXPECT_NE(msg.find(fmt::format("format_version {} is not supported", version)), std::string::npos) << msg;
      EXPECT_NE(msg.find("ced golden regenerate"), std::string::npos) << msg;
    }
  }
}

TEST_F(IoTest, SelectionScoresAreWrittenAsVersion2AndReadBackBitwise) {
  const RunFile f = two_run_file();
  write_run_file(path("s.h5"), f);
  const RunFile g = read_run_file(path("s.h5"));
  EXPECT_EQ(g.format_version, kFileFormatVersion);  // version 2 added the scores (3, the family, keeps them)
  expect_run_eq(g.runs[0].result, f.runs[0].result);
  int scored = 0;
  for (const auto& cap : g.runs[0].result.layers) scored += cap.has_scores;
  EXPECT_EQ(scored, 2);  // the Full and the Reuse layer; the SWA-only one has no topk
}

TEST_F(IoTest, Version1FileIsReadWithoutScores) {
  // A version-1 file is a version-2 file without the three score datasets
  // (docs/spec.md §9.1); one that has them anyway is read as version 1 says.
  for (bool delete_scores : {true, false}) {
    write_run_file(path("v1.h5"), two_run_file());
    {
      RawFile raw(path("v1.h5"));
      raw.set_int_attr("/", "format_version", 1);
      if (delete_scores) {
        for (int64_t l : {1, 3})
          for (const char* d : {"topk_scores", "kth_score", "left_out_score"})
            ASSERT_GE(H5Ldelete(raw.id(), fmt::format("/runs/full-f32/layers/{}/{}", l, d).c_str(), H5P_DEFAULT), 0);
      }
    }
    const RunFile g = read_run_file(path("v1.h5"));
    EXPECT_EQ(g.format_version, 1);
    RunResult want = two_run_file().runs[0].result;
    for (auto& cap : want.layers) {
      cap.has_scores = false;
      cap.topk_scores.resize(0, 0);
      cap.kth_score.clear();
      cap.left_out_score.clear();
    }
    expect_run_eq(g.runs[0].result, want);
  }
}

TEST_F(IoTest, PartOfTheScoreDatasetsIsRefusedNamingTheLayer) {
  write_run_file(path("part.h5"), two_run_file());
  {
    RawFile raw(path("part.h5"));
    ASSERT_GE(H5Ldelete(raw.id(), "/runs/full-f32/layers/3/kth_score", H5P_DEFAULT), 0);
  }
  const std::string msg = input_error([&] { read_run_file(path("part.h5")); });
  EXPECT_NE(msg.find("/runs/full-f32/layers/3: holds some of topk_scores"), std::string::npos) << msg;
}

TEST_F(IoTest, ScoresOfTheWrongShapeAreRefusedBeforeAnythingIsWritten) {
  RunFile f = two_run_file();
  f.runs[0].result.layers[1].left_out_score.pop_back();
  const std::string msg = input_error([&] { write_run_file(path("bad.h5"), f); });
  EXPECT_NE(msg.find("left_out_score: has 3 entries, but topk has 4 rows"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path("bad.h5")));
}

TEST_F(IoTest, DeletedLogitsDatasetIsNamed) {
  write_run_file(path("d.h5"), two_run_file());
  {
    RawFile raw(path("d.h5"));
    ASSERT_GE(H5Ldelete(raw.id(), "/runs/ced-f64/logits", H5P_DEFAULT), 0);
  }
  const std::string msg = input_error([&] { read_run_file(path("d.h5")); });
  EXPECT_NE(msg.find("d.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/runs/ced-f64/logits: is missing"), std::string::npos) << msg;
  // The other run is still readable on its own.
  EXPECT_NO_THROW(read_run(path("d.h5"), "full-f32"));
}

TEST_F(IoTest, LogitsWithWrongColumnCountAreNamed) {
  write_run_file(path("c.h5"), two_run_file());
  {
    RawFile raw(path("c.h5"));
    ASSERT_GE(H5Ldelete(raw.id(), "/runs/ced-f64/logits", H5P_DEFAULT), 0);
    const hsize_t dims[2] = {3, 96};  // vocab_size is 97
    const std::vector<double> zeros(3 * 96, 0.0);
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    const hid_t d = H5Dcreate2(raw.id(), "/runs/ced-f64/logits", H5T_IEEE_F64LE, space, H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(d, 0);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data()), 0);
    H5Dclose(d);
    H5Sclose(space);
  }
  const std::string msg = input_error([&] { read_run_file(path("c.h5")); });
  EXPECT_NE(msg.find("/runs/ced-f64/logits"), std::string::npos) << msg;
  EXPECT_NE(msg.find("96 columns"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab_size"), std::string::npos) << msg;
}

TEST_F(IoTest, MissingAttributeIsNamed) {
  write_run_file(path("a.h5"), two_run_file());
  {
    RawFile raw(path("a.h5"));
    ASSERT_GE(H5Adelete_by_name(raw.id(), "/runs/full-f32", "replay_start", H5P_DEFAULT), 0);
  }
  const std::string msg = input_error([&] { read_run_file(path("a.h5")); });
  EXPECT_NE(msg.find("/runs/full-f32: attribute 'replay_start' is missing"), std::string::npos) << msg;
}

// A number stored as text is named as such, not merely as unreadable.
TEST_F(IoTest, TextWhereANumberBelongsIsNamed) {
  write_run_file(path("a.h5"), two_run_file());
  {
    RawFile raw(path("a.h5"));
    ASSERT_GE(H5Adelete_by_name(raw.id(), "/config", "rms_eps", H5P_DEFAULT), 0);
    hid_t type = H5Tcopy(H5T_C_S1);
    ASSERT_GE(H5Tset_size(type, 5), 0);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t obj = H5Oopen(raw.id(), "/config", H5P_DEFAULT);
    hid_t a = H5Acreate2(obj, "rms_eps", type, space, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(a, 0);
    ASSERT_GE(H5Awrite(a, type, "1e-6"), 0);
    H5Aclose(a);
    H5Oclose(obj);
    H5Sclose(space);
    H5Tclose(type);
  }
  const std::string msg = input_error([&] { read_run_file(path("a.h5")); });
  EXPECT_NE(msg.find("/config: attribute 'rms_eps' is not a number"), std::string::npos) << msg;
}

// Files written by other tools may hold chunked, compressed datasets, which
// store fewer bytes than elements x size: the size check of a corrupt
// dataspace applies to contiguous and compact layouts only, so such a file reads.
TEST_F(IoTest, CompressedChunkedDatasetIsRead) {
  write_run_file(path("a.h5"), two_run_file());
  {
    RawFile raw(path("a.h5"));
    const char* name = "/runs/full-f32/logits";
    hid_t old = H5Dopen2(raw.id(), name, H5P_DEFAULT);
    ASSERT_GE(old, 0);
    hid_t type = H5Dget_type(old), space = H5Dget_space(old);
    hsize_t dims[2] = {0, 0};
    ASSERT_EQ(H5Sget_simple_extent_dims(space, dims, nullptr), 2);
    H5Dclose(old);
    ASSERT_GE(H5Ldelete(raw.id(), name, H5P_DEFAULT), 0);
    hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_chunk(plist, 2, dims), 0);
    ASSERT_GE(H5Pset_deflate(plist, 9), 0);
    hid_t d = H5Dcreate2(raw.id(), name, type, space, H5P_DEFAULT, plist, H5P_DEFAULT);
    ASSERT_GE(d, 0);
    // zeros compress to far fewer bytes than they occupy
    const std::vector<double> zeros(dims[0] * dims[1], 0.0);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data()), 0);
    ASSERT_LT(H5Dget_storage_size(d), dims[0] * dims[1] * H5Tget_size(type));
    H5Dclose(d);
    H5Pclose(plist);
    H5Sclose(space);
    H5Tclose(type);
  }
  const RunFile f = read_run_file(path("a.h5"));
  EXPECT_EQ(f.runs[0].result.logits.norm(), 0.0);
  EXPECT_EQ(f.runs[0].result.logits.rows(), 8);  // full_f32_run: every position of N = 8
}

TEST_F(IoTest, ConfigReadBackIsValidated) {
  write_run_file(path("v.h5"), two_run_file());
  {
    RawFile raw(path("v.h5"));
    raw.set_int_attr("/config", "window", 0);
  }
  const std::string msg = input_error([&] { read_run_file(path("v.h5")); });
  EXPECT_NE(msg.find("window"), std::string::npos) << msg;
}

TEST_F(IoTest, TokensOutsideVocabAreRefusedOnRead) {
  write_run_file(path("tok.h5"), two_run_file());
  {
    RawFile raw(path("tok.h5"));
    const hid_t d = H5Dopen2(raw.id(), "/inputs/tokens", H5P_DEFAULT);
    std::vector<int32_t> bad(8, 500);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, bad.data()), 0);
    H5Dclose(d);
  }
  const std::string msg = input_error([&] { read_run_file(path("tok.h5")); });
  EXPECT_NE(msg.find("/inputs/tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
}

TEST_F(IoTest, FixedLengthStringAttributesAreReadToo) {
  write_run_file(path("s.h5"), two_run_file());
  {
    // Another writer's choice: a fixed-length, space-padded string.
    RawFile raw(path("s.h5"));
    ASSERT_GE(H5Adelete_by_name(raw.id(), "/runs/ced-f64", "dtype", H5P_DEFAULT), 0);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, 8);
    H5Tset_strpad(type, H5T_STR_SPACEPAD);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate_by_name(raw.id(), "/runs/ced-f64", "dtype", type, space, H5P_DEFAULT,
                                         H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(attr, type, "f64     "), 0);
    H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
  }
  EXPECT_EQ(read_run(path("s.h5"), "ced-f64").dtype, "f64");
}

}  // namespace
}  // namespace ced

namespace ced {
namespace {

// A fuzzer's file (fuzz/corpus/input_fuzz/regression-storage-size-beyond-the-file, its first byte the fuzzer's
// selector): a contiguous /config list whose header claims 2^34 elements stored in 6.9·10^18 bytes of a 17 kB
// file. The storage size is read from the file too, so the claim is checked against the file's own size before
// anything is allocated (a 128 GiB allocation before: out of memory under the sanitizers, a crash).
TEST(CorruptFiles, AStorageSizeBeyondTheFileIsRefusedBeforeAnyAllocation) {
  std::ifstream in(std::string(CED_SOURCE_DIR) + "/fuzz/corpus/input_fuzz/regression-storage-size-beyond-the-file",
                   std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1u);
  const std::string path = ::testing::TempDir() + "/storage-beyond-the-file.h5";
  std::ofstream(path, std::ios::binary) << bytes.substr(1);
  try {
    read_run_file(path);
    FAIL() << "the corrupt file was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/config/kv_source_layers: claims to store 6876538651743121001 bytes in a "
                                         "file of 16984"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ced
