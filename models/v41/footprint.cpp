// docs/v41.md §11.7: what a checkpoint weighs before anything is read, and the digest that names its
// tensors' bytes (the golden files record it, so a test can prove it regenerated the same weights).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"

namespace ced::v41 {

V41Footprint v41_footprint(const V41Config& config) {
  // The text model only: the vision tower and the DSpark stages are not part of a prefill, and the
  // schema refuses vision (docs/v41.md §11.1).
  V41Config c = config;
  c.vision_n_layers = 0;
  c.compress_ratios.resize(static_cast<size_t>(c.n_layers));
  c.n_mtp_layers = 0;
  c.dspark_block_size = 0;
  c.dspark_target_layer_ids.clear();
  V41Footprint f;
  for (const auto& t : v41_schema(c)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const int64_t bytes_per = t.dtype == "BF16" ? 2 : t.dtype == "F32" ? 4 : 1;
    f.stored_bytes += n * bytes_per;
    if (t.format != V41Format::Scale) f.parameters += t.format == V41Format::Fp4K32 ? 2 * n : n;
  }
  return f;
}

void check_v41_fits_in_memory(const V41Config& c) {
  const V41Footprint f = v41_footprint(c);
  // The reference holds the stored bytes while it dequantizes, then one double per parameter and its
  // linears' packed copy (docs/v41.md §8.1: fp32, or a double under f64): 16 bytes at most.
  const double need = static_cast<double>(f.stored_bytes) + 16.0 * static_cast<double>(f.parameters);
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (c.analytic_only || need > 0.8 * have)
    throw InputError(fmt::format(
        "config {}: {:.4g} billion parameters ({:.1f} GiB as stored); the reference needs about {:.1f} GiB to run "
        "it, this machine has {:.1f} GiB{}",
        c.name, static_cast<double>(f.parameters) / 1e9, static_cast<double>(f.stored_bytes) / (1 << 30),
        need / (1 << 30), have / (1 << 30),
        c.analytic_only ? ": the released sizes are for the oracle and memory estimates only" : ""));
}

void boost_v41_weight(V41Checkpoint& ckpt, const std::string& weight, int k) {
  const std::string suffix = ".weight";
  if (weight.size() <= suffix.size() || weight.compare(weight.size() - suffix.size(), suffix.size(), suffix) != 0)
    throw InputError(fmt::format("--boost: '{}' is not a weight (NAME.weight)", weight));
  const std::string scale = weight.substr(0, weight.size() - suffix.size()) + ".scale";
  for (auto& t : ckpt.weights.tensors) {
    if (t.name != scale) continue;
    if (t.dtype != "F8_E8M0") throw InputError(fmt::format("--boost: '{}' is {}, not F8_E8M0", scale, t.dtype));
    for (uint8_t& b : t.bytes) {
      const int v = static_cast<int>(b) + k;
      if (v < 0 || v > 254) throw InputError(fmt::format("--boost: a scale of '{}' would leave the E8M0 range", weight));
      b = static_cast<uint8_t>(v);
    }
    return;
  }
  throw InputError(fmt::format("--boost: '{}' has no scale tensor '{}'", weight, scale));
}

void apply_v41_boost(V41Checkpoint& ckpt, const std::string& spec) {
  const size_t eq = spec.find('=');
  int k = 0;
  size_t used = 0;
  try {
    if (eq != std::string::npos) k = std::stoi(spec.substr(eq + 1), &used);
  } catch (const std::exception&) {
    k = 0;
  }
  if (k == 0 || eq + 1 + used != spec.size())
    throw InputError(fmt::format("--boost: '{}' is not TENSOR=K with an integer K != 0", spec));
  boost_v41_weight(ckpt, spec.substr(0, eq), k);
}

std::string v41_weights_digest(const SafetensorsFile& f) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a 64
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001B3ull;
  };
  std::vector<const SafetensorsTensor*> order;
  for (const auto& t : f.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (const SafetensorsTensor* p : order) {
    const SafetensorsTensor& t = *p;
    mix(t.name.data(), t.name.size());
    mix(t.dtype.data(), t.dtype.size());
    mix(t.shape.data(), t.shape.size() * sizeof(int64_t));
    mix(t.bytes.data(), t.bytes.size());
  }
  return fmt::format("{:016x}", h);
}

}  // namespace ced::v41
