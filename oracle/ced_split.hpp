#pragma once
// docs/spec.md §7.2: the seed design's framing of a CED split, the same for every model family. It
// knows only the split — L layers, the first decoder layer E, D = L - E decoder layers, the window W —
// so the lab's oracle (oracle/analytic.hpp) and the release's (oracle/v41_oracle.hpp) print the same
// figures from the same code, each from its own plan.
#include <cstdint>
#include <string>

namespace ced {

struct CedSplit {
  int64_t L = 0, E = 0, D = 0, W = 0;
};

// The replay spans and the decoder's work for the last position, in position-layers.
struct SeedFigures {
  int64_t exact_replay = 0;         // R = 1 + D(W-1): the last position exact
  int64_t report_upper = 0;         // D·W, the report's upper estimate
  int64_t exact_decode_replay = 0;  // D(W-1): every local entry a decode step reads exact
  int64_t work_triangle = 0;        // D + (W-1)·D(D-1)/2: layer E+k needs 1 + (D-1-k)(W-1) positions
  int64_t work_rectangle = 0;       // R·D: every decoder layer over the exact span
  int64_t work_bounded = 0;         // W·D: every decoder layer over the window
  bool operator==(const SeedFigures&) const = default;
};
SeedFigures seed_figures(const CedSplit& s);

// B = min(N, W), the bounded replay.
int64_t bounded_replay(const CedSplit& s, int64_t N);
// (N·E + B·D) / (N·L): every layer costs the same per position, the encoder runs on all N, the
// decoder on B. N >= 1 (InputError otherwise).
double ideal_ratio(const CedSplit& s, int64_t N);

// The spans and work as the oracle tables print them: two headed blocks of aligned lines.
std::string format_seed_figures(const SeedFigures& f);
// One aligned line of an oracle table: "  what   value".
std::string oracle_line(const std::string& what, const std::string& value);
// A ratio as the tables print it: "50.195 %".
std::string oracle_percent(double x);

}  // namespace ced
