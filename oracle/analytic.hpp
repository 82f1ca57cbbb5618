#pragma once
// docs/spec.md §7: the analytic oracle. Closed-form predictions of the CED replay
// spans, work, cache sizes and exactness cone, and the FLOP ratio of a ced
// prefill against a full one from the FLOP model (oracle/analytic_flops.hpp).
// `ced oracle` prints this table; the property tests use the predictions.
// Every figure here is computed from the config and the spec's rules alone,
// never from models/lab/schedule.hpp or a backend: it is an independent
// prediction that the checks (checks/ced_checks.hpp) hold the measured
// spans, cone and FLOP counts against.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"
#include "oracle/analytic_flops.hpp"
#include "oracle/ced_split.hpp"

namespace ced {

// ---- Exactness cone (docs/spec.md §4) -------------------------------------------------
// Decoder layer E+k (k = 0..D-1) output at p equals the full mode's bitwise iff
// s = 0 or p - (k+1)(W-1) >= s, s the replay start. InputError if k is out of range.
bool cone_exact(const Plan& plan, int64_t k, int64_t p, int64_t s);
// Smallest replay B for which decoder layer E+k is exact at the last position:
// 1 + (k+1)(W-1) (before min(N, .)).
int64_t cone_min_replay(const Plan& plan, int64_t k);
// Smallest replay B whose last-position logits are exact for a prompt of N:
// min(N, R), R = 1 + D(W-1) (B = N means s = 0).
int64_t predicted_min_exact_replay(const Plan& plan, int64_t N);
// Smallest replay B for which every decoder local entry a following decode step
// reads is exact: B >= D(W-1) or s = 0, i.e. min(N, D(W-1)); at least 1, the
// smallest replay there is (W = 1 makes every replay exact).
int64_t predicted_min_exact_decode_replay(const Plan& plan, int64_t N);

// ---- Ratios (docs/spec.md §0, §7) -----------------------------------------------------
// The plan's split, for oracle/ced_split.hpp.
CedSplit ced_split(const Plan& plan);
// Bounded replay B = min(N, W).
int64_t bounded_replay(const Plan& plan, int64_t N);
// (N·E + B·D) / (N·L); 1/2 + B/(2N) for E = D.
double ideal_ratio(const Plan& plan, int64_t N);
// FLOP model: ced (bounded replay) / full, both producing only the last
// position's logits, no decode.
struct RatioFlops {
  int64_t full = 0;
  int64_t ced = 0;
  double ratio() const { return double(ced) / double(full); }
};
RatioFlops exact_ratio_flops(const Config& c, const Plan& plan, int64_t N);

// ---- The table ------------------------------------------------------------------
struct OracleRow {  // one prompt length N
  int64_t n_prompt = 0;      // N
  int64_t bounded_replay = 0;  // B = min(N, W)
  double ideal_ratio = 0;      // (N·E + B·D) / (N·L)
  double exact_ratio = 0;      // ced_flops / full_flops
  int64_t full_flops = 0;      // full prefill, last logits only
  int64_t ced_flops = 0;       // ced bounded prefill, last logits only
};

struct ConeRow {  // one decoder layer E+k
  int64_t k = 0;
  int64_t layer = 0;       // E + k
  int64_t min_replay = 0;  // B_k = 1 + (k+1)(W-1): exact at the last position iff B >= B_k (or s = 0)
};

struct EncoderReplaySpans {  // docs/spec.md §6/§7, for a prefix P
  int64_t prefix_len = 0;          // P
  int64_t bounded_span = 0;        // min(P, W)
  int64_t bounded_work = 0;        // E · min(P, W) position-layers
  int64_t exact_local_span = 0;    // E(W-1): the local entries the next position reads
  int64_t exact_hidden_span = 0;   // 1 + E(W-1): an exact H_E at P-1
};

struct OracleTable {
  std::string config_name;
  int64_t L = 0, E = 0, D = 0, W = 0;
  SeedFigures seed;  // the spans R, D·W, D(W-1) and the decoder's work (oracle/ced_split.hpp)
  std::vector<OracleRow> rows;
  int64_t n_layers_cache = 0;                 // L per-layer copies without CED
  double cache_copies = 0;                    // Σ over kv sources of 1/r
  double cache_elements_per_token = 0;        // Σ over kv sources (head_dim + index_head_dim)/r
  double cache_bytes_per_token_bf16 = 0;      // × 2
  double cache_bytes_per_token_f32 = 0;       // × 4
  int64_t local_entries_elements = 0;         // L·W·head_dim, independent of N
  std::vector<ConeRow> cone;                  // k = 0..D-1
  std::optional<EncoderReplaySpans> spans;    // when a prefix is given
};

// Ns must be >= 1; prefix (P) >= 0. InputError otherwise.
OracleTable oracle_table(const Config& c, std::vector<int64_t> Ns, std::optional<int64_t> prefix);
std::string format_oracle_table(const OracleTable& t);
std::string oracle_table_json(const OracleTable& t);

}  // namespace ced
