// `ced bench`: prefill (full, ced bounded) and decode throughput per backend,
// the achieved FLOP rate from the docs/spec.md §7 FLOP model against the
// measured rate of the order-preserving GEMM, and the measured ced/full time
// ratio beside the oracle's FLOP ratio. Validate, then benchmark: each
// backend's warm-up run is judged against reference-f64 under its golden
// policy (self-calibrated from the f32 reference's own error where the
// registry says so) before any of its figures is printed; a backend that
// fails is reported and timed no further. The f32 reference itself, the
// calibration's source, is judged under fixed bounds
// (golden/policy-f32-fixed.toml): a bound made from its own error could not
// fail it.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>

#include "compare/compare.hpp"  // json_string, json_number
#include "compare/policy.hpp"
#include "golden/golden_set.hpp"  // default_golden_dir
#include "model/error.hpp"
#include "models/lab/weights.hpp"
#include "oracle/analytic.hpp"
#include "reference/lab/gemm.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"

namespace ced::tools {
namespace {

struct Timing {
  std::vector<double> seconds;  // every timed repetition, in order
  double min() const { return *std::min_element(seconds.begin(), seconds.end()); }
  double median() const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  }
};

// GFLOP/s of the order-preserving product (reference/lab/gemm.hpp) on a
// 512 x 512 x 512 product with the current OpenMP threads, best of 3 after a
// warm-up: the ceiling of every matrix product of the reference.
template <class T>
double gemm_peak_gflops() {
  constexpr int64_t n = 512;
  std::mt19937_64 g(1);  // seed 1
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> X(size_t(n * n)), W(size_t(n * n)), Y(size_t(n * n));
  for (auto& x : X) x = T(u(g));
  for (auto& x : W) x = T(u(g));
  double best = 1e300;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ref::gemm::gemm(X.data(), n, n, W.data(), n, Y.data(), true);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, s);
  }
  return 2.0 * double(n * n * n) / best / 1e9;
}

double load_average() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    int64_t tokens = 1024, decode = 8, repeat = 3, warmup = 1;
    std::vector<std::string> backends = {"reference"};
    std::string json;  // also write the figures here as JSON
    std::string golden = golden::default_golden_dir().string();
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("bench", "throughput of prefill (full, ced bounded) and decode per backend");
  o->model.config = "bench";
  o->model.add(sub, false);
  sub->add_option("--tokens", o->tokens, "prompt length N")->capture_default_str()->transform(integer_in(1, kMaxLength));
  sub->add_option("--decode", o->decode, "decode steps")->capture_default_str()->transform(integer_in(0, kMaxLength));
  sub->add_option("--repeat", o->repeat, "timed repetitions (min and median reported)")
      ->capture_default_str()
      ->transform(integer_in(1, 1000));
  sub->add_option("--warmup", o->warmup, "untimed runs per backend before timing (the first is validated)")
      ->capture_default_str()
      ->transform(integer_in(1, 100));
  sub->add_option("--backend", o->backends, "backends to measure")->capture_default_str()->transform(backend_name());
  sub->add_option("--golden", o->golden, "golden directory holding the policies the validation applies")
      ->capture_default_str();
  sub->add_option("--json", o->json, "also write every figure to this JSON file (atomically)");
  auto fault = std::make_shared<std::string>("none");
  sub->add_option("--fault", *fault, "test only: inject a fault into the measured backends")->group("");
  auto v41 = std::make_shared<V41BenchOptions>();
  sub->add_option("--regime", v41->regime, "v41: release | bf16 | f64 (docs/v41.md §8.1)")->capture_default_str();
  sub->add_option("--convention", v41->convention, "v41: the replay convention (docs/v41.md §13.1)")->capture_default_str();
  return {sub, [o, fault, v41, sub] {
            if (names_v41_family(o->model.config)) {  // the release (docs/v41.md §14.7)
              if (sub->count("--backend") || sub->count("--golden") || sub->count("--json") || sub->count("--set"))
                throw InputError("--backend, --golden, --json and --set are the lab family's; the v41 bench times its "
                                 "reference");
              v41->config = o->model.config;
              v41->tokens = o->tokens;
              v41->decode = o->decode;
              v41->repeat = o->repeat;
              v41->warmup = o->warmup;
              v41->weight_seed = o->model.weight_seed;
              v41->token_seed = o->model.token_seed;
              return bench_v41(*v41);
            }
            if (sub->count("--regime") || sub->count("--convention"))
              throw InputError("--regime and --convention are the v41 family's");
            const Config c = o->model.load();
            const Plan p = make_plan(c);
            const int64_t N = o->tokens, K = o->decode;
            if (N < 1 || K < 0 || o->repeat < 1 || o->warmup < 1)
              throw InputError("--tokens >= 1, --decode >= 0, --repeat >= 1, --warmup >= 1");
            std::printf("ced bench: config %s, N = %lld, decode %lld, weight_seed %llu, token_seed %llu; %u hardware "
                        "threads, %d OpenMP threads, gemm path %s, load average %.2f\n",
                        c.name.c_str(), (long long)N, (long long)K, (unsigned long long)o->model.weight_seed,
                        (unsigned long long)o->model.token_seed, std::thread::hardware_concurrency(),
                        omp_get_max_threads(), ref::gemm::isa_name(ref::gemm::active_isa()), load_average());
            // Refuse a length no measured backend's memory holds before any work.
            for (const auto& name : o->backends) check_fits_in_memory(c, N + K, name);
            const std::vector<int32_t> tokens = make_tokens(o->model.token_seed, c.vocab_size, N + K);
            RunRequest full;
            full.n_prompt = N;
            full.logits = LogitsScope::Last;
            full.tokens.assign(tokens.begin(), tokens.begin() + N);
            RunRequest ced = full;
            ced.mode = Mode::Ced;
            ced.replay = ReplayPolicy::parse("bounded");
            RunRequest measured_full = full;  // what the measured backends run (the reference runs stay clean)
            measured_full.fault = ced.fault = parse_fault(*fault);

            // 1. Validation inputs: reference-f64's logits (what every backend is
            // judged against) and the f32 reference's error on them (the
            // calibration), each from one full run; a measured backend's own
            // first warm-up run serves when it is one of them.
            std::map<std::string, RunResult> first_run;
            auto full_run_of = [&](const std::string& name) -> const RunResult& {
              if (!first_run.count(name)) {
                check_fits_in_memory(c, N, name);
                first_run[name] = make_backend(name, c, o->model.weight_seed)->run(full);
              }
              return first_run[name];
            };
            const std::string run_name = "runs/full/logits";
            // What every backend is judged against (docs/spec.md §8.5).
            constexpr const char* kValidationReference = "reference-f64";
            // The backend whose error is the calibration (docs/spec.md §8.4).
            constexpr const char* kCalibrationSource = "reference";
            auto calibration = [&]() {
              const RunResult& r32 = full_run_of(kCalibrationSource);
              const RunResult& r64 = full_run_of(kValidationReference);
              const TensorCompare tc =
                  compare_tensors(std::span<const double>(r32.logits.data(), size_t(r32.logits.size())),
                                  std::span<const double>(r64.logits.data(), size_t(r64.logits.size())),
                                  {r64.logits.rows(), r64.logits.cols()}, Thresholds{}, TensorDtype::F32);
              return calibration_of(tc);
            };

            const double peak32 = gemm_peak_gflops<float>(), peak64 = gemm_peak_gflops<double>();
            std::printf("ordered GEMM (512^3, %d threads): f32 %.2f GFLOP/s, f64 %.2f GFLOP/s (the %% of peak below)\n",
                        omp_get_max_threads(), peak32, peak64);
            int rc = 0;
            // JSON rows, one per backend and phase, then one summary per backend.
            std::vector<std::string> rows, summaries, unsupported, invalid;
            bool header = false;
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
              // 2. Warm-up, the first run judged.
              const BackendEntry& entry = backend_entry(name);
              RunResult warm = be->run(measured_full);
              if (!first_run.count(name) && measured_full.fault == Fault::None) first_run[name] = warm;
              for (int64_t i = 1; i < o->warmup; ++i) be->run(measured_full);
              const RunResult& want = full_run_of(kValidationReference);
              // The calibration's source would be bounded by its own error.
              const bool self_calibrated = entry.gate_calibrated && name == kCalibrationSource;
              const std::string policy_name = self_calibrated ? "policy-f32-fixed.toml" : entry.golden_policy;
              const Policy policy = load_policy_file(std::filesystem::path(o->golden) / policy_name);
              std::optional<Calibration> cal;
              if (entry.gate_calibrated && !self_calibrated) cal = calibration();
              Comparison cmp;
              const std::span<const double> t(warm.logits.data(), size_t(warm.logits.size()));
              const std::span<const double> r(want.logits.data(), size_t(want.logits.size()));
              if (warm.logits.rows() != want.logits.rows() || warm.logits.cols() != want.logits.cols())
                throw std::logic_error(fmt::format("{}: logits of shape {}x{}, reference {}x{}", name,
                                                   warm.logits.rows(), warm.logits.cols(), want.logits.rows(),
                                                   want.logits.cols()));
              const std::vector<int64_t> shape = {want.logits.rows(), want.logits.cols()};
              cmp.tensor = compare_tensors(t, r, shape, policy.thresholds_for(run_name, cal),
                                           parse_tensor_dtype(entry.scalar));
              cmp.logits = compare_logits(t, r, shape);
              const Verdict v = judge(policy, run_name, cmp, cal);
              std::printf("%-14s validation against %s (%s, N = %lld, last position) under %s:\n", name.c_str(),
                          kValidationReference, "full", (long long)N, policy_name.c_str());
              for (const auto& line : v.lines()) std::printf("  %s\n", line.c_str());
              // The error itself, passing or not: against the f64 reference no
              // f32 backend is exact, so a zero here says what it was judged against.
              std::printf("  measured: rel_l2 %.6g, max_abs %.6g\n", cmp.tensor->rel_l2, cmp.tensor->max_abs_err);
              if (!v.pass) {
                std::printf("%-14s invalid: no figures\n", name.c_str());
                invalid.push_back(json_string(name));
                rc = 1;
                continue;
              }
              // 3. Timed repetitions; prefill and decode times as the backend
              // measured them (weights upload and host set-up excluded).
              auto time_run = [&](const RunRequest& req, bool decode_phase = false) {
                Timing tm;
                RunResult res;
                for (int64_t i = 0; i < o->repeat; ++i) {
                  res = be->run(req);
                  tm.seconds.push_back(decode_phase ? res.decode_seconds : res.prefill_seconds);
                }
                return std::make_pair(tm, res);
              };
              // The two prefills in alternating rounds, so that a slow spell of a shared machine falls on both
              // and the ratio of their minima compares like with like.
              Timing tf, tc;
              RunResult rf, rc2;
              for (int64_t i = 0; i < o->repeat; ++i) {
                rf = be->run(measured_full);
                tf.seconds.push_back(rf.prefill_seconds);
                rc2 = be->run(ced);
                tc.seconds.push_back(rc2.prefill_seconds);
              }
              const double peak = entry.scalar == "f64" ? peak64 : peak32;
              if (!header) {
                std::printf("%-14s %-12s %10s %10s %12s %10s %10s %8s\n", "backend", "phase", "min s", "median s",
                            "tokens/s", "GFLOP", "GFLOP/s", "% peak");
                header = true;
              }
              // docs/spec.md §7 FLOP model (the reference counts the same; CUDA does not count).
              const RatioFlops model = exact_ratio_flops(c, p, N);
              auto row = [&](const char* phase, const Timing& tm, int64_t toks, double flops) {
                const double secs = tm.min(), rate = flops / secs / 1e9;
                std::printf("%-14s %-12s %10.3f %10.3f %12.1f %10.2f %10.2f %8.1f\n", name.c_str(), phase, secs,
                            tm.median(), double(toks) / secs, flops / 1e9, rate, 100 * rate / peak);
                rows.push_back(fmt::format(
                    "{{\"backend\": \"{}\", \"phase\": \"{}\", \"seconds\": {:.6g}, \"median_seconds\": {:.6g}, "
                    "\"all_seconds\": [{}], \"tokens_per_s\": {:.6g}, \"gflop\": {:.6g}, \"gflops\": {:.6g}, "
                    "\"fraction_of_gemm_peak\": {:.6g}}}",
                    name, phase, secs, tm.median(), fmt::join(tm.seconds, ", "), double(toks) / secs, flops / 1e9,
                    rate, rate / peak));
              };
              row("prefill-full", tf, N, double(model.full));
              row("prefill-ced", tc, N, double(model.ced));
              if (K > 0) {
                RunRequest dec = ced;
                dec.decode_steps = K;
                dec.tokens = tokens;
                const auto [t_dec, rd] = time_run(dec, true);
                FlopQuery q = flop_query(dec);
                const double dec_flops = double(flop_model(c, p, q).total()) - double(model.ced);
                row("decode", t_dec, K, dec_flops);
              }
              std::printf("%-14s ced/full time %.4f, FLOP model ratio %.4f, ideal 1/2 + B/(2N) = %.4f\n", name.c_str(),
                          tc.min() / tf.min(), model.ratio(), ideal_ratio(p, N));
              summaries.push_back(fmt::format("{{\"backend\": \"{}\", \"ced_over_full_time\": {:.6g}, "
                                              "\"flop_model_ratio\": {:.6g}, \"ideal_ratio\": {:.6g}, \"finite\": {}, "
                                              "\"validation\": {}, \"validated_against\": \"{}\", "
                                              "\"validation_rel_l2\": {}, \"validation_max_abs\": {}}}",
                                              name, tc.min() / tf.min(), model.ratio(), ideal_ratio(p, N),
                                              rf.logits.allFinite() && rc2.logits.allFinite(), to_json(v),
                                              kValidationReference, json_number(cmp.tensor->rel_l2),
                                              json_number(cmp.tensor->max_abs_err)));
              if (!rf.logits.allFinite() || !rc2.logits.allFinite()) {
                std::printf("%-14s non-finite logits\n", name.c_str());
                rc = 1;
              }
            }
            if (!o->json.empty())
              write_text_atomically(
                  o->json,
                  fmt::format("{{\"config\": \"{}\", \"n_prompt\": {}, \"decode\": {}, \"weight_seed\": {}, "
                              "\"token_seed\": {}, \"repeat\": {}, \"warmup\": {}, \"threads\": {}, \"gemm_isa\": \"{}\", "
                              "\"load_average\": {:.3g}, \"gemm_peak_gflops\": {{\"f32\": {:.6g}, \"f64\": {:.6g}}}, "
                              "\"rows\": [{}], \"summary\": [{}], \"invalid\": [{}], \"not_supported\": [{}]}}\n",
                              c.name, N, K, o->model.weight_seed, o->model.token_seed, o->repeat, o->warmup,
                              omp_get_max_threads(), ref::gemm::isa_name(ref::gemm::active_isa()), load_average(),
                              peak32, peak64, fmt::join(rows, ", "), fmt::join(summaries, ", "), fmt::join(invalid, ", "),
                              fmt::join(unsupported, ", ")));
            return rc;
          }};
}

}  // namespace ced::tools
