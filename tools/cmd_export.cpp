// `ced export` (docs/spec.md §10): every weight tensor of docs/spec.md §2.2, and
// optionally the prompt tokens, as safetensors (docs/spec.md §9.4) or HDF5 (§9.1).
#include <fmt/format.h>

#include "models/lab/weights_export.hpp"
#include "model/error.hpp"
#include "models/lab/weights.hpp"
#include "tools/common.hpp"
#include "tools/v41_commands.hpp"

namespace ced::tools {

Runner add_export(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    std::string dtype = "f32", format = "safetensors", out;
    int64_t tokens = 0;
    int64_t shard_bytes = 0;
    std::vector<std::string> boost;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand(
      "export", "write every weight tensor (and optionally the prompt) as safetensors or HDF5; for a v41 config, a "
                "checkpoint folder in the release's layout (docs/v41.md §11)");
  o->model.add(sub);
  sub->add_option("--dtype", o->dtype, "f32 | f64 | bf16")->capture_default_str()->check(CLI::IsMember({"f32", "f64", "bf16"}));
  sub->add_option("--format", o->format, "safetensors | h5")->capture_default_str()->check(CLI::IsMember({"safetensors", "h5"}));
  sub->add_option("--tokens", o->tokens, "also the first N prompt tokens of docs/spec.md §2.3 (tensor `tokens`)")
      ->transform(integer_in(1, kMaxLength));
  sub->add_option("--shard-bytes", o->shard_bytes, "v41: the most bytes of tensors per shard (default 5 GB)")
      ->transform(integer_in(1, int64_t(1) << 40));
  sub->add_option("--boost", o->boost, "test only: TENSOR=K multiplies a v41 FP8 weight by 2^K (negative controls)")
      ->group("");
  sub->add_option("--out", o->out, "output file (a v41 config: the folder)")->required()->check(non_empty());
  return {sub, [o, sub] {
            if (names_v41_family(o->model.config)) {
              refuse_given(sub, {"--dtype", "--format", "--tokens", "--token-seed", "--set"},
                           "the lab family's option; a v41 export writes the release's dtypes and no prompt");
              return export_v41({o->model.config, o->model.weight_seed, o->out, o->shard_bytes, o->boost});
            }
            refuse_given(sub, {"--shard-bytes", "--boost"}, "only for a v41 export");
            WeightsExport e;
            e.config = o->model.load();
            e.weight_seed = o->model.weight_seed;
            e.token_seed = o->model.token_seed;
            e.n_tokens = o->tokens;
            e.dtype = o->dtype;
            e.generator = fmt::format("ced export (ced-harness {})", CED_VERSION);
            std::printf("config %s, weight_seed %llu, token_seed %llu, dtype %s, format %s\n", e.config.name.c_str(),
                        (unsigned long long)e.weight_seed, (unsigned long long)e.token_seed, e.dtype.c_str(),
                        o->format.c_str());
            // The whole model is generated in memory first: lab-flash is refused up front.
            check_fits_in_memory(e.config, 1, e.dtype == "f64" ? "reference-f64" : "reference");
            write_weights_export(o->out, e, o->format);
            std::printf("wrote %s (%zu weight tensors%s)\n", o->out.c_str(),
                        weight_specs(e.config, make_plan(e.config)).size(),
                        e.n_tokens > 0 ? fmt::format(", {} tokens", e.n_tokens).c_str() : "");
            return 0;
          }};
}

}  // namespace ced::tools
