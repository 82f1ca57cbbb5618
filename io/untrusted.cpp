// Untrusted HDF5 files read in a forked child; see untrusted.hpp.
#include "io/untrusted.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <new>

#include "model/error.hpp"

// RLIMIT_AS cannot be combined with AddressSanitizer, which reserves terabytes
// of shadow memory up front; sanitizer builds keep the time limit only.
#if defined(__SANITIZE_ADDRESS__)
#define CED_LIMIT_ADDRESS_SPACE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define CED_LIMIT_ADDRESS_SPACE 0
#endif
#endif
#ifndef CED_LIMIT_ADDRESS_SPACE
#define CED_LIMIT_ADDRESS_SPACE 1
#endif

namespace ced {
namespace {

namespace fs = std::filesystem;

// Bytes of address space this process has mapped (a fork inherits them all).
uint64_t mapped_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * uint64_t(::sysconf(_SC_PAGESIZE));
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += size_t(n);
  }
}

// The child: limits, the body, one tagged answer on the pipe, _exit (never
// exit(): the parent's stdio buffers and atexit handlers are not the child's).
[[noreturn]] void child(int fd, const IsolationLimits& limits, uint64_t inherited,
                        const std::function<std::string()>& body) {
  ::signal(SIGALRM, SIG_DFL);
  ::signal(SIGPIPE, SIG_DFL);
  const rlimit no_core{0, 0};  // a crash of the library is expected here, not worth a core file
  ::setrlimit(RLIMIT_CORE, &no_core);
#if CED_LIMIT_ADDRESS_SPACE
  if (limits.extra_bytes > 0) {
    const rlimit as{rlim_t(inherited + limits.extra_bytes), rlim_t(inherited + limits.extra_bytes)};
    ::setrlimit(RLIMIT_AS, &as);
  }
#else
  (void)inherited;
#endif
  if (limits.seconds > 0) ::alarm(unsigned(std::ceil(limits.seconds)));
  std::string answer;
  try {
    answer = "K" + body();
  } catch (const InputError& e) {
    answer = std::string("E") + e.what();
  } catch (const std::bad_alloc&) {
    answer = "Mout of memory";
  } catch (const std::exception& e) {
    answer = std::string("X") + e.what();
  } catch (...) {
    answer = "Xan exception that is not a std::exception";
  }
  write_all(fd, answer);
  ::close(fd);
  ::_exit(0);
}

std::string signal_text(int sig) {
  const char* name = ::sigabbrev_np(sig);
  return name ? fmt::format("SIG{}", name) : fmt::format("signal {}", sig);
}

// A private directory for the child's copy, removed with everything in it
// (a child killed while writing leaves its temporary file there).
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ced-read-XXXXXX").string();
    if (!::mkdtemp(tmpl.data()))
      throw InputError(fmt::format("cannot create a temporary directory in '{}': {}",
                                   fs::temp_directory_path().string(), std::strerror(errno)));
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Reads the copy the child wrote; its errors name the user's file.
template <class Read>
auto read_copy(const fs::path& user, Read&& read) {
  try {
    return read();
  } catch (const InputError& e) {
    throw InputError(fmt::format("cannot read '{}': its validated copy does not read back: {}", user.string(), e.what()));
  }
}

}  // namespace

IsolationLimits isolation_limits(const fs::path& path) {
  std::error_code ec;
  const uint64_t size = fs::is_regular_file(path, ec) ? uint64_t(fs::file_size(path, ec)) : 0;
  IsolationLimits l;
  l.seconds = 20.0 + double(size) / 20e6;
  l.extra_bytes = (uint64_t(1) << 30) + 16 * size;
  if (const char* env = std::getenv("CED_READ_TIMEOUT_S"); env && *env) {
    char* end = nullptr;
    const double s = std::strtod(env, &end);
    if (end == env || *end != '\0' || !(s > 0) || s > 1e6)
      throw InputError(fmt::format("CED_READ_TIMEOUT_S: '{}' is not a number of seconds in (0, 1e6]", env));
    l.seconds = s;
  }
  return l;
}

std::string run_isolated(const std::string& what, const IsolationLimits& limits,
                         const std::function<std::string()>& body) {
  auto corrupt = [&](const std::string& why) {
    return InputError(fmt::format("cannot read '{}': corrupt or unreadable HDF5 file ({})", what, why));
  };
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw InputError(fmt::format("cannot read '{}': cannot create a pipe: {}", what, std::strerror(errno)));
  std::fflush(nullptr);  // nothing buffered twice
  const uint64_t inherited = mapped_bytes();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw InputError(fmt::format("cannot read '{}': cannot start the reader process: {}", what, std::strerror(err)));
  }
  if (pid == 0) {
    ::close(fds[0]);
    child(fds[1], limits, inherited, body);
  }
  ::close(fds[1]);
  // The parent's own deadline backs up the child's alarm (a child that blocks
  // SIGALRM, or one stuck in the kernel): a few seconds after it, SIGKILL.
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(limits.seconds > 0 ? limits.seconds + 5 : 1e9);
  std::string answer;
  bool killed = false;
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - clock::now()).count();
    if (left <= 0) {
      ::kill(pid, SIGKILL);
      killed = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, int(std::min(left * 1000.0, 60000.0)) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child closed the pipe or died
    answer.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (killed || (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM))
    throw corrupt(fmt::format("the reader ran past the limit of {:g} s", limits.seconds));
  if (WIFSIGNALED(status)) throw corrupt(fmt::format("the reader was killed by {}", signal_text(WTERMSIG(status))));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw corrupt(fmt::format("the reader exited with status {}", WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  if (answer.empty()) throw corrupt("the reader ended without an answer");
  const char tag = answer[0];
  std::string text = answer.substr(1);
  switch (tag) {
    case 'K': return text;
    case 'E': throw InputError(text);
    case 'M':
      throw corrupt(fmt::format("the reader ran out of its {} MiB of memory", limits.extra_bytes >> 20));
    default: throw corrupt(fmt::format("the reader failed: {}", text));
  }
}

std::string read_through_copy(const fs::path& user, const std::function<std::string(const fs::path&)>& write_copy,
                              const std::function<void(const fs::path&)>& read_back) {
  TempDir dir;
  const fs::path copy = dir.path / "copy.h5";
  const std::string kept = run_isolated(user.string(), isolation_limits(user), [&] { return write_copy(copy); });
  read_copy(user, [&] {
    read_back(copy);
    return 0;
  });
  return kept;
}

}  // namespace ced
