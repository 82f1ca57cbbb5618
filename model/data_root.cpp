#include "model/data_root.hpp"

#include <mutex>

namespace ced {
namespace {
std::mutex root_mutex;
std::filesystem::path& installed_root() {
  static std::filesystem::path root;
  return root;
}
}  // namespace

std::filesystem::path data_root() {
  const std::lock_guard<std::mutex> lock(root_mutex);
  const std::filesystem::path& root = installed_root();
  return root.empty() ? std::filesystem::path(CED_SOURCE_TREE) : root;
}

void set_data_root(const std::filesystem::path& dir) {
  const std::lock_guard<std::mutex> lock(root_mutex);
  installed_root() = dir;
}
}  // namespace ced
