#pragma once
// A deterministic reader over a fuzzer's input bytes: every choice a target
// makes (a config key, a length, a value) is read from here, so one input
// file always decodes to the same case. Past the end it reads zeros, so a
// short input is still a valid (small, default) case and libFuzzer's
// mutations of a long one change single choices.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

namespace ced::fuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t remaining() const { return size_ - pos_; }
  bool exhausted() const { return pos_ >= size_; }

  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }

  // Little-endian, zeros past the end.
  uint64_t u64(int n_bytes = 8) {
    uint64_t v = 0;
    for (int i = 0; i < n_bytes; ++i) v |= uint64_t(byte()) << (8 * i);
    return v;
  }

  bool flag() { return (byte() & 1) != 0; }

  // An integer in [lo, hi] (inclusive; lo <= hi). Reads one byte for spans up
  // to 256, two up to 65536, else eight.
  int64_t range(int64_t lo, int64_t hi) {
    const uint64_t span = uint64_t(hi) - uint64_t(lo) + 1;  // 0: the whole int64 range
    const int n = span != 0 && span <= 256 ? 1 : span != 0 && span <= 65536 ? 2 : 8;
    const uint64_t v = u64(n);
    return int64_t(uint64_t(lo) + (span == 0 ? v : v % span));
  }

  // One of the given values.
  template <class T>
  T pick(std::initializer_list<T> values) {
    return *(values.begin() + range(0, int64_t(values.size()) - 1));
  }
  template <class T>
  T pick(const std::vector<T>& values) {
    return values[size_t(range(0, int64_t(values.size()) - 1))];
  }

  // The next 8 bytes as a double, bit for bit.
  double raw_double() { return std::bit_cast<double>(u64(8)); }

  // Everything not read yet; the reader is then exhausted.
  std::span<const uint8_t> rest() {
    const std::span<const uint8_t> s(data_ + pos_, size_ - pos_);
    pos_ = size_;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace ced::fuzz
