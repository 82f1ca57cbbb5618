#pragma once
// docs/v41.md §13.9: the CED properties on the released architecture, each a check that returns "" when
// it holds and otherwise what broke. `ced verify` runs them on v41-tiny; the fault × check matrix
// (unit-tests/v41_ced_faults_test.cpp) plants a port's bug and names the check that must fail.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reference/v41/forward.hpp"

namespace ced::v41 {

struct V41Check {
  const char* name;
  // On the model (its probe left off, every capture kept after it) and a prompt of n + 1 tokens, the last
  // the decode step's; n must be past the model's spans and leave a hit past the encoder replay span (100
  // on v41-tiny).
  std::function<std::string(V41Model&, const V41EngramHashing&, const std::vector<int64_t>& tokens)> run;
};

// The property suite, in the order `ced verify` prints it: every row replayed is the prefill; a bounded
// replay of a prompt within the window is the prefill; the exact spans found by the probe are the plan's,
// bitwise at them (sglang, vllm, ascend); vLLM keeps layer E's tail exact; a decode step after a ced
// prefill of the decode span is the prefill's; the source-only write is the prefill's cache; a resume after
// a hit of at most W is the cold run (every rule); the encoder replay span makes a resume the cold run.
const std::vector<V41Check>& v41_ced_checks();
// The one named `name` (InputError naming the known ones).
const V41Check& v41_ced_check(const std::string& name);

}  // namespace ced::v41
