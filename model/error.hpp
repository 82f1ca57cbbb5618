#pragma once
// Errors that cross the boundary of the harness. InputError is bad input:
// the command line turns it into one clear line on stderr and exit code 2.
#include <stdexcept>
#include <string>

namespace ced {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A backend cannot do what was asked (e.g. no CUDA device): reported as
// "not supported", never as a failure.
struct NotSupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace ced
