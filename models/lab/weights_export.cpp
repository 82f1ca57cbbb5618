// docs/spec.md §9.4: weights out; see weights_export.hpp.
#include "models/lab/weights_export.hpp"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "models/lab/hdf5_files.hpp"
#include "model/error.hpp"
#include "models/lab/plan.hpp"
#include "models/lab/weights.hpp"

namespace ced {
namespace {

void check_dtype(const std::string& dtype) {
  if (dtype != "f32" && dtype != "f64" && dtype != "bf16")
    throw InputError(fmt::format("--dtype: '{}' is not f32, f64 or bf16", dtype));
}

template <class T>
void append(std::vector<uint8_t>& bytes, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  bytes.insert(bytes.end(), b, b + sizeof(T));
}

}  // namespace

uint16_t bf16_bits_of(double value) {
  const uint32_t u = std::bit_cast<uint32_t>(static_cast<float>(value));
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
}

std::string config_json(const Config& c) {
  nlohmann::json j = nlohmann::json::object();
  j["name"] = c.name;
  for (const auto& k : config_int_keys()) j[k.key] = c.*k.member;
  for (const auto& k : config_real_keys()) j[k.key] = c.*k.member;
  for (const auto& k : config_list_keys()) j[k.key] = c.*k.member;
  j["tie_decoder_kv"] = c.tie_decoder_kv;
  return j.dump();
}

SafetensorsFile weights_safetensors(const WeightsExport& e) {
  check_dtype(e.dtype);
  validate(e.config);
  SafetensorsFile f;
  f.metadata = {{"format", "ced-harness-weights"},
                {"format_version", std::to_string(kSafetensorsFormatVersion)},
                {"generator", e.generator},
                {"config", config_json(e.config)},
                {"weight_seed", std::to_string(e.weight_seed)},
                {"dtype", e.dtype}};
  if (e.dtype == "bf16") f.metadata["bf16_rounding"] = "double -> f32 -> bf16, each round to nearest even";
  for (const TensorSpec& t : weight_specs(e.config, make_plan(e.config))) {
    const std::vector<double> v = generate_tensor(t, e.weight_seed);
    SafetensorsTensor st{t.name, e.dtype == "f64" ? "F64" : e.dtype == "f32" ? "F32" : "BF16", t.shape, {}};
    st.bytes.reserve(v.size() * 8);
    for (double x : v) {
      if (e.dtype == "f64") append(st.bytes, x);
      else if (e.dtype == "f32") append(st.bytes, static_cast<float>(x));
      else append(st.bytes, bf16_bits_of(x));
    }
    f.tensors.push_back(std::move(st));
  }
  if (e.n_tokens > 0) {
    f.metadata["token_seed"] = std::to_string(e.token_seed);
    SafetensorsTensor st{"tokens", "I32", {e.n_tokens}, {}};
    for (int32_t tok : make_tokens(e.token_seed, e.config.vocab_size, e.n_tokens)) append(st.bytes, tok);
    f.tensors.push_back(std::move(st));
  }
  return f;
}

void write_weights_export(const std::filesystem::path& path, const WeightsExport& e, const std::string& format) {
  if (format == "safetensors") return write_safetensors(path, weights_safetensors(e));
  if (format != "h5") throw InputError(fmt::format("--format: '{}' is not safetensors or h5", format));
  check_dtype(e.dtype);
  RunFile f;  // a run file without runs (docs/spec.md §9.1 /weights, /inputs/tokens)
  f.generator = e.generator;
  f.config = e.config;
  f.weight_seed = e.weight_seed;
  f.token_seed = e.token_seed;
  f.weights_dtype = e.dtype;
  if (e.n_tokens > 0) f.tokens = make_tokens(e.token_seed, e.config.vocab_size, e.n_tokens);
  write_run_file(path, f);
}

}  // namespace ced
