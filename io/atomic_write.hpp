#pragma once
// Writes `bytes` to `path` atomically: a temporary file in the target's
// directory, then a rename (docs/spec.md §9), so a failed write leaves no file
// and an old file untouched. InputError "cannot write 'F'[: why]".
#include <filesystem>
#include <string>

namespace ced {

void write_bytes_atomically(const std::filesystem::path& path, const std::string& bytes);

}  // namespace ced
