// `ced run` (docs/spec.md §10): one run of one backend, written as HDF5 (docs/spec.md §9).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/lab/hdf5_files.hpp"
#include "io/untrusted.hpp"
#include "model/error.hpp"
#include "models/lab/schedule.hpp"
#include "models/lab/weights.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"

namespace ced::tools {
namespace {

// --cache-in: the cache must belong to this run's config, weights and prompt
// prefix (docs/spec.md §6: a persisted cache is the state of one model after one
// prefix); anything else would resume another computation. InputError naming
// the first mismatch.
void check_cache_belongs(const std::string& file, const CacheFile& cf, const Config& c, uint64_t weight_seed,
                         uint64_t token_seed, const RunRequest& r) {
  if (const std::string d = first_config_difference(cf.config, c, "the cache", "this run"); !d.empty())
    throw InputError(fmt::format("--cache-in: '{}' was written for another config: {}", file, d));
  if (cf.weight_seed != weight_seed)
    throw InputError(fmt::format("--cache-in: '{}' was written for weight seed {}, this run uses {}", file,
                                 cf.weight_seed, weight_seed));
  const int64_t P = cf.cache.prefix_len;
  if (r.prefix_len != P)
    throw InputError(fmt::format("--cache-in: '{}' holds a prefix of {} tokens, --prefix is {}", file, P, r.prefix_len));
  for (int64_t i = 0; i < P && i < int64_t(r.tokens.size()); ++i)
    if (cf.tokens[size_t(i)] != r.tokens[size_t(i)])
      throw InputError(fmt::format(
          "--cache-in: '{}' was computed from another prompt: token {} at position {} is {} in the cache, {} in this "
          "run (token seed {} in the cache, {} in this run)",
          file, i, i, cf.tokens[size_t(i)], r.tokens[size_t(i)], cf.token_seed, token_seed));
}

}  // namespace

Runner add_run(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    int64_t tokens = 0;
    std::string mode = "full", replay, backend = "reference", capture = "none", run_name, out, logits = "all";
    int64_t prefix = -1, decode = 0, resume_replay = -1;
    bool weights = false;
    std::string fault = "none", cache_out, cache_in;
    std::string checkpoint, regime = "release", token_file, topk_ties = "torch", index_scores = "bf16";
    std::string decode_index_k = "official", convention = "sglang", rule = "vllm";
    int64_t speculative = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("run", "run one prefill (and decode) on one backend and write it as HDF5");
  o->model.add(sub, false);
  sub->add_option("--checkpoint", o->checkpoint, "v41: run this release-layout folder (instead of --config)")
      ->check(non_empty());
  sub->add_option("--regime", o->regime, "v41: release | bf16 | f64 (docs/v41.md §8.1)")->capture_default_str();
  sub->add_option("--topk-ties", o->topk_ties, "v41: torch | lowest-index (equal index scores, docs/v41.md §8.7)")
      ->capture_default_str();
  sub->add_option("--index-scores", o->index_scores, "v41: bf16 | fp32 (the index score's roundings, docs/v41.md §8.7)")
      ->capture_default_str();
  sub->add_option("--convention", o->convention,
                  "v41, ced: sglang | trtllm | vllm | atom | ascend (the replay's cut, docs/v41.md §13.1)")
      ->capture_default_str();
  sub->add_option("--speculative", o->speculative, "v41, ced: speculative tokens a bounded tail holds (atom's W + k)")
      ->transform(integer_in(0, kMaxLength));
  sub->add_option("--decode-index-k", o->decode_index_k,
                  "v41: official | owner (the index keys of a decode step, docs/v41.md §8.8)")
      ->capture_default_str();
  sub->add_option("--token-file", o->token_file, "v41: the prompt's token ids, whitespace-separated (instead of --tokens)")
      ->check(non_empty());
  sub->add_option("--tokens", o->tokens, "prompt length N")->transform(integer_in(1, kMaxLength));
  sub->add_option("--mode", o->mode, "full | ced | resume")->capture_default_str()->check(CLI::IsMember({"full", "ced", "resume"}));
  sub->add_option("--replay", o->replay, "bounded | exact | full | K (ced, resume; default bounded)")
      ->check(non_empty());
  sub->add_option("--prefix", o->prefix, "resume: cached prefix length P")->transform(integer_in(0, kMaxLength));
  sub->add_option("--resume-replay", o->resume_replay,
                  "resume: encoder replay length (default W, docs/spec.md §6; v41: window rows rebuilt before the hit)")
      ->transform(integer_in(1, kMaxLength));
  sub->add_option("--rule", o->rule, "v41, resume: vllm | trtllm | sglang (the encoder-replay rule, docs/v41.md §13.8)")
      ->capture_default_str();
  sub->add_option("--decode", o->decode, "teacher-forced decode steps after the prefill")
      ->capture_default_str()
      ->transform(integer_in(0, kMaxLength));
  sub->add_option("--backend", o->backend, fmt::format("{}", fmt::join(backend_names(), " | ")))
      ->capture_default_str()
      ->transform(backend_name());
  sub->add_option("--capture", o->capture, "none | layers")->capture_default_str();
  sub->add_option("--logits", o->logits, "all | last: prefill positions whose logits are kept")->capture_default_str();
  sub->add_flag("--weights", o->weights, "also store every weight tensor (/weights)");
  sub->add_option("--run", o->run_name, "run name in the file (default: the mode and replay)")->check(non_empty());
  sub->add_option("--out", o->out, "output HDF5 file (v41: optional, the v41 run file of docs/v41.md §12)");
  sub->add_option("--cache-in", o->cache_in, "resume: read the persisted cache from this file")->check(non_empty());
  sub->add_option("--cache-out", o->cache_out, "write the persisted cache (docs/spec.md §6) to this file")->check(non_empty());
  sub->add_option("--fault", o->fault, "test only: inject a fault (negative controls)")->group("");
  return {sub, [o, sub] {
            const bool v41 = !o->checkpoint.empty() || (sub->count("--config") > 0 && names_v41_family(o->model.config));
            if (sub->count("--config") == 0 && o->checkpoint.empty()) throw InputError("--config is required");
            if (v41) {
              if (!o->checkpoint.empty() && sub->count("--config") > 0)
                throw InputError("--checkpoint: a folder carries its config; give --checkpoint or --config, not both");
              refuse_given(sub, {"--capture", "--logits", "--weights", "--run", "--cache-in", "--cache-out", "--fault", "--set"},
                           "not for a v41 run (its run file holds every capture; docs/v41.md §12)");
              if ((sub->count("--tokens") > 0) == !o->token_file.empty())
                throw InputError("--tokens or --token-file: a v41 run takes exactly one");
              if (!o->checkpoint.empty() && sub->count("--weight-seed") > 0)
                throw InputError("--weight-seed: a checkpoint folder carries its weights");
              V41RunOptions r;
              r.config = o->model.config;
              r.checkpoint = o->checkpoint;
              r.weight_seed = o->model.weight_seed;
              r.token_seed = o->model.token_seed;
              r.regime = o->regime;
              r.topk_ties = o->topk_ties;
              r.index_scores = o->index_scores;
              r.decode_index_k = o->decode_index_k;
              r.decode = o->decode;
              r.mode = o->mode;
              if (r.mode != "resume" && (sub->count("--prefix") > 0 || sub->count("--resume-replay") > 0 ||
                                         sub->count("--rule") > 0))
                throw InputError("--prefix, --resume-replay and --rule: a resume's (give --mode resume)");
              if (r.mode == "resume" && sub->count("--prefix") == 0)
                throw InputError("--mode resume: give the prefix-cache hit with --prefix H");
              r.prefix = o->prefix;
              if (sub->count("--resume-replay") > 0) r.rebuilt = o->resume_replay;
              r.rule = o->rule;
              if (!o->replay.empty()) r.replay = o->replay;
              r.convention = o->convention;
              r.speculative = o->speculative;
              if (r.mode == "full" &&
                  (sub->count("--replay") > 0 || sub->count("--convention") > 0 || sub->count("--speculative") > 0))
                throw InputError("--replay, --convention and --speculative: a ced or resume run's (give --mode ced)");
              if (sub->count("--backend") > 0) r.backend = o->backend;
              r.tokens = o->tokens;
              r.token_file = o->token_file;
              r.out = o->out;
              return run_v41(r);
            }
            refuse_given(sub, {"--checkpoint", "--regime", "--token-file", "--topk-ties", "--index-scores", "--decode-index-k",
                               "--convention", "--speculative", "--rule"},
                         fmt::format("an option of the v41 family; config {} is a lab config", o->model.config));
            if (sub->count("--tokens") == 0) throw InputError("--tokens is required");
            if (o->out.empty()) throw InputError("--out is required");
            const Config c = o->model.load();
            RunRequest r;
            r.mode = parse_mode(o->mode);
            r.replay = ReplayPolicy::parse(r.mode == Mode::Full ? (o->replay.empty() ? "none" : o->replay)
                                                                : (o->replay.empty() ? "bounded" : o->replay));
            r.n_prompt = o->tokens;
            r.prefix_len = o->prefix;
            r.resume_replay = o->resume_replay;
            r.decode_steps = o->decode;
            if (o->capture != "none" && o->capture != "layers")
              throw InputError(fmt::format("--capture: '{}' is not none or layers", o->capture));
            r.capture_layers = o->capture == "layers";
            if (o->logits != "all" && o->logits != "last")
              throw InputError(fmt::format("--logits: '{}' is not all or last", o->logits));
            r.logits = o->logits == "last" ? LogitsScope::Last : LogitsScope::All;
            r.fault = parse_fault(o->fault);
            r.want_cache = !o->cache_out.empty();
            if (r.n_prompt < 1) throw InputError("--tokens: N must be >= 1");
            if (r.decode_steps < 0) throw InputError("--decode: must be >= 0");
            // Before the tokens are made: a length no machine can hold is refused, not allocated.
            check_fits_in_memory(c, r.n_prompt + r.decode_steps, o->backend);
            r.tokens = make_tokens(o->model.token_seed, c.vocab_size, r.n_prompt + r.decode_steps);
            validate_request(c, r);
            if (!o->cache_in.empty()) {
              if (r.mode != Mode::Resume) throw InputError("--cache-in: only a resume (--mode resume) reads a cache");
              const CacheFile cf = read_untrusted_cache_file(o->cache_in);
              check_cache_belongs(o->cache_in, cf, c, o->model.weight_seed, o->model.token_seed, r);
              r.cache_in = std::make_shared<PersistedCache>(cf.cache);
            }
            std::printf("config %s, weight_seed %llu, token_seed %llu, backend %s\n", c.name.c_str(),
                        (unsigned long long)o->model.weight_seed, (unsigned long long)o->model.token_seed,
                        o->backend.c_str());
            auto be = make_backend(o->backend, c, o->model.weight_seed);
            Stopwatch sw;
            const double cpu0 = process_cpu_seconds();
            RunResult res = be->run(r);
            const double secs = sw.seconds(), cpu = process_cpu_seconds() - cpu0;
            RunFile f;
            f.generator = fmt::format("ced run (ced-harness {})", CED_VERSION);
            f.config = c;
            f.tokens = r.tokens;
            f.weight_seed = o->model.weight_seed;
            f.token_seed = o->model.token_seed;
            f.weights_dtype = o->weights ? res.dtype : "";
            std::string name = o->run_name;
            if (name.empty()) name = r.mode == Mode::Full ? "full" : fmt::format("{}-{}", mode_name(r.mode), r.replay.str());
            f.runs.push_back({name, res});
            write_run_file(o->out, f);
            if (!o->cache_out.empty()) {
              CacheFile cf;
              cf.generator = f.generator;
              cf.config = c;
              cf.weight_seed = o->model.weight_seed;
              cf.token_seed = o->model.token_seed;
              cf.cache = *res.cache;
              cf.tokens.assign(r.tokens.begin(), r.tokens.begin() + cf.cache.prefix_len);
              write_cache_file(o->cache_out, cf);
            }
            const int64_t N = r.n_prompt;
            std::printf("mode %s, N = %lld, replay %s (n_replay %lld, replay start s = %lld), decode %lld\n",
                        mode_name(r.mode), (long long)N, res.replay.str().c_str(), (long long)res.n_replay,
                        (long long)res.replay_start, (long long)r.decode_steps);
            std::printf("%.3f s, %.1f tokens/s, %.3g FLOP (docs/spec.md §7 model), %.2f GFLOP/s, CPU %.3f s\n", secs,
                        double(N + r.decode_steps) / secs, double(res.flops.total()),
                        double(res.flops.total()) / secs / 1e9, cpu);
            const auto last = res.logits.row(res.logits.rows() - 1);
            Eigen::Index arg = 0;
            last.maxCoeff(&arg);
            std::printf("logits [%lld, %lld] at positions %lld..%lld; last position argmax %lld, all finite: %s\n",
                        (long long)res.logits.rows(), (long long)res.logits.cols(), (long long)res.positions.front(),
                        (long long)res.positions.back(), (long long)arg, res.logits.allFinite() ? "yes" : "NO");
            std::printf("wrote %s (run '%s')\n", o->out.c_str(), name.c_str());
            return 0;
          }};
}

}  // namespace ced::tools
