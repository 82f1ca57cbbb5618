#include "tools/common.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "model/error.hpp"

namespace ced::tools {

void ModelOptions::add(CLI::App* sub, bool config_required) {
  auto* o = sub->add_option("--config", config, "built-in name (tiny, small, v41-shape, bench, v41-flash) or TOML file");
  if (config_required) o->required();
  sub->add_option("--weight-seed", weight_seed, "weight_seed of SPEC §2")->capture_default_str();
  sub->add_option("--token-seed", token_seed, "token_seed of SPEC §2")->capture_default_str();
  sub->add_option("--set", set, "override a config key, KEY=VALUE (repeatable), e.g. --set window=64");
}

Config ModelOptions::load() const {
  Config c = load_config(config);
  for (const auto& kv : set) c = with_override(c, kv);
  return c;
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw InputError(fmt::format("cannot write '{}'", path));
    out << text;
    out.close();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw InputError(fmt::format("cannot write '{}'", path));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw InputError(fmt::format("cannot write '{}': {}", path, ec.message()));
  }
}

}  // namespace ced::tools
