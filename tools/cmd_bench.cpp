// `ced bench`: prefill (full, ced bounded) and decode throughput per backend,
// the achieved FLOP rate from the docs/spec.md §7 FLOP model, and the measured
// ced/full time ratio beside the oracle's FLOP ratio.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <thread>

#include "compare/compare.hpp"  // json_string
#include "model/error.hpp"
#include "model/weights.hpp"
#include "oracle/analytic.hpp"
#include "tools/common.hpp"

namespace ced::tools {

Runner add_bench(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    int64_t tokens = 1024, decode = 8, repeat = 1;
    std::vector<std::string> backends = {"reference"};
    std::string json;  // also write the figures here as JSON
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("bench", "throughput of prefill (full, ced bounded) and decode per backend");
  o->model.config = "bench";
  o->model.add(sub, false);
  sub->add_option("--tokens", o->tokens, "prompt length N")->capture_default_str()->transform(integer_in(1, kMaxLength));
  sub->add_option("--decode", o->decode, "decode steps")->capture_default_str()->transform(integer_in(0, kMaxLength));
  sub->add_option("--repeat", o->repeat, "timed repetitions (the best is reported)")
      ->capture_default_str()
      ->transform(integer_in(1, 1000));
  sub->add_option("--backend", o->backends, "backends to measure")->capture_default_str()->transform(backend_name());
  sub->add_option("--json", o->json, "also write every figure to this JSON file (atomically)");
  return {sub, [o] {
            const Config c = o->model.load();
            const Plan p = make_plan(c);
            const int64_t N = o->tokens, K = o->decode;
            if (N < 1 || K < 0 || o->repeat < 1) throw InputError("--tokens >= 1, --decode >= 0, --repeat >= 1");
            std::printf("ced bench: config %s, N = %lld, decode %lld, weight_seed %llu; %u hardware threads\n",
                        c.name.c_str(), (long long)N, (long long)K, (unsigned long long)o->model.weight_seed,
                        std::thread::hardware_concurrency());
            std::printf("%-14s %-12s %10s %12s %12s %10s\n", "backend", "phase", "seconds", "tokens/s", "GFLOP", "GFLOP/s");
            int rc = 0;
            // JSON rows, one per backend and phase, then one summary per backend.
            std::vector<std::string> rows, summaries, unsupported;
            for (const auto& name : o->backends) {
              std::unique_ptr<Backend> be;
              try {
                check_fits_in_memory(c, N + K, name);
                be = make_backend(name, c, o->model.weight_seed);
              } catch (const NotSupported& e) {
                std::printf("%-14s not supported: %s\n", name.c_str(), e.what());
                unsupported.push_back(fmt::format("{{\"backend\": {}, \"why\": {}}}", json_string(name), json_string(e.what())));
                continue;
              }
              // Best of --repeat; prefill and decode times as the backend measured them
              // (weights upload and host set-up excluded).
              auto time_run = [&](RunRequest r, bool decode_phase = false) {
                r.tokens = make_tokens(o->model.token_seed, c.vocab_size, r.n_prompt + r.decode_steps);
                double best = 1e300;
                RunResult res;
                for (int64_t i = 0; i < o->repeat; ++i) {
                  res = be->run(r);
                  best = std::min(best, decode_phase ? res.decode_seconds : res.prefill_seconds);
                }
                return std::make_pair(best, res);
              };
              RunRequest full;
              full.n_prompt = N;
              full.logits = LogitsScope::Last;
              RunRequest ced = full;
              ced.mode = Mode::Ced;
              ced.replay = ReplayPolicy::parse("bounded");
              const auto [tf, rf] = time_run(full);
              const auto [tc, rc2] = time_run(ced);
              // docs/spec.md §7 FLOP model (the reference counts the same; CUDA does not count).
              const RatioFlops model = exact_ratio_flops(c, p, N);
              auto row = [&](const char* phase, double secs, int64_t toks, double flops) {
                std::printf("%-14s %-12s %10.3f %12.1f %12.2f %10.2f\n", name.c_str(), phase, secs, double(toks) / secs,
                            flops / 1e9, flops / secs / 1e9);
                rows.push_back(fmt::format("{{\"backend\": \"{}\", \"phase\": \"{}\", \"seconds\": {:.6g}, "
                                           "\"tokens_per_s\": {:.6g}, \"gflop\": {:.6g}, \"gflops\": {:.6g}}}",
                                           name, phase, secs, double(toks) / secs, flops / 1e9, flops / secs / 1e9));
              };
              row("prefill-full", tf, N, double(model.full));
              row("prefill-ced", tc, N, double(model.ced));
              if (K > 0) {
                RunRequest dec = ced;
                dec.decode_steps = K;
                const auto [t_dec, rd] = time_run(dec, true);
                FlopQuery q = flop_query(dec);
                const double dec_flops = double(flop_model(c, p, q).total()) - double(model.ced);
                row("decode", t_dec, K, dec_flops);
              }
              std::printf("%-14s ced/full time %.4f, FLOP model ratio %.4f, ideal 1/2 + B/(2N) = %.4f\n", name.c_str(),
                          tc / tf, model.ratio(), ideal_ratio(p, N));
              summaries.push_back(fmt::format("{{\"backend\": \"{}\", \"ced_over_full_time\": {:.6g}, "
                                              "\"flop_model_ratio\": {:.6g}, \"ideal_ratio\": {:.6g}, \"finite\": {}}}",
                                              name, tc / tf, model.ratio(), ideal_ratio(p, N),
                                              rf.logits.allFinite() && rc2.logits.allFinite()));
              if (!rf.logits.allFinite() || !rc2.logits.allFinite()) {
                std::printf("%-14s non-finite logits\n", name.c_str());
                rc = 1;
              }
            }
            if (!o->json.empty())
              write_text_atomically(
                  o->json, fmt::format("{{\"config\": \"{}\", \"n_prompt\": {}, \"decode\": {}, \"weight_seed\": {}, "
                                       "\"rows\": [{}], \"summary\": [{}], \"not_supported\": [{}]}}\n",
                                       c.name, N, K, o->model.weight_seed, fmt::join(rows, ", "),
                                       fmt::join(summaries, ", "), fmt::join(unsupported, ", ")));
            return rc;
          }};
}

}  // namespace ced::tools
