// `ced` as the Python package runs it (python/ced/cli.py): the binary's own cli_main, in this process.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "model/data_root.hpp"
#include "tools/cli_main.hpp"

namespace py = pybind11;

void bind_cli(py::module_& m) {
  m.attr("__version__") = CED_VERSION;
  m.def(
      "cli_main",
      [](const std::vector<std::string>& args) {
        std::vector<std::string> owned = args;
        std::vector<char*> argv;
        for (std::string& a : owned) argv.push_back(a.data());
        argv.push_back(nullptr);
        int rc = 0;
        {
          // The commands spend minutes in C++ and call back into no Python: other threads may run meanwhile.
          py::gil_scoped_release release;
          rc = ced::tools::cli_main(static_cast<int>(owned.size()), argv.data());
          std::fflush(stdout);
          std::fflush(stderr);
        }
        return rc;
      },
      py::arg("argv"), "Runs the `ced` command line on argv (argv[0] the program's name); returns its exit code.");
  m.def("set_data_root", [](const std::string& dir) { ced::set_data_root(dir); }, py::arg("dir"),
        "Where the installed package keeps golden/, scripts/ and tools/ (the package sets it at import).");
  m.def("data_root", [] { return ced::data_root().string(); });
}
