#pragma once
// The model families (README "Model families"): the lab model of docs/spec.md, the harness's own
// CED-faithful model, and v41, DeepSeek-V4.1-Flash as released (docs/v41.md). A family owns its config
// schema and built-ins, its weights, its layer plan and its backends; the CED machinery (requests and
// results, modes and replay policies, checks, comparison, files, gate, oracle, CLI) is shared. A --config
// argument names one family: this is the one place that decides which.
#include <string>
#include <string_view>
#include <vector>

namespace ced {

struct ModelFamily {
  std::string name;                   // "lab" | "v41"
  std::string spec;                   // its specification in docs/
  std::vector<std::string> builtins;  // its built-in configs, from its one table
};

// Every family, lab first.
const std::vector<ModelFamily>& model_families();
const ModelFamily& model_family(std::string_view name);  // InputError for an unknown name

// The family a --config argument names: a built-in name of one family (the names are unique across
// families, tested), else a file or folder by its form: a folder or a `.json` file is a v41 checkpoint
// folder or config file, anything else a lab TOML file (whose reader then says what is wrong with it).
const ModelFamily& family_of_config(std::string_view arg);

}  // namespace ced
