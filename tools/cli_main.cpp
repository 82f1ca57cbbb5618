// `ced`'s command line as a function (docs/spec.md §10), so the `ced` binary and the Python package's `ced`
// command (python/ced/cli.py, through ced._core) run the same code. Exit codes: 0 pass (or help, or
// --version), 1 a check failed, 2 bad usage or input, or a request the backend does not support (one line on
// stderr), 3 an internal error (one line on stderr).
#include "tools/cli_main.hpp"

#include <fmt/format.h>

#include <cstdio>

#include "model/error.hpp"
#include "tools/common.hpp"

namespace ced::tools {

int cli_main(int argc, char** argv) {
  CLI::App app{"ced: verification harness for CED (causal encoder-decoder) prefill"};
  app.set_version_flag("--version", std::string("ced ") + CED_VERSION, "print the harness's version and exit");
  app.require_subcommand(1);
  const Runner runners[] = {add_verify(app), add_run(app),   add_diff(app),
                            add_gate(app),   add_oracle(app), add_spans(app),
                            add_replay_error(app), add_golden(app), add_bench(app),
                            add_export(app), add_replay_budget(app), add_merge(app),
                            add_cache_hit(app), add_migrate(app)};
  auto is_command = [&](const std::string& name) {
    for (const Runner& r : runners)
      if (r.sub->get_name() == name) return true;
    return false;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (argc > 1 && argv[1][0] != '-' && !is_command(argv[1])) {
      std::string names;
      for (const Runner& r : runners) names += (names.empty() ? "" : ", ") + r.sub->get_name();
      std::fprintf(stderr, "ced: error: unknown command '%s' (commands: %s)\n", argv[1], names.c_str());
      return 2;
    }
    std::fprintf(stderr, "ced: error: %s (see ced --help)\n", e.what());
    return 2;
  }
  try {
    for (const Runner& r : runners)
      if (r.sub->parsed()) return r.run();
  } catch (const InputError& e) {
    std::fprintf(stderr, "ced: error: %s\n", e.what());
    return 2;
  } catch (const NotSupported& e) {
    std::fprintf(stderr, "ced: not supported: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ced: internal error: %s\n", e.what());
    return 3;
  }
  return 2;
}

}  // namespace ced::tools
