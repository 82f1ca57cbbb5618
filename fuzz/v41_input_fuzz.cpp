// Fuzzes the strict reader of a v41 checkpoint folder (read_v41_checkpoint, docs/v41.md §11): a user's
// folder in the release's layout is user input like any other.
//
// The base is v41-tiny as `ced export` writes it (weights of seed 0, shards of 256 kB so the index names
// several), written once per process under $TMPDIR. The input bytes decode (fuzz/byte_reader.hpp) to one of
// its files (the two config files, the index, a shard, the tokenizer files) and one change of it: cut short
// at an offset, bytes overwritten at an offset, the whole file replaced, bytes inserted at an offset, or the
// file removed; the rest of the input is the bytes written. The changed copy is read. A ced::InputError is a
// clean rejection, a folder read whole is fine too (a change the format does not see); any other exception
// or a crash is a finding: printed, then the target traps. CED_FUZZ_VERBOSE=1 prints each case.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <string>
#include <vector>

#include "fuzz/byte_reader.hpp"
#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"

namespace {

namespace fs = std::filesystem;
using ced::fuzz::ByteReader;

struct Base {
  fs::path dir, work;
  std::vector<std::string> files;  // relative to dir
};

const Base& base() {
  static const Base b = [] {
    Base x;
    const fs::path root = fs::temp_directory_path() / fmt::format("ced-v41-input-fuzz-{}", ::getpid());
    x.dir = root / "base";
    x.work = root / "work";
    fs::remove_all(root);
    ced::v41::V41WriteOptions o;
    o.shard_bytes = 256 * 1000;
    x.files = ced::v41::write_v41_checkpoint(
        x.dir, ced::v41::make_v41_random_checkpoint(ced::v41::v41_builtin_config("v41-tiny"), 0), o);
    std::sort(x.files.begin(), x.files.end());
    return x;
  }();
  return b;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "v41_input_fuzz: FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

// The base folder copied afresh. libFuzzer's timer signal (SIGALRM, for -timeout) can interrupt the copy's
// system calls; an interrupted copy is the harness's, not a finding: it starts again.
void copy_base(const fs::path& from, const fs::path& to) {
  for (int attempt = 0;; ++attempt) {
    fs::remove_all(to);
    std::error_code ec;
    fs::copy(from, to, fs::copy_options::recursive, ec);
    if (!ec) return;
    if (ec != std::errc::interrupted || attempt == 100)
      throw fs::filesystem_error("v41_input_fuzz: cannot copy the base folder", from, to, ec);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Base& b = base();
  ByteReader in(data, size);
  const std::string file = in.pick(b.files);
  const int64_t change = in.range(0, 4);
  const uint64_t at_raw = in.u64(4);
  const std::span<const uint8_t> bytes = in.rest();
  copy_base(b.dir, b.work);
  const fs::path target = b.work / file;
  std::string content = slurp(target);
  const size_t at = content.empty() ? 0 : static_cast<size_t>(at_raw % (content.size() + 1));
  const std::string added(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const char* what[] = {"cut at", "overwritten at", "replaced", "inserted at", "removed"};
  if (change == 0) content.resize(at);
  else if (change == 1) content.replace(at, std::min(added.size(), content.size() - at), added);
  else if (change == 2) content = added;
  else if (change == 3) content.insert(at, added);
  if (change == 4) {
    fs::remove(target);
  } else {
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
  }
  const std::string case_line = fmt::format("{} {} {} ({} bytes)", file, what[change], at, added.size());
  try {
    (void)ced::v41::read_v41_checkpoint(b.work);
    if (std::getenv("CED_FUZZ_VERBOSE")) std::printf("%s: read whole\n", case_line.c_str());
  } catch (const ced::InputError& e) {
    if (std::getenv("CED_FUZZ_VERBOSE")) std::printf("%s: %s\n", case_line.c_str(), e.what());
  } catch (const std::exception& e) {
    finding(fmt::format("{}: an exception other than ced::InputError escaped: {}", case_line, e.what()));
  }
  return 0;
}
