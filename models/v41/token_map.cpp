// docs/v41.md §11.3: the Engram token map of a v41 checkpoint folder and the stub tokenizer that
// defines it.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "models/v41/checkpoint.hpp"

namespace ced::v41 {
namespace {

// The stub vocabulary: id 2k is "tok{k}", id 2k+1 is "  TOK{k}". The official normalizer (NFKC, NFD,
// strip accents, lowercase, collapse whitespace, strip) sends both to "tok{k}".
std::string stub_text(int64_t id) { return id % 2 == 0 ? fmt::format("tok{}", id / 2) : fmt::format("  TOK{}", id / 2); }

// A byte in the byte-level BPE alphabet (GPT-2's table): the printable bytes '!'..'~', 0xA1..0xAC and
// 0xAE..0xFF stand for themselves, the others for 256, 257, ... in byte order. UTF-8 encoded.
std::string byte_level(unsigned char b) {
  auto printable = [](int x) { return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE); };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x) cp += printable(x) ? 0 : 1;
  }
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

nlohmann::ordered_json stub_tokenizer(const V41Config& c) {
  using ojson = nlohmann::ordered_json;
  ojson vocab = ojson::object();
  for (int64_t id = 0; id < c.vocab_size; ++id) {
    std::string key;
    for (unsigned char ch : stub_text(id)) key += byte_level(ch);
    vocab[key] = id;
  }
  const ojson byte_level_pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                {"use_regex", true}};
  const ojson byte_level_dec = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                                {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", ojson::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level_pre},
          {"post_processor", nullptr},
          {"decoder", byte_level_dec},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", ojson::array()}}}};
}

}  // namespace

V41EngramHashing v41_checkpoint_hashing(const V41Config& c) {
  if (c.engram_layer_ids.empty()) return {};
  return {v41_engram_token_map(c), v41_engram_multipliers(c)};
}

std::vector<int64_t> v41_engram_token_map(const V41Config& c) {
  std::vector<int64_t> map(size_t(c.vocab_size));
  for (int64_t id = 0; id < c.vocab_size; ++id) map[size_t(id)] = id / 2;
  return map;
}

std::string v41_stub_tokenizer_json(const V41Config& c) { return stub_tokenizer(c).dump(2) + "\n"; }

// Used by the writer and the reader (checkpoint_read.cpp): the config's compressed vocabulary must be
// the stub map's, and tokenizer.json must be the stub tokenizer.
void check_v41_token_map_size(const V41Config& c, const std::string& origin) {
  const int64_t size = (c.vocab_size + 1) / 2;
  if (!c.engram_layer_ids.empty() && c.engram_compressed_vocab_size != size)
    throw InputError(fmt::format("v41 checkpoint: {}: engram_compressed_vocab_size: {}, the stub tokenizer's token map "
                                 "(id -> id / 2) has {} ids",
                                 origin, c.engram_compressed_vocab_size, size));
}

void check_v41_stub_tokenizer(const std::string& text, const std::string& origin, const V41Config& c) {
  nlohmann::json got;
  try {
    got = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("v41 checkpoint: {}: not JSON ({})", origin, e.what()));
  }
  const nlohmann::json want = nlohmann::json::parse(v41_stub_tokenizer_json(c));
  if (got == want) return;
  const nlohmann::json patch = nlohmann::json::diff(want, got);
  throw InputError(fmt::format("v41 checkpoint: {}: {}: differs from the stub tokenizer of vocab_size {} ({} "
                               "difference(s); the token map must be id -> id / 2)",
                               origin, patch.at(0).at("path").get<std::string>(), c.vocab_size, patch.size()));
}

}  // namespace ced::v41
