#pragma once
// The `ced` command line: parses argv (argv[0] the program's name), runs one subcommand, returns its exit code
// (0 pass, 1 a check failed, 2 bad usage or input, 3 an internal error). Prints to stdout and stderr.
namespace ced::tools {
int cli_main(int argc, char** argv);
}  // namespace ced::tools
