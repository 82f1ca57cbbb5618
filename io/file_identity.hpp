#pragma once
// The harness's one HDF5 file format, shared by both model families (docs/spec.md §9.1, docs/v41.md §12.2): the
// root attributes `format = "ced-harness"`, `format_version`, `family` ("lab" | "v41") and `generator` say what
// a file is; below the root each family lays out its own runs. Version 3 added `family`. Files of earlier
// versions are read as they were written: a "ced-harness" file of version 1 or 2 is the lab family's, and the
// v41 family's own former format ("ced-v41-run", version 1: every golden file of the release) is the v41
// family's. `ced migrate` rewrites either into the current version, every value bit for bit.
#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace ced {

inline constexpr std::string_view kFileFormat = "ced-harness";
inline constexpr int64_t kFileFormatVersion = 3;
// The v41 family's format before the two were one (version 1 only).
inline constexpr std::string_view kV41FormerFormat = "ced-v41-run";

struct FileIdentity {
  std::string format;     // the root attribute as found
  int64_t version = 0;    // format_version
  std::string family;     // "lab" | "v41" (from the attribute, or from an earlier version's format)
  std::string generator;  // "" when absent
};

// The root attributes of an open file. InputError naming "/" when `format` is missing, is another format, or
// names a family that is not "lab" or "v41"; the version is checked by the family's reader.
FileIdentity read_file_identity(hid_t file);
// The current version's root attributes.
void write_file_identity(hid_t file, std::string_view family, const std::string& generator);
// The family of a user's file, probed in a forked child (io/untrusted.hpp); "" when it cannot be read or is not
// a file of this harness (the caller's reader then says why).
std::string untrusted_file_family(const std::filesystem::path& path);

}  // namespace ced
