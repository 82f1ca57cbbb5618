// docs/spec.md §9.4: safetensors files; see safetensors.hpp.
#include "io/safetensors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <compare>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/atomic_write.hpp"
#include "model/error.hpp"

namespace ced {
namespace {

using json = nlohmann::json;
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so is this build");

// A header larger than this is refused before it is allocated (the Rust
// reference implementation's own limit is 100 MB).
constexpr uint64_t kMaxHeader = 100'000'000;

[[noreturn]] void fail(const std::string& obj, const std::string& why) {
  throw InputError(fmt::format("{}: {}", obj, why));
}

std::vector<const SafetensorsTensor*> sorted_by_name(const SafetensorsFile& f) {
  std::vector<const SafetensorsTensor*> v;
  for (const auto& t : f.tensors) v.push_back(&t);
  std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i]->name == v[i - 1]->name) fail(v[i]->name, "two tensors have this name");
  return v;
}

int64_t checked_numel(const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) fail(name, fmt::format("shape has a negative dimension {}", s));
    if (s != 0 && n > (int64_t(1) << 50) / s) fail(name, "shape is too large");
    n *= s;
  }
  return n;
}

}  // namespace

int64_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16") return 2;
  // The release checkpoint's scaled formats (docs/v41.md §2): FP8 codes, their power-of-two scales, and
  // packed FP4 pairs stored as I8.
  if (dtype == "F8_E4M3" || dtype == "F8_E8M0" || dtype == "I8") return 1;
  fail("dtype", fmt::format("'{}' is not one of F64, F32, BF16, I32, I8, F8_E4M3, F8_E8M0", dtype));
}

int64_t SafetensorsTensor::numel() const { return checked_numel(name, shape); }

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string safetensors_bytes(const SafetensorsFile& f) {
  // nlohmann's json object is a std::map: keys are serialised sorted, so the
  // header text is a function of the content alone.
  json header = json::object();
  if (!f.metadata.empty()) header["__metadata__"] = f.metadata;
  uint64_t offset = 0;
  const auto tensors = sorted_by_name(f);
  for (const SafetensorsTensor* t : tensors) {
    if (t->name.empty() || t->name == "__metadata__") fail(t->name, "is not a tensor name");
    const int64_t size = t->numel() * safetensors_dtype_size(t->dtype);
    if (int64_t(t->bytes.size()) != size)
      fail(t->name, fmt::format("holds {} bytes, its dtype and shape need {}", t->bytes.size(), size));
    header[t->name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {offset, offset + uint64_t(size)}}};
    offset += uint64_t(size);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  out += text;
  out.reserve(out.size() + offset);
  for (const SafetensorsTensor* t : tensors) out.append(reinterpret_cast<const char*>(t->bytes.data()), t->bytes.size());
  return out;
}

void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& f) {
  std::string bytes;
  try {
    bytes = safetensors_bytes(f);
  } catch (const InputError& e) {
    throw InputError(fmt::format("cannot write '{}': {}", path.string(), e.what()));
  }
  write_bytes_atomically(path, bytes);
}

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& origin) {
  try {
    if (bytes.size() < 8) fail("header", fmt::format("the file has {} bytes, fewer than the 8 of the header length", bytes.size()));
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    if (n > kMaxHeader || n > bytes.size() - 8)
      fail("header", fmt::format("claims {} bytes, the file has {} after the length", n, bytes.size() - 8));
    json header;
    try {
      header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + int64_t(n));
    } catch (const json::exception& e) {
      fail("header", fmt::format("is not JSON ({})", e.what()));
    }
    if (!header.is_object()) fail("header", "is not a JSON object");
    const uint64_t data_size = bytes.size() - 8 - n;
    const char* data = bytes.data() + 8 + n;
    SafetensorsFile f;
    struct Range {
      uint64_t b, e;
      std::string name;
      auto operator<=>(const Range&) const = default;
    };
    std::vector<Range> ranges;
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) fail(name, "is not a JSON object");
        for (const auto& [k, v] : entry.items()) {
          if (!v.is_string()) fail("__metadata__/" + k, "is not a string");
          f.metadata[k] = v.get<std::string>();
        }
        continue;
      }
      if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
        fail(name, "needs dtype, shape and data_offsets");
      const json &dt = entry["dtype"], &sh = entry["shape"], &off = entry["data_offsets"];
      if (!dt.is_string()) fail(name + "/dtype", "is not a string");
      SafetensorsTensor t;
      t.name = name;
      t.dtype = dt.get<std::string>();
      try {
        safetensors_dtype_size(t.dtype);
      } catch (const InputError& e) {
        fail(name, e.what());
      }
      if (!sh.is_array()) fail(name + "/shape", "is not an array");
      for (const json& d : sh) {
        if (!d.is_number_unsigned()) fail(name + "/shape", "holds something other than a non-negative integer");
        if (d.get<uint64_t>() > (uint64_t(1) << 50)) fail(name + "/shape", "has a dimension that is too large");
        t.shape.push_back(d.get<int64_t>());
      }
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        fail(name + "/data_offsets", "is not two non-negative integers");
      const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
      const uint64_t need = uint64_t(t.numel() * safetensors_dtype_size(t.dtype));
      if (b > e || e > data_size)
        fail(name + "/data_offsets", fmt::format("[{}, {}] is outside the {} bytes of data (truncated?)", b, e, data_size));
      if (e - b != need)
        fail(name + "/data_offsets", fmt::format("[{}, {}] holds {} bytes, dtype {} and its shape need {}", b, e, e - b,
                                                 t.dtype, need));
      t.bytes.assign(reinterpret_cast<const uint8_t*>(data + b), reinterpret_cast<const uint8_t*>(data + e));
      ranges.push_back({b, e, name});
      f.tensors.push_back(std::move(t));
    }
    // The byte ranges tile the data exactly (docs/spec.md §9.4): in order of
    // their begin, each starts where the one before it ends, the first at 0,
    // and the last ends at the end of the data. A refusal names the tensors.
    std::sort(ranges.begin(), ranges.end());
    auto named = [](const Range& r) { return fmt::format("'{}' [{}, {}]", r.name, r.b, r.e); };
    const Range* prev = nullptr;
    for (const Range& r : ranges) {
      const uint64_t at = prev ? prev->e : 0;
      if (r.b < at) fail("data_offsets", fmt::format("{} overlaps {}", named(r), named(*prev)));
      if (r.b > at)
        fail("data_offsets", prev ? fmt::format("{} bytes between {} and {} belong to no tensor", r.b - at, named(*prev),
                                                named(r))
                                  : fmt::format("{} bytes before {}, the first tensor, belong to no tensor", r.b, named(r)));
      prev = &r;
    }
    const uint64_t end = prev ? prev->e : 0;
    if (end != data_size)
      fail("data", fmt::format("{} bytes follow the last tensor's data ({})", data_size - end,
                               prev ? named(*prev) + " ends at byte " + std::to_string(end) : "the header names no tensor"));
    std::sort(f.tensors.begin(), f.tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return f;
  } catch (const InputError& e) {
    throw InputError(fmt::format("cannot read '{}': {}", origin, e.what()));
  }
}

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  if (!in || std::filesystem::is_directory(path, ec))
    throw InputError(fmt::format("cannot read '{}': no such file", path.string()));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_safetensors(bytes, path.string());
}

std::vector<double> safetensors_values(const SafetensorsTensor& t) {
  if (t.dtype == "F8_E4M3" || t.dtype == "F8_E8M0")
    throw InputError(fmt::format("tensor '{}': {} holds codes of a block-scaled format, not values; decode it with "
                                 "its scales",
                                 t.name, t.dtype));
  const int64_t n = t.numel();
  std::vector<double> v(size_t(n), 0.0);
  const uint8_t* p = t.bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    // memcpy: the bytes carry no alignment promise.
    if (t.dtype == "F64") {
      double x;
      std::memcpy(&x, p + 8 * i, 8);
      v[size_t(i)] = x;
    } else if (t.dtype == "F32") {
      float x;
      std::memcpy(&x, p + 4 * i, 4);
      v[size_t(i)] = x;
    } else if (t.dtype == "I32") {
      int32_t x;
      std::memcpy(&x, p + 4 * i, 4);
      v[size_t(i)] = x;
    } else if (t.dtype == "I8") {
      v[size_t(i)] = double(int8_t(p[i]));
    } else {  // BF16: the upper half of a float
      uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      v[size_t(i)] = std::bit_cast<float>(uint32_t(b) << 16);
    }
  }
  return v;
}

}  // namespace ced
