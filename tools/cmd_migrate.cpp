// `ced migrate IN OUT` (docs/spec.md §9.1, docs/v41.md §12.2): a run file of an earlier version of the harness's
// one format (io/file_identity.hpp) rewritten in the current one by its family's own reader and writer, every
// value bit for bit (each writer stores every value exactly). The committed golden files are read as they are;
// this is for a user's files and for anyone who wants one version on disk.
#include <fmt/format.h>

#include <cstdio>

#include "io/file_identity.hpp"
#include "io/untrusted.hpp"
#include "models/lab/hdf5_files.hpp"
#include "model/error.hpp"
#include "models/v41/run_file.hpp"
#include "tools/common.hpp"

namespace ced::tools {

Runner add_migrate(CLI::App& app) {
  struct Opts {
    std::string in, out;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("migrate", "rewrite a run file of either family in the current file format version, "
                                            "every value bit for bit");
  sub->add_option("in", o->in, "the run file to read")->required()->check(non_empty());
  sub->add_option("out", o->out, "the file to write (atomically)")->required()->check(non_empty());
  return {sub, [o] {
            const std::string family = untrusted_file_family(o->in);
            if (family.empty())
              throw InputError(fmt::format("{}: not a file of this harness (no readable root attribute 'format')", o->in));
            if (family == "v41") {
              v41::V41RunFile f = v41::read_untrusted_v41_run_file(o->in);
              v41::write_v41_run_file(o->out, f);
            } else {
              write_run_file(o->out, read_untrusted_run_file(o->in));
            }
            std::printf("wrote %s: the %s family's run file, format %s version %lld\n", o->out.c_str(), family.c_str(),
                        std::string(kFileFormat).c_str(), (long long)kFileFormatVersion);
            return 0;
          }};
}

}  // namespace ced::tools
