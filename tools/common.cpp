#include "tools/common.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <limits>
#include <sstream>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/atomic_write.hpp"
#include "model/error.hpp"
#include "models/family.hpp"

namespace ced::tools {

namespace {

// Decimal digits only: from_chars takes a leading '-' for signed types and
// nothing else (no '+', no spaces, no base prefix).
bool all_digits(std::string_view s) {
  if (!s.empty() && s.front() == '-') s.remove_prefix(1);
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

template <class T>
CLI::Validator whole_integer(T lo, T hi, const std::string& desc) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        T v{};
        if (all_digits(text) && text.front() == '-' && std::is_unsigned_v<T>)
          return fmt::format("{} is outside [{}, {}]", text, lo, hi);
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (!all_digits(text) || (ec != std::errc() && ec != std::errc::result_out_of_range) ||
            end != text.data() + text.size())
          return fmt::format("'{}' is not a decimal integer", text);
        if (ec == std::errc::result_out_of_range || v < lo || v > hi)
          return fmt::format("{} is outside [{}, {}]", text, lo, hi);
        text = std::to_string(v);  // canonical: no leading zeros for CLI11's base-0 strtoll
        return "";
      },
      desc);
}

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return whole_integer<int64_t>(lo, hi, fmt::format("INT in [{}, {}]", lo, hi));
}

CLI::Validator unsigned_integer() {
  return whole_integer<uint64_t>(0, std::numeric_limits<uint64_t>::max(), "UINT64");
}

CLI::Validator non_empty() {
  return CLI::Validator([](std::string& text) -> std::string { return text.empty() ? "must not be empty" : ""; },
                        "TEXT");
}

void refuse_given(const CLI::App* sub, std::initializer_list<const char*> options, const std::string& why) {
  for (const char* o : options)
    if (sub->count(o) > 0) throw InputError(fmt::format("{}: {}", o, why));
}

CLI::Validator backend_name() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        for (const auto& n : backend_names())
          if (name == n) return "";
        std::string names;
        for (const auto& n : backend_names()) names += (names.empty() ? "" : ", ") + n;
        return fmt::format("'{}' is not one of {}", name, names);
      },
      "BACKEND");
}

void ModelOptions::add(CLI::App* sub, bool config_required) {
  auto* o = sub->add_option("--config", config, fmt::format("built-in name ({}) or TOML file", fmt::join(builtin_names(), ", ")));
  if (config_required) o->required();
  sub->add_option("--weight-seed", weight_seed, "weight_seed of docs/spec.md §2")->capture_default_str()->transform(unsigned_integer());
  sub->add_option("--token-seed", token_seed, "token_seed of docs/spec.md §2")->capture_default_str()->transform(unsigned_integer());
  sub->add_option("--set", set, "override a config key, KEY=VALUE (repeatable), e.g. --set window=64");
}

Config load_lab_config(const std::string& arg) {
  const ModelFamily& f = family_of_config(arg);
  if (f.name != "lab") {
    const std::vector<std::string> backends = backend_names_of_family(f.name);
    throw InputError(fmt::format("--config {}: a config of the {} model family ({}), which {}; the lab family's "
                                 "built-ins are {}",
                                 arg, f.name, f.spec,
                                 backends.empty() ? "has no backend in this build yet"
                                                  : fmt::format("runs on {}", fmt::join(backends, ", ")),
                                 fmt::join(model_family("lab").builtins, ", ")));
  }
  return load_config(arg);
}

Config ModelOptions::load() const {
  Config c = load_lab_config(config);
  for (const auto& kv : set) c = with_override(c, kv);
  return c;
}

void write_text_atomically(const std::string& path, const std::string& text) { write_bytes_atomically(path, text); }

std::string first_config_difference(const Config& x, const Config& y, const std::string& x_name,
                                    const std::string& y_name) {
  std::istringstream a(to_toml(x)), b(to_toml(y));
  for (std::string la, lb; std::getline(a, la) && std::getline(b, lb);) {
    if (la == lb) continue;
    const auto eq = la.find(" = ");
    return fmt::format("{} is {} in {}, {} in {}", la.substr(0, eq), la.substr(eq + 3), x_name,
                       lb.substr(lb.find(" = ") + 3), y_name);
  }
  return "";
}

double process_cpu_seconds() { return double(std::clock()) / CLOCKS_PER_SEC; }

void check_writable(const std::string& out) {
  const std::string probe = fmt::format("{}.probe.{}", out, ::getpid());
  write_text_atomically(probe, "");
  std::remove(probe.c_str());
}

int run_program(const std::vector<std::string>& args, bool quiet) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  if (quiet) {
    ::posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    ::posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  pid_t pid = 0;
  const bool started = argv.size() >= 2 && ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0;
  ::posix_spawn_file_actions_destroy(&actions);
  if (!started) return 127;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace ced::tools
