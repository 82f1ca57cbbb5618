// `ced bench` on a v41 config (docs/v41.md §14.7): the reference's full prefill, bounded CED prefill (the
// last min(N, W) rows replayed under a convention) and decode steps, min and median of --repeat after
// validated warm-up runs, beside the oracle's FLOP counts: the time ratio ced/full next to the FLOP ratio.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <thread>

#include "model/error.hpp"
#include "models/v41/numerics.hpp"
#include "oracle/v41_oracle.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"
#include "tools/v41_study.hpp"

namespace ced::tools {
namespace {

struct Timed {
  double min = 0, median = 0;
};

Timed summary(const std::vector<double>& s) { return {*std::min_element(s.begin(), s.end()), median(s)}; }

template <class F>
Timed timed(int64_t repeat, F f) {
  std::vector<double> s;
  for (int64_t i = 0; i < repeat; ++i) {
    Stopwatch w;
    f();
    s.push_back(w.seconds());
  }
  return summary(s);
}

// Two passes timed in alternating rounds, so that a slow spell of a shared machine falls on both and the
// ratio of their minima compares like with like.
template <class F, class G>
std::pair<Timed, Timed> timed_alternately(int64_t repeat, F f, G g) {
  std::vector<double> a, b;
  for (int64_t i = 0; i < repeat; ++i) {
    Stopwatch w;
    f();
    a.push_back(w.seconds());
    Stopwatch v;
    g();
    b.push_back(v.seconds());
  }
  return {summary(a), summary(b)};
}

}  // namespace

int bench_v41(const V41BenchOptions& o) {
  const v41::V41Config c = v41_config_named(o.config);
  v41::check_v41_fits_in_memory(c);
  const v41::V41Plan p = v41::make_v41_plan(c);
  const v41::V41ReplayConvention& conv = v41::v41_replay_convention(o.convention);
  const int64_t N = o.tokens, K = std::min(N, p.W), V = c.vocab_size;
  const v41::V41Regime regime = v41::v41_regime_from_name(o.regime);
  V41Seeded s = v41_seeded_model(c, o.weight_seed, regime);
  const std::vector<int64_t> tokens = v41_seeded_tokens(o.token_seed, c, N + o.decode);
  const std::span<const int64_t> prompt(tokens.data(), static_cast<size_t>(N));
  std::printf("ced bench: config %s (v41 family), regime %s, N = %lld, ced replay K = %lld (%s), decode %lld, weight_seed "
              "%llu, token_seed %llu; %u hardware threads, %d OpenMP threads\n",
              c.name.c_str(), o.regime.c_str(), (long long)N, (long long)K, conv.name, (long long)o.decode,
              (unsigned long long)o.weight_seed, (unsigned long long)o.token_seed, std::thread::hardware_concurrency(),
              omp_get_max_threads());
  // Warm-up, the first validated: finite logits, and within the window the ced prefill is the prefill's bits.
  for (int64_t w = 0; w < o.warmup; ++w) {
    const v41::V41ForwardResult full = s.model.forward(prompt, s.hashing);
    const v41::V41ForwardResult ced = s.model.forward_ced(prompt, s.hashing, K, conv);
    if (w > 0) continue;
    const std::span<const double> a = last_logits(full, V), b = last_logits(ced, V);
    if (!std::all_of(a.begin(), a.end(), [](double x) { return std::isfinite(x); }) ||
        !std::all_of(b.begin(), b.end(), [](double x) { return std::isfinite(x); }))
      throw InputError("ced bench: the warm-up's logits are not all finite");
    if (N <= p.W && !v41::same_bits(a, b))
      throw InputError("ced bench: within the window the warm-up's ced prefill is not the prefill's bits");
  }
  const auto [full, ced] = timed_alternately(
      o.repeat, [&] { (void)s.model.forward(prompt, s.hashing); },
      [&] { (void)s.model.forward_ced(prompt, s.hashing, K, conv); });
  Timed decode;
  if (o.decode > 0)
    decode = timed(o.repeat, [&] {
      v41::V41DecodeState st;
      (void)s.model.forward(prompt, s.hashing, &st);
      for (int64_t i = 0; i < o.decode; ++i) (void)s.model.decode_step(tokens[static_cast<size_t>(N + i)], s.hashing, st);
    });
  const v41::V41OracleTable t = v41::v41_oracle_table(c, {N});
  const v41::V41OracleRow& r = t.rows.front();
  std::printf("  %-22s %12s %12s %14s %10s\n", "pass", "min s", "median s", "GFLOP/s (min)", "FLOPs");
  std::printf("  %-22s %12.4f %12.4f %14.3f %10.3g\n", "full prefill", full.min, full.median,
              double(r.full_flops) / full.min / 1e9, double(r.full_flops));
  std::printf("  %-22s %12.4f %12.4f %14.3f %10.3g\n", "ced prefill (bounded)", ced.min, ced.median,
              double(r.ced_flops) / ced.min / 1e9, double(r.ced_flops));
  if (o.decode > 0)
    std::printf("  %-22s %12.4f %12.4f   (a prefill and %lld steps: the prefill's time is above)\n", "prefill + decode",
                decode.min, decode.median, (long long)o.decode);
  std::printf("ced/full: time %.4f (min), %.4f (median); the oracle's FLOP ratio %.4f (docs/v41.md §14.3)\n",
              ced.min / full.min, ced.median / full.median, r.exact_ratio);
  return 0;
}

}  // namespace ced::tools
