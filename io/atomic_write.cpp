#include "io/atomic_write.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <fstream>

#include "model/error.hpp"

namespace ced {

void write_bytes_atomically(const std::filesystem::path& path, const std::string& bytes) {
  namespace fs = std::filesystem;
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = fs::path(fmt::format("{}.tmp.{}.{}", path.string(), ::getpid(), counter++));
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw InputError(fmt::format("cannot write '{}'", path.string()));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      fs::remove(tmp, ec);
      throw InputError(fmt::format("cannot write '{}'", path.string()));
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw InputError(fmt::format("cannot write '{}': {}", path.string(), ec.message()));
  }
}

}  // namespace ced
