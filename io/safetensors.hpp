#pragma once
// docs/spec.md §9.4: the safetensors format (the layout PyTorch users load with
// one call, `safetensors.torch.load_file`): an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then
// the raw little-endian data. Written deterministically (tensors sorted by
// name, the header padded with spaces to a multiple of 8 bytes) and
// atomically; read with one-line InputErrors naming the file and the object.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace ced {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // "F32" | "F64" | "BF16" | "I32" | "I8" | "F8_E4M3" | "F8_E8M0"
  std::vector<int64_t> shape;   // row-major
  std::vector<uint8_t> bytes;   // numel * dtype size, little-endian
  int64_t numel() const;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;  // __metadata__ (string values only)
  std::vector<SafetensorsTensor> tensors;       // any order; written and read sorted by name
  const SafetensorsTensor* find(const std::string& name) const;  // nullptr if absent
};

// Bytes per element of a safetensors dtype; InputError for one this module does not know.
int64_t safetensors_dtype_size(const std::string& dtype);

// The exact bytes of the file (deterministic); InputError on a malformed tensor.
std::string safetensors_bytes(const SafetensorsFile& f);
// safetensors_bytes written atomically (a temporary file next to `path`, then a rename).
void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& f);
// Parses and checks every byte range (in bounds, contiguous, covering the data,
// matching dtype x shape); "cannot read 'F': <object>: <why>".
SafetensorsFile read_safetensors(const std::filesystem::path& path);
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& origin);

// A tensor's values as doubles (F32, F64, BF16, I32 and I8 exactly); an F8 tensor's bytes are codes whose
// value needs their scale tensor, and are an InputError here.
std::vector<double> safetensors_values(const SafetensorsTensor& t);

}  // namespace ced
