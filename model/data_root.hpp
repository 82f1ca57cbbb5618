#pragma once
// Where the harness finds the files it ships beside its code: golden/ (the golden runs, their policies and
// calibration), scripts/ (the official-code capture) and tools/replay-budget.gp. A build from the source tree
// finds them in that tree; the Python package (python/ced) carries a copy as package data and names its folder
// at import, so an installed wheel needs no checkout. CED_GOLDEN_DIR still overrides the golden folder alone
// (golden/golden_set.hpp).
#include <filesystem>

namespace ced {
std::filesystem::path data_root();               // the installed data folder when set, else the source tree
void set_data_root(const std::filesystem::path& dir);  // the Python package's data folder (empty: unset)
}  // namespace ced
