#pragma once
// docs/v41.md §13.5: the replay spans of a convention found on the model, beside the ones the plan
// states (v41_exact_span, v41_exact_decode_span). Three searches over the replayed rows K of one prompt:
// the fewest for which the last position's logits are finite under the floor probe (its cone replayed),
// the fewest for which the next decode step's are, and the fewest for which the last logits are bitwise
// the full prefill's (where rounding may absorb the cone's far end: at most the probe's).
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "reference/v41/forward.hpp"

namespace ced::v41 {

struct V41FoundSpans {
  // Each -1 when even every row replayed fails (model/bisect.hpp).
  int64_t last_probe = 0;    // the last position's cone, found with the floor probe
  int64_t decode_probe = 0;  // the next decode step's cone
  int64_t last_bitwise = 0;  // the last logits bitwise the prefill's (binary search: from some K on)
  bool bitwise_at_probe = false;  // the replay of last_probe rows bitwise the prefill's (its cone is whole)
  int64_t runs = 0;          // replays run (each K once per search kind)
};

// Searches a prompt of tokens.size() - 1 rows (the last token is the decode step's) under the convention.
// The model's floor probe is switched on for the probe searches and restored. progress: one line a call.
V41FoundSpans v41_empirical_spans(V41Model& m, std::span<const int64_t> tokens, const V41EngramHashing& hashing,
                                  const V41ReplayConvention& convention,
                                  const std::function<void(const std::string&)>& progress = {});

// The encoder replay span after a prefix-cache hit at H (docs/v41.md §13.8), found: the fewest window rows
// K rebuilt before the hit for which a full-mode resume's last logits are finite under the floor probe, and
// the fewest for which they are the cold prefill's bits. The prompt must reach far enough past the hit for
// the last position's own window cone (L (W - 1) rows) to start after the rebuilt rows.
struct V41FoundEncoderSpan {
  int64_t probe = 0, bitwise = 0;  // -1 when even K = H fails
  bool bitwise_at_probe = false;
  int64_t runs = 0;
};
V41FoundEncoderSpan v41_empirical_encoder_span(V41Model& m, std::span<const int64_t> prompt,
                                               const V41EngramHashing& hashing, int64_t H,
                                               const std::function<void(const std::string&)>& progress = {});

}  // namespace ced::v41
