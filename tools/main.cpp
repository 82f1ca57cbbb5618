// `ced`: the harness' command line (docs/spec.md §10); tools/cli_main.cpp holds it.
#include "tools/cli_main.hpp"

int main(int argc, char** argv) { return ced::tools::cli_main(argc, argv); }
