// `ced cache-hit`: a prompt resumed after prefix-cache hits, per engine encoder-replay rule, against its cold
// run (docs/v41.md §13.8). The v41 family only: the lab model's resume is `ced spans --prefix`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "model/error.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"

namespace ced::tools {

Runner add_cache_hit(CLI::App& app) {
  auto o = std::make_shared<V41CacheHitOptions>();
  auto* sub = app.add_subcommand("cache-hit", "v41: a prompt resumed after prefix-cache hits, per encoder-replay rule");
  sub->add_option("--config", o->config, "a v41 built-in name or TOML file")->required();
  sub->add_option("--tokens", o->tokens, "prompt length N (default: the largest hit + 2W)")
      ->transform(integer_in(1, kMaxLength));
  sub->add_option("--hits", o->hits, "hits H (default W-1, W, W+1, 2W-1, 2W, 130, 131, 322, 323, 450, 451)")
      ->transform(integer_in(1, kMaxLength));
  sub->add_option("--rebuilt", o->rebuilt, "window rows K rebuilt before the hit (default W; the engines' value)")
      ->transform(integer_in(0, kMaxLength));
  sub->add_option("--rule", o->rules, "encoder-replay rules (default vllm trtllm sglang)");
  sub->add_option("--mode", o->modes, "ced conventions and/or full (default sglang vllm full)");
  sub->add_option("--regime", o->regime, "f64 | bf16 | release (docs/v41.md §8.1)")->capture_default_str();
  sub->add_option("--weight-seed", o->weight_seed, "the random checkpoint's seed")->capture_default_str()
      ->transform(unsigned_integer());
  sub->add_option("--token-seeds", o->token_seeds, "the prompts' token seeds (default 0)")
      ->transform(unsigned_integer());
  sub->add_option("--out", o->out, "output prefix: PREFIX.md (the results page) and PREFIX.csv");
  sub->add_option("--fault", o->fault, "test only: inject a fault into the model")->group("");
  return {sub, [o] {
            if (!names_v41_family(o->config))
              throw InputError(fmt::format("--config {}: cache-hit runs the v41 family; the lab model's resume is "
                                           "`ced spans --prefix`",
                                           o->config));
            o->out_name = std::filesystem::path(o->out).filename().string();
            o->command = fmt::format("ced cache-hit --config {}{}{}{}{}{} --regime {} --weight-seed {} --token-seeds {}{}",
                                     o->config, o->tokens ? fmt::format(" --tokens {}", o->tokens) : "",
                                     o->hits.empty() ? "" : fmt::format(" --hits {}", fmt::join(o->hits, " ")),
                                     o->rebuilt.empty() ? "" : fmt::format(" --rebuilt {}", fmt::join(o->rebuilt, " ")),
                                     o->rules.empty() ? "" : fmt::format(" --rule {}", fmt::join(o->rules, " ")),
                                     o->modes.empty() ? "" : fmt::format(" --mode {}", fmt::join(o->modes, " ")),
                                     o->regime, o->weight_seed,
                                     o->token_seeds.empty() ? "0" : fmt::format("{}", fmt::join(o->token_seeds, " ")),
                                     o->out.empty() ? "" : fmt::format(" --out {}", o->out_name));
            return cache_hit_v41(*o);
          }};
}

}  // namespace ced::tools
