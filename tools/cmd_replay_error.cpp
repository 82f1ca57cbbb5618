// `ced replay-error` (docs/spec.md §10): the bounded-vs-exact drift sweep, written as
// PREFIX.csv, PREFIX.h5 and PREFIX.svg.
#include <fmt/format.h>
#include <unistd.h>

#include "models/lab/hdf5_files.hpp"
#include "model/error.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"
#include "checks/replay_sweep.hpp"

namespace ced::tools {
using prop::drift_csv;
using prop::drift_svg;
using prop::drift_table;
using prop::replay_sweep;
using prop::SweepOptions;

Runner add_replay_error(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    SweepOptions sweep;
    std::string out;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("replay-error", "sweep N, decode steps and resume prefixes: bounded replay vs exact");
  o->model.add(sub);
  sub->add_option("--tokens", o->sweep.lengths, "prompt lengths N (default W..64W and the lengths around R)")
      ->transform(integer_in(1, kMaxLength));
  sub->add_option("--decode", o->sweep.decode, "decode steps per length")->capture_default_str()->transform(integer_in(1, kMaxLength));
  sub->add_option("--prefix", o->sweep.prefixes, "resume prefixes P (default W/2, W, W+1, 2W, 4W)")
      ->transform(integer_in(0, kMaxLength));
  sub->add_option("--backend", o->sweep.backend, "backend")->capture_default_str()->transform(backend_name());
  sub->add_option("--out", o->out, "output prefix: writes PREFIX.csv, PREFIX.h5, PREFIX.svg")->required();
  auto v41 = std::make_shared<V41ReplayErrorOptions>();
  sub->add_option("--regime", v41->regime, "v41: release | bf16 | f64 (docs/v41.md §8.1)")->capture_default_str();
  sub->add_option("--convention", v41->convention, "v41: the replay convention (docs/v41.md §13.1)")->capture_default_str();
  return {sub, [o, v41, sub] {
            if (names_v41_family(o->model.config)) {
              v41->prefixes = o->sweep.prefixes;
              if (sub->count("--backend") || sub->count("--set"))
                throw InputError("--backend and --set are the lab family's; the v41 sweep runs its reference");
              v41->config = o->model.config;
              v41->lengths = o->sweep.lengths;
              v41->decode = o->sweep.decode;
              v41->weight_seed = o->model.weight_seed;
              v41->token_seed = o->model.token_seed;
              v41->out = o->out;
              return replay_error_v41(*v41);
            }
            if (sub->count("--regime") || sub->count("--convention"))
              throw InputError("--regime and --convention are the v41 family's");
            const Config c = o->model.load();
            o->sweep.weight_seed = o->model.weight_seed;
            o->sweep.token_seed = o->model.token_seed;
            // --tokens and --decode are >= 1 by their grammar (integer_in above).
            // Fail on an unwritable prefix before minutes of work.
            const std::string probe = fmt::format("{}.probe.{}", o->out, ::getpid());
            write_text_atomically(probe, "");
            std::remove(probe.c_str());
            std::printf("ced replay-error: config %s, weight_seed %llu, token_seed %llu, backend %s\n", c.name.c_str(),
                        (unsigned long long)o->model.weight_seed, (unsigned long long)o->model.token_seed,
                        o->sweep.backend.c_str());
            Stopwatch sw;
            const bool tty = isatty(2);
            const auto rows = replay_sweep(c, o->sweep, [&](int64_t done, int64_t total, const std::string& what) {
              const int width = 30, fill = int(width * done / std::max<int64_t>(total, 1));
              std::fprintf(stderr, "%s[%s%s] %lld/%lld %6.1fs %s%s", tty ? "\r" : "", std::string(size_t(fill), '#').c_str(),
                           std::string(size_t(width - fill), '.').c_str(), (long long)done, (long long)total,
                           sw.seconds(), what.c_str(), tty ? "\033[K" : "\n");
            });
            if (tty) std::fprintf(stderr, "\n");
            write_text_atomically(o->out + ".csv", drift_csv(rows));
            TableFile t;
            t.generator = fmt::format("ced replay-error (ced-harness {})", CED_VERSION);
            t.config = c;
            t.attrs = {{"kind_legend", "0 prefill, 1 layer, 2 decode, 3 resume, 4 resume-decode"},
                       {"backend", o->sweep.backend},
                       {"weight_seed", std::to_string(o->model.weight_seed)},
                       {"token_seed", std::to_string(o->model.token_seed)}};
            const std::vector<std::string> kinds = {"prefill", "layer", "decode", "resume", "resume-decode"};
            std::vector<double> kind, n, b, p, l, s, rel, mabs, kl, top1, ex;
            for (const auto& r : rows) {
              kind.push_back(double(std::find(kinds.begin(), kinds.end(), r.kind) - kinds.begin()));
              n.push_back(double(r.n_prompt));
              b.push_back(double(r.replay));
              p.push_back(double(r.prefix));
              l.push_back(double(r.layer));
              s.push_back(double(r.step));
              rel.push_back(r.rel_l2);
              mabs.push_back(r.max_abs);
              kl.push_back(r.kl);
              top1.push_back(r.top1);
              ex.push_back(r.exact ? 1 : 0);
            }
            t.columns = {{"kind", kind},   {"n_prompt", n}, {"replay", b}, {"prefix", p},     {"layer", l},
                         {"step", s},      {"rel_l2", rel}, {"max_abs", mabs}, {"kl", kl}, {"top1", top1},
                         {"bitwise_exact", ex}};
            write_table_file(o->out + ".h5", t);
            write_text_atomically(o->out + ".svg",
                                  drift_svg(rows, fmt::format("CED bounded replay drift, config {}", c.name)));
            std::fputs(drift_table(rows).c_str(), stdout);
            std::printf("wrote %s.csv, %s.h5, %s.svg (%.1f s)\n", o->out.c_str(), o->out.c_str(), o->out.c_str(),
                        sw.seconds());
            return 0;
          }};
}

}  // namespace ced::tools
