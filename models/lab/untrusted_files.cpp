// The lab family's files as a user gives them (io/untrusted.hpp): each read and validated in a forked child,
// the parent reading only the child's copy.
#include <string>

#include "io/untrusted.hpp"
#include "models/lab/hdf5_files.hpp"

namespace ced {

namespace fs = std::filesystem;

RunFile read_untrusted_run_file(const fs::path& path) {
  RunFile f;
  // The child returns what the copy cannot carry: the file's format version (the copy is written in the current
  // one) and its weights dtype.
  const std::string kept = read_through_copy(
      path,
      [&](const fs::path& copy) {
        RunFile user = read_run_file(path);
        const std::string w = user.weights_dtype;
        // The weight tensors stay in the user's file (read_weight); the copy would otherwise regenerate the whole
        // model from weight_seed.
        user.weights_dtype.clear();
        write_run_file(copy, user);
        return std::to_string(user.format_version) + " " + w;
      },
      [&](const fs::path& copy) { f = read_run_file(copy); });
  const size_t space = kept.find(' ');
  f.format_version = std::stoll(kept.substr(0, space));
  f.weights_dtype = kept.substr(space + 1);
  return f;
}

CacheFile read_untrusted_cache_file(const fs::path& path) {
  CacheFile f;
  read_through_copy(
      path,
      [&](const fs::path& copy) {
        write_cache_file(copy, read_cache_file(path));
        return std::string();
      },
      [&](const fs::path& copy) { f = read_cache_file(copy); });
  return f;
}

TableFile read_untrusted_table_file(const fs::path& path, const std::vector<std::string>& attr_names,
                                    const std::vector<std::string>& group_names) {
  TableFile t;
  read_through_copy(
      path,
      [&](const fs::path& copy) {
        write_table_file(copy, read_table_file(path, attr_names, group_names));
        return std::string();
      },
      [&](const fs::path& copy) { t = read_table_file(copy, attr_names, group_names); });
  return t;
}

}  // namespace ced
