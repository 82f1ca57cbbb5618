#pragma once
// The CED properties (SPEC §4–§7) as checks on one model and one input: each
// returns "" when the property holds, else what broke. The RapidCheck suite
// feeds them generated configs and lengths; the fault kill table runs every
// check against every fault; `ced verify` runs them on the default config.
#include <functional>
#include <string>

#include "property-tests/harness.hpp"

namespace ced::prop {

std::string check_replay_full_equals_full(const Model& m, int64_t N);
std::string check_cone(const Model& m, int64_t N, int64_t K);
std::string check_min_exact_replay(const Model& m, int64_t N);
std::string check_decode_bound(const Model& m, int64_t N, int64_t steps);
std::string check_bounded_equals_exact_short(const Model& m, int64_t N);
std::string check_source_only_write(const Model& m, int64_t N);
std::string check_reuse_selection(const Model& m, int64_t N);
std::string check_shared_kv(const Config& c, int64_t N, Fault fault = Fault::None);
std::string check_resume_short_prefix(const Model& m, int64_t N, int64_t P);
std::string check_resume_saved_cache(const Model& m, int64_t N, int64_t P);
std::string check_flops(const Model& m, int64_t N);
std::string check_decode_equals_prefill(const Model& m, int64_t N, int64_t K);

// Spans found on the model by search over replay length (SPEC §4, §6).
struct Spans {
  int64_t exact_last = -1;        // min B: last logits exact (dependency probe)
  int64_t exact_decode = -1;      // min B: decode logits exact (dependency probe)
  int64_t numeric_last = -1;      // min B: last logits bitwise equal to full mode's, plain arithmetic
  int64_t enc_exact_hidden = -1;  // min encoder replay: exact H_E at P-1 (probe); -1 without a prefix
  int64_t enc_exact_next = -1;    // min encoder replay: exact H_E at P, the first new position (probe)
};
// N prompt tokens; P > 0 also searches the encoder resume spans (needs N > P).
// `progress` (optional) hears one line per probe run.
Spans empirical_spans(const Model& m, int64_t N, int64_t P,
                      const std::function<void(const std::string&)>& progress = {});

}  // namespace ced::prop
