// Runs the `ced` binary under test (CED_BINARY, set per test target) the way a
// user does, with stdout and stderr captured through files in a test's scratch
// folder: the one helper of the command-line tests.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ced::test {

struct Result {
  int code = -1;  // the exit status; -1 when ced died of a signal
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch folder of this test process: temp/<prefix>-<pid>, created once.
inline std::filesystem::path scratch_dir(const std::string& prefix) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

// `ced ARGS` through the shell (ARGS may hold redirections and quotes).
inline Result run_ced_in(const std::filesystem::path& scratch, const std::string& args) {
  const std::filesystem::path o = scratch / "stdout", e = scratch / "stderr";
  const std::string cmd = std::string(CED_BINARY) + " " + args + " >" + o.string() + " 2>" + e.string();
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(o);
  r.err = slurp(e);
  return r;
}

}  // namespace ced::test
