// Input contracts of the `ced` command line: every argument with a grammar
// refuses trailing garbage and out-of-range values (exit 2, one line on stderr,
// naming the option), and `--cache-in` refuses a cache that belongs to another
// config, weight seed or prompt prefix, naming the mismatch. Each refusal has
// an accepted neighbour, so a test cannot pass by refusing everything.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "unit-tests/run_ced.hpp"

namespace fs = std::filesystem;

namespace {

using ced::test::Result;

// One scratch directory per process, removed when the process ends.
struct RemovedAtExit {
  fs::path dir;
  ~RemovedAtExit() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

fs::path scratch() {
  static const RemovedAtExit d = [] {
    fs::path p = fs::temp_directory_path() / ("ced-cli-input-test-" + std::to_string(::getpid()));
    fs::create_directories(p);
    return RemovedAtExit{p};
  }();
  return d.dir;
}


Result run_ced(const std::string& args) { return ced::test::run_ced_in(scratch(), args); }

// Exit 2, one line on stderr, containing `word` (the option or the mismatch).
void expect_refused(const std::string& args, const std::string& word) {
  const Result r = run_ced(args);
  EXPECT_EQ(r.code, 2) << "ced " << args << "\n" << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "ced " << args << ": want one line: " << r.err;
  EXPECT_NE(r.err.find(word), std::string::npos) << "ced " << args << ": " << r.err;
}

void expect_accepted(const std::string& args) {
  const Result r = run_ced(args);
  EXPECT_EQ(r.code, 0) << "ced " << args << "\n" << r.err;
}

std::string out(const std::string& name) { return " --out " + (scratch() / name).string(); }

}  // namespace

// ---- integers -------------------------------------------------------------

TEST(CliInput, IntegerOptionsRefuseTrailingGarbage) {
  expect_refused("run --config tiny --tokens 5x" + out("g.h5"), "--tokens: '5x' is not a decimal integer");
  expect_refused("run --config tiny --tokens 5.0" + out("g.h5"), "--tokens");
  expect_refused("run --config tiny --tokens 5,6" + out("g.h5"), "--tokens");
  expect_refused("run --config tiny --tokens 8 --mode resume --prefix 4x" + out("g.h5"), "--prefix");
  expect_refused("run --config tiny --tokens 8 --decode 1x" + out("g.h5"), "--decode");
  expect_refused("run --config tiny --tokens 8 --mode resume --prefix 4 --resume-replay 2x" + out("g.h5"),
                 "--resume-replay");
  expect_refused("oracle --config tiny --tokens 256 300x", "--tokens");
  expect_refused("oracle --config tiny --prefix 16x", "--prefix");
  expect_refused("spans --config tiny --tokens 5x", "--tokens");
  expect_refused("replay-error --config tiny --tokens 8x" + out("re"), "--tokens");
  expect_refused("replay-error --config tiny --prefix 4x" + out("re"), "--prefix");
  expect_refused("bench --config tiny --repeat 2x", "--repeat");
  EXPECT_FALSE(fs::exists(scratch() / "g.h5"));
}

TEST(CliInput, IntegerOptionsRefuseOtherBasesAndSpaces) {
  expect_refused("run --config tiny --tokens 0x10" + out("g.h5"), "--tokens: '0x10' is not a decimal integer");
  expect_refused("run --config tiny --tokens ' 5'" + out("g.h5"), "--tokens");
  expect_refused("run --config tiny --tokens +5" + out("g.h5"), "--tokens");
  expect_refused("run --config tiny --tokens 1e3" + out("g.h5"), "--tokens");
}

TEST(CliInput, LeadingZerosAreDecimalNotOctal) {
  // CLI11's own conversion (strtoll, base 0) reads "010" as 8.
  const Result r = run_ced("run --config tiny --tokens 010" + out("ten.h5"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("N = 10,"), std::string::npos) << r.out;
}

TEST(CliInput, IntegerOptionsRefuseOutOfRangeValues) {
  expect_refused("run --config tiny --tokens 0" + out("g.h5"), "--tokens");
  expect_refused("run --config tiny --tokens -3" + out("g.h5"), "--tokens");
  expect_refused("run --config tiny --tokens 1073741825" + out("g.h5"), "--tokens");  // 2^30 + 1
  expect_refused("run --config tiny --tokens 99999999999999999999" + out("g.h5"), "--tokens: 99999999999999999999 is outside [1, 1073741824]");
  expect_refused("run --config tiny --tokens 8 --decode -1" + out("g.h5"), "--decode");
  expect_refused("run --config tiny --tokens 8 --mode resume --prefix -2" + out("g.h5"), "--prefix");
  expect_refused("oracle --config tiny --tokens 0", "--tokens");
  expect_refused("replay-error --config tiny --decode 0" + out("re"), "--decode");
  expect_refused("bench --config tiny --repeat 0", "--repeat");
  expect_refused("bench --config tiny --tokens 0", "--tokens");
  // inside the grammar's range but past what the §7 int64 FLOP counts of the
  // config hold: refused, not an internal error; a long length that fits is analysed
  expect_refused("oracle --config tiny --tokens 1073741824", "--tokens: N = 1073741824 is too long for config tiny");
  expect_accepted("oracle --config tiny --tokens 134217728");
}

TEST(CliInput, SeedsAreUnsigned64BitDecimals) {
  expect_refused("run --config tiny --tokens 5 --weight-seed -1" + out("g.h5"), "--weight-seed: -1 is outside [0, 18446744073709551615]");
  expect_refused("run --config tiny --tokens 5 --weight-seed 18446744073709551616" + out("g.h5"), "--weight-seed");
  expect_refused("run --config tiny --tokens 5 --token-seed 7x" + out("g.h5"), "--token-seed");
  expect_refused("run --config tiny --tokens 5 --token-seed 0x7" + out("g.h5"), "--token-seed");
  expect_refused("spans --config tiny --weight-seed 1.5", "--weight-seed");
  const Result r = run_ced("run --config tiny --tokens 5 --weight-seed 18446744073709551615" + out("max-seed.h5"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("weight_seed 18446744073709551615"), std::string::npos) << r.out;
}

// ---- replay K, words --------------------------------------------------------

TEST(CliInput, ReplayCountRefusesGarbageZeroNegativeAndOverflow) {
  for (const char* k : {"13x", "0", "-1", "1.5", "+3", "99999999999999999999", "boundedx", " 13"})
    expect_refused(std::string("run --config tiny --tokens 20 --mode ced --replay '") + k + "'" + out("g.h5"),
                   "--replay: ");
  expect_accepted("run --config tiny --tokens 20 --mode ced --replay 13" + out("k13.h5"));
}

TEST(CliInput, WordOptionsAcceptOnlyTheirWords) {
  expect_refused("run --config tiny --tokens 5 --mode cedx" + out("g.h5"), "--mode");
  expect_refused("run --config tiny --tokens 5 --capture layersx" + out("g.h5"), "--capture");
  expect_refused("run --config tiny --tokens 5 --logits lastx" + out("g.h5"), "--logits");
  // a wrong backend name is refused while parsing, listing every name of the registry
  expect_refused("run --config tiny --tokens 5 --backend referencex" + out("g.h5"),
                 "--backend: 'referencex' is not one of reference, reference-f64, cuda, cuda-bf16");
  expect_refused("gate --backend reference-f64x", "--backend: 'reference-f64x' is not one of");
  expect_refused("bench --config tiny --backend reference --backend cudax", "--backend");
  expect_refused("replay-error --config tiny --backend nope" + out("re"), "--backend");
  expect_accepted("run --config tiny --tokens 5 --mode ced --capture layers --logits last" + out("words.h5"));
}

TEST(CliInput, EmptyValuesAreRefusedWhereTheyWouldMeanNotGiven) {
  expect_refused("run --config tiny --tokens 20 --mode ced --replay ''" + out("g.h5"), "--replay");
  expect_refused("run --config tiny --tokens 8 --mode resume --prefix 4 --cache-in ''" + out("g.h5"), "--cache-in");
  expect_refused("run --config tiny --tokens 8 --cache-out ''" + out("g.h5"), "--cache-out");
  expect_refused("gate --only ''", "--only");
  expect_refused("gate --policy ''", "--policy");
  EXPECT_FALSE(fs::exists(scratch() / "g.h5"));
}

// ---- --set KEY=VALUE --------------------------------------------------------

TEST(CliInput, SetRefusesTrailingGarbageAndEmptyListItems) {
  const std::string run = "run --config tiny --tokens 5 --set ";
  expect_refused(run + "window=4x" + out("g.h5"), "window: '4x' is not an integer");
  expect_refused(run + "window=" + out("g.h5"), "window: '' is not an integer");
  expect_refused(run + "window" + out("g.h5"), "--set: 'window' is not KEY=VALUE");
  expect_refused(run + "rope_theta=1e4x" + out("g.h5"), "rope_theta: '1e4x' is not a number");
  expect_refused(run + "compress_ratios=0,2,2,2,1,1,1,1," + out("g.h5"), "compress_ratios: '' is not an integer");
  expect_refused(run + "compress_ratios=0,2,2,,2,1,1,1,1" + out("g.h5"), "compress_ratios: '' is not an integer");
  expect_refused(run + "tie_decoder_kv=truex" + out("g.h5"), "tie_decoder_kv: must be true or false");
  expect_refused(run + "mystery=1" + out("g.h5"), "mystery: unknown key");
  EXPECT_FALSE(fs::exists(scratch() / "g.h5"));
  expect_accepted(run + "compress_ratios=0,2,2,2,1,1,1,1 --set window=4" + out("set.h5"));
}

// ---- --only FILE:RUN ---------------------------------------------------------

TEST(CliInput, GateOnlyRefusesEmptyPartsAndUnknownRuns) {
  expect_refused("gate --only tiny.h5:", "--only: 'tiny.h5:' is not FILE or FILE:RUN");
  expect_refused("gate --only :full", "--only: ':full' is not FILE or FILE:RUN");
  expect_refused("gate --only tiny.h5:nosuch", "--only: 'tiny.h5:nosuch' matches no golden run");
  expect_refused("gate --only nosuch.h5", "--only");
  expect_accepted("gate --only tiny.h5:full");
}

// ---- --cache-in: the cache must belong to the run ---------------------------

class CacheIn : public ::testing::Test {
 protected:
  // A resume of 12 tokens from a prefix of 6 (tiny, weight seed 0, token seed 0).
  static void SetUpTestSuite() {
    const Result r = run_ced("run --config tiny --tokens 12 --mode resume --prefix 6 --cache-out " + cache().string() +
                             out("with-cache.h5"));
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static fs::path cache() { return scratch() / "prefix6.cache.h5"; }
  static std::string resume(const std::string& extra) {
    return "run --config tiny --mode resume --cache-in " + cache().string() + " " + extra + out("resumed.h5");
  }
};

TEST_F(CacheIn, CacheOfTheSameModelAndPromptIsUsedAndGivesTheSameLogits) {
  expect_accepted(resume("--tokens 12 --prefix 6"));
  const Result d = run_ced("diff " + (scratch() / "resumed.h5").string() + " " + (scratch() / "with-cache.h5").string());
  EXPECT_EQ(d.code, 0) << d.out << d.err;
  // a longer prompt with the same first 6 tokens (the same token seed) resumes from it too
  expect_accepted(resume("--tokens 14 --prefix 6"));
}

TEST_F(CacheIn, CacheOfAnotherConfigIsRefusedNamingTheKey) {
  expect_refused(resume("--tokens 12 --prefix 6 --set rope_theta=20000"),
                 "was written for another config: rope_theta is 10000 in the cache, 20000 in this run");
}

TEST_F(CacheIn, CacheOfAnotherWeightSeedIsRefusedNamingBoth) {
  expect_refused(resume("--tokens 12 --prefix 6 --weight-seed 1"), "was written for weight seed 0, this run uses 1");
}

TEST_F(CacheIn, CacheOfAnotherPromptIsRefusedNamingTheFirstDifferentToken) {
  const Result r = run_ced(resume("--tokens 12 --prefix 6 --token-seed 1"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("was computed from another prompt: token 0 at position 0 is "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(token seed 0 in the cache, 1 in this run)"), std::string::npos) << r.err;
}

// Every prefix token is compared, the last one (P - 1) too: a cache whose
// recorded prompt differs from the run's only at position 5 of 6 is refused.
TEST_F(CacheIn, CacheWhosePromptDiffersOnlyInTheLastPrefixTokenIsRefused) {
  const fs::path other = scratch() / "last-token.cache.h5";
  fs::copy_file(cache(), other, fs::copy_options::overwrite_existing);
  hid_t f = H5Fopen(other.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t d = H5Dopen2(f, "/inputs/tokens", H5P_DEFAULT);
  ASSERT_GE(d, 0);
  std::vector<int32_t> tokens(6);
  ASSERT_GE(H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data()), 0);
  tokens[5] = (tokens[5] + 1) % 97;  // tiny's vocabulary
  ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data()), 0);
  // An explicit prompt (not the token seed's), so the loader takes it as written and the run's
  // identity check is the one that must refuse it.
  hid_t a = H5Aopen(d, "tokens_explicit", H5P_DEFAULT);
  ASSERT_GE(a, 0);
  const int64_t yes = 1;
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &yes), 0);
  H5Aclose(a);
  H5Dclose(d);
  H5Fclose(f);
  expect_refused("run --config tiny --mode resume --tokens 12 --prefix 6 --cache-in " + other.string() + out("x.h5"),
                 "was computed from another prompt: token");
  // ... and names position 5, the only one that differs
  const Result r = run_ced("run --config tiny --mode resume --tokens 12 --prefix 6 --cache-in " + other.string() + out("x.h5"));
  EXPECT_NE(r.err.find("at position 5 is"), std::string::npos) << r.err;
}

// Both ways, and by --cache-in's own check, naming the file: the backend's
// check of the cache (models/lab/schedule.hpp check_cache) words its refusal
// "cache: holds a prefix ...", so a --cache-in that let a prefix through would
// still exit 2 there, with no file named.
TEST_F(CacheIn, CacheOfALongerPrefixThanTheRunsIsRefusedNamingTheFile) {
  expect_refused(resume("--tokens 12 --prefix 5"),
                 "--cache-in: '" + cache().string() + "' holds a prefix of 6 tokens, --prefix is 5");
}

TEST_F(CacheIn, CacheOfAShorterPrefixThanTheRunsIsRefusedNamingTheFile) {
  expect_refused(resume("--tokens 12 --prefix 7"),
                 "--cache-in: '" + cache().string() + "' holds a prefix of 6 tokens, --prefix is 7");
  // the run's whole prompt as its prefix, with the cache's 6 tokens at its start
  expect_refused(resume("--tokens 12 --prefix 12"),
                 "--cache-in: '" + cache().string() + "' holds a prefix of 6 tokens, --prefix is 12");
}

// A resume has no default prefix: without --prefix it is refused before the
// cache is read (the prefix is never taken from the cache).
TEST_F(CacheIn, ResumeFromACacheWithoutPrefixIsRefused) {
  expect_refused(resume("--tokens 12"), "--prefix: P must satisfy 0 <= P <= N = 12 (got -1)");
}

TEST_F(CacheIn, CacheInOutsideResumeIsRefused) {
  expect_refused("run --config tiny --tokens 12 --mode ced --cache-in " + cache().string() + out("x.h5"),
                 "--cache-in: only a resume");
}

TEST_F(CacheIn, CacheFileWithoutItsPromptIsRefusedWithAClearMessage) {
  const fs::path old = scratch() / "old.cache.h5";
  fs::copy_file(cache(), old, fs::copy_options::overwrite_existing);
  hid_t f = H5Fopen(old.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "/inputs/tokens", H5P_DEFAULT), 0);
  H5Fclose(f);
  expect_refused("run --config tiny --mode resume --tokens 12 --prefix 6 --cache-in " + old.string() + out("x.h5"),
                 "the cache file predates recorded prompts");
}

TEST_F(CacheIn, RunFileGivenAsACacheIsRefused) {
  expect_refused("run --config tiny --mode resume --tokens 12 --prefix 6 --cache-in " +
                     (scratch() / "with-cache.h5").string() + out("x.h5"),
                 "with-cache.h5': /: attribute 'weight_seed' is missing");
}
