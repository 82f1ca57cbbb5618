#pragma once
// An HDF5 file written atomically or read with its name in every error: shared by the run and cache
// files (models/lab/hdf5_files.cpp) and the model families' own files (models/v41/run_file.cpp). Like
// h5_util.hpp, for the writers and readers of files, not for their users.
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <new>
#include <string>

#include "io/h5_util.hpp"
#include "model/error.hpp"

namespace ced::h5 {

// Runs `body` on a fresh temporary file next to `path`, then renames it into
// place. On any failure the temporary file is removed and an existing file at
// `path` is left as it was.
template <class Body>
void write_atomically(const std::filesystem::path& path, Body&& body) {
  quiet_errors();
  auto error = [&](const std::string& why) {
    return InputError(fmt::format("cannot write '{}': {}", path.string(), why));
  };
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw error(fmt::format("directory '{}' does not exist", dir.string()));
  if (std::filesystem::is_directory(path, ec)) throw error("is a directory");
  if (::access(dir.c_str(), W_OK) != 0) throw error(fmt::format("directory '{}' is not writable", dir.string()));
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path tmp = dir / fmt::format("{}.tmp.{}.{}", path.filename().string(), ::getpid(), counter++);
  try {
    Handle file = create_file(tmp);
    body(file.get());
    close_file(file);
    std::filesystem::rename(tmp, path);
  } catch (const InputError& e) {
    std::filesystem::remove(tmp, ec);
    throw error(e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    std::filesystem::remove(tmp, ec);
    throw error(e.code().message());
  } catch (...) {
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

// Runs `body` on the opened file; every InputError gains the file's name.
template <class Body>
auto read_file(const std::filesystem::path& path, Body&& body) {
  quiet_errors();
  try {
    Handle file = open_file_read(path);
    return body(file.get());
  } catch (const InputError& e) {
    throw InputError(fmt::format("cannot read '{}': {}", path.string(), e.what()));
  } catch (const std::bad_alloc&) {
    throw InputError(fmt::format("cannot read '{}': out of memory (corrupt shape?)", path.string()));
  }
}

}  // namespace ced::h5
