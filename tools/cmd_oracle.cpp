// `ced oracle` (docs/spec.md §7) and `ced spans` (docs/spec.md §4, §6: the spans found on the model).
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "model/error.hpp"
#include "oracle/analytic.hpp"
#include "checks/ced_checks.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"

namespace ced::tools {

Runner add_oracle(CLI::App& app) {
  struct Opts {
    std::string config;
    std::vector<int64_t> tokens;
    int64_t prefix = -1;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("oracle", "the analytic oracle (docs/spec.md §7; v41 configs docs/v41.md §14): spans, work, ratios");
  sub->add_option("--config", o->config, "built-in name, TOML file (lab) or config.json (v41)")->required();
  sub->add_option("--tokens", o->tokens, "prompt lengths N (default 256 32768 1000000)")
      ->transform(integer_in(1, kMaxLength));
  sub->add_option("--prefix", o->prefix, "prefix P for the encoder-replay spans (default 4W; lab configs)")
      ->transform(integer_in(0, kMaxLength));
  sub->add_flag("--json", o->json, "print JSON instead of the table");
  return {sub, [o] {
            std::vector<int64_t> Ns = o->tokens;
            if (Ns.empty()) Ns = {256, 32768, 1000000};
            if (names_v41_family(o->config)) {
              if (o->prefix >= 0)
                throw InputError("--prefix: the encoder-replay spans are the lab oracle's (docs/spec.md §7); the "
                                 "v41 oracle (docs/v41.md §14) has none");
              return oracle_v41(o->config, Ns, o->json);
            }
            const Config c = load_lab_config(o->config);
            const int64_t P = o->prefix >= 0 ? o->prefix : 4 * c.window;
            OracleTable t;
            try {
              t = oracle_table(c, Ns, P);
            } catch (const std::overflow_error&) {
              // the §7 counts are exact int64 (oracle/analytic_flops.cpp): a length
              // whose count does not fit is out of range for this config
              throw InputError(fmt::format("--tokens: N = {} is too long for config {}: its docs/spec.md §7 FLOP count "
                                           "overflows int64",
                                           *std::max_element(Ns.begin(), Ns.end()), c.name));
            }
            std::fputs((o->json ? oracle_table_json(t) + "\n" : format_oracle_table(t)).c_str(), stdout);
            return 0;
          }};
}

Runner add_spans(CLI::App& app) {
  struct Opts {
    std::string config;
    bool empirical = false;
    int64_t tokens = -1, prefix = -1;
    uint64_t weight_seed = 0, token_seed = 0;
    std::string fault = "none", regime = "f64";
    std::vector<std::string> conventions;
    int64_t stress = 0;
    std::string stress_out;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("spans", "replay spans: the oracle's, and with --empirical the ones found on the model");
  sub->add_option("--config", o->config, "built-in name or TOML file")->required();
  sub->add_flag("--empirical", o->empirical, "search the real model (reference backend) over replay lengths");
  sub->add_option("--tokens", o->tokens, "prompt length N of the search (default: past every span)")
      ->transform(integer_in(1, kMaxLength));
  sub->add_option("--prefix", o->prefix, "prefix P of the encoder-resume search (default 1 + E(W-1) + W)")
      ->transform(integer_in(0, kMaxLength));
  sub->add_option("--weight-seed", o->weight_seed, "weight_seed of docs/spec.md §2")->capture_default_str()->transform(unsigned_integer());
  sub->add_option("--regime", o->regime, "v41: f64 | bf16 | release (docs/v41.md §8.1)")->capture_default_str();
  sub->add_option("--convention", o->conventions, "v41: the conventions to search (default all, docs/v41.md §13.1)");
  sub->add_option("--token-seed", o->token_seed, "v41: the prompt's token_seed")->capture_default_str()->transform(unsigned_integer());
  sub->add_option("--stress", o->stress, "v41: print the stress prompts of N tokens (ties likely, docs/v41.md §13.12)")
      ->transform(integer_in(1, kMaxLength));
  sub->add_option("--stress-out", o->stress_out, "v41, with --stress: write each as DIR/NAME.txt (whitespace ids)")
      ->check(non_empty());
  // Test only, as in `ced run`: a model that breaks one span shows that its row alone fails the verdict.
  sub->add_option("--fault", o->fault, "test only: inject a fault into the searched model")->group("");
  return {sub, [o, sub] {
            if (names_v41_family(o->config)) {
              V41SpansOptions v{o->config, o->empirical, o->tokens, o->weight_seed, o->token_seed, o->regime,
                                o->conventions, o->fault, o->prefix, o->stress, o->stress_out};
              if (!o->stress_out.empty() && o->stress == 0) throw InputError("--stress-out: give --stress N");
              return spans_v41(v);
            }
            refuse_given(sub, {"--regime", "--convention", "--token-seed", "--stress", "--stress-out"},
                         fmt::format("an option of the v41 family; config {} is a lab config", o->config));
            const Config c = load_lab_config(o->config);
            const Fault fault = parse_fault(o->fault);
            const Plan p = make_plan(c);
            const int64_t R = p.exact_replay(), encH = 1 + p.E * (p.W - 1);
            const int64_t P = o->prefix >= 0 ? o->prefix : encH + p.W;
            const int64_t N = o->tokens >= 0 ? o->tokens : std::max(R, P) + p.W;
            if (o->empirical) check_fits_in_memory(c, N, "reference");
            std::printf("config %s: L = %lld, E = %lld, D = %lld, W = %lld\n", c.name.c_str(), (long long)p.L,
                        (long long)p.E, (long long)p.D, (long long)p.W);
            prop::Spans s;
            if (o->empirical) {
              if (P >= N) throw InputError(fmt::format("--prefix: P = {} must be below N = {}", P, N));
              std::printf("searching N = %lld, P = %lld, weight_seed %llu (reference f32; the probe marks the entries a "
                          "truncated window leaves out as NaN)\n",
                          (long long)N, (long long)P, (unsigned long long)o->weight_seed);
              std::fflush(stdout);
              const prop::Model m(c, false, fault, o->weight_seed);
              Stopwatch sw;
              s = prop::empirical_spans(m, N, P, [&](const std::string& line) {
                std::fprintf(stderr, "  [%6.1fs] %s\n", sw.seconds(), line.c_str());
              });
            }
            std::printf("%-58s %8s%s\n", "span", "oracle", o->empirical ? "    found" : "");
            const std::vector<prop::SpanRow> rows = prop::span_rows(p, N, P, s);
            for (const auto& r : rows) {
              if (!o->empirical) std::printf("%-58s %8lld\n", r.what.c_str(), (long long)r.oracle);
              else
                std::printf("%-58s %8lld %8lld  %s\n", r.what.c_str(), (long long)r.oracle, (long long)r.found,
                            r.oracle == r.found ? "ok" : "MISMATCH");
            }
            if (o->empirical)
              std::printf("%-58s %8s %8lld  (f32 rounding absorbs the far end of the cone)\n",
                          "decoder: last logits bitwise equal, plain arithmetic", "-", (long long)s.numeric_last);
            return !o->empirical || prop::spans_agree(rows) ? 0 : 1;
          }};
}

}  // namespace ced::tools
