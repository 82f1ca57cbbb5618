#include "models/family.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "models/lab/config.hpp"
#include "model/error.hpp"
#include "models/v41/config.hpp"

namespace ced {

const std::vector<ModelFamily>& model_families() {
  // What each family is, and what its config files are, is in the README's "Model families".
  static const std::vector<ModelFamily> families = {
      {"lab", "docs/spec.md", builtin_names()},
      {"v41", "docs/v41.md", v41::v41_builtin_names()},
  };
  return families;
}

const ModelFamily& model_family(std::string_view name) {
  for (const auto& f : model_families())
    if (f.name == name) return f;
  std::vector<std::string> names;
  for (const auto& f : model_families()) names.push_back(f.name);
  throw InputError(fmt::format("model family: unknown '{}' (families: {})", name, fmt::join(names, ", ")));
}

const ModelFamily& family_of_config(std::string_view arg) {
  for (const auto& f : model_families())
    if (std::find(f.builtins.begin(), f.builtins.end(), arg) != f.builtins.end()) return f;
  const std::filesystem::path p(arg);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec) || p.extension() == ".json") return model_family("v41");
  return model_family("lab");
}

}  // namespace ced
