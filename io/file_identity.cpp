// The harness's one file format's root attributes; see file_identity.hpp.
#include "io/file_identity.hpp"

#include <fmt/format.h>

#include "io/h5_file_ops.hpp"
#include "io/h5_util.hpp"
#include "io/untrusted.hpp"
#include "model/error.hpp"

namespace ced {

FileIdentity read_file_identity(hid_t file) {
  if (!h5::has_attr(file, "/", "format"))
    throw InputError(fmt::format("/: not a {} file (no root attribute 'format')", kFileFormat));
  FileIdentity id;
  id.format = h5::read_string_attr(file, "/", "format");
  if (id.format != kFileFormat && id.format != kV41FormerFormat)
    throw InputError(fmt::format("/: format is '{}', not '{}'", id.format, kFileFormat));
  id.version = h5::read_int_attr(file, "/", "format_version");
  if (h5::has_attr(file, "/", "family")) id.family = h5::read_string_attr(file, "/", "family");
  else id.family = id.format == kV41FormerFormat ? "v41" : "lab";
  if (id.family != "lab" && id.family != "v41")
    throw InputError(fmt::format("/: family '{}' is not lab or v41", id.family));
  if (h5::has_attr(file, "/", "generator")) id.generator = h5::read_string_attr(file, "/", "generator");
  return id;
}

void write_file_identity(hid_t file, std::string_view family, const std::string& generator) {
  h5::write_string_attr(file, "/", "format", std::string(kFileFormat));
  h5::write_int_attr(file, "/", "format_version", kFileFormatVersion);
  h5::write_string_attr(file, "/", "family", std::string(family));
  h5::write_string_attr(file, "/", "generator", generator);
}

std::string untrusted_file_family(const std::filesystem::path& path) {
  try {
    return run_isolated(path.string(), isolation_limits(path), [&] {
      return h5::read_file(path, [&](hid_t file) { return read_file_identity(file).family; });
    });
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace ced
