// docs/spec.md §7.2: the seed design's framing of a CED split. See ced_split.hpp.
#include "oracle/ced_split.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "model/error.hpp"

namespace ced {

SeedFigures seed_figures(const CedSplit& s) {
  SeedFigures f;
  f.exact_replay = 1 + s.D * (s.W - 1);
  f.report_upper = s.D * s.W;
  f.exact_decode_replay = s.D * (s.W - 1);
  // Decoder layer E+k needs 1 + (D-1-k)(W-1) positions for the last one: a triangle.
  f.work_triangle = s.D + (s.W - 1) * s.D * (s.D - 1) / 2;
  f.work_rectangle = f.exact_replay * s.D;
  f.work_bounded = s.W * s.D;
  return f;
}

int64_t bounded_replay(const CedSplit& s, int64_t N) { return std::min(N, s.W); }

double ideal_ratio(const CedSplit& s, int64_t N) {
  if (N < 1) throw InputError(fmt::format("oracle: N must be >= 1 (got {})", N));
  const double B = double(bounded_replay(s, N));
  return (double(N) * double(s.E) + B * double(s.D)) / (double(N) * double(s.L));
}

std::string oracle_line(const std::string& what, const std::string& value) {
  return fmt::format("  {:<46} {}\n", what, value);
}

std::string oracle_percent(double x) { return fmt::format("{:.3f} %", 100.0 * x); }

std::string format_seed_figures(const SeedFigures& f) {
  std::string s = "decoder replay spans (positions)\n";
  s += oracle_line("exact replay R = 1 + D(W-1)", fmt::format("{:>12}", f.exact_replay));
  s += oracle_line("report's upper estimate D·W", fmt::format("{:>12}", f.report_upper));
  s += oracle_line("exact-decode bound D(W-1)", fmt::format("{:>12}", f.exact_decode_replay));
  s += "decoder work for the last position (position-layers)\n";
  s += oracle_line("triangle D + (W-1)·D(D-1)/2", fmt::format("{:>12}", f.work_triangle));
  s += oracle_line("rectangle R·D", fmt::format("{:>12}", f.work_rectangle));
  s += oracle_line("bounded W·D", fmt::format("{:>12}", f.work_bounded));
  return s;
}

}  // namespace ced
