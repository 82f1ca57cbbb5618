#pragma once
// The prompt lengths at which a v41 config's own constants change what a layer does (docs/v41.md §13.10):
// where ports have broken in the field, and so the lengths a test must reach (the golden set, the property
// suites, the fuzzers, the official-code sweeps). Each constant K gives K − 1, K and K + 1.
#include <cstdint>
#include <string>
#include <vector>

#include "models/v41/config.hpp"
#include "models/v41/plan.hpp"

namespace ced::v41 {

struct V41BoundaryLength {
  int64_t n = 0;
  std::vector<std::string> why;  // each constant that puts a boundary here: "W = 128", "W + 1", ...
};

// Ascending and distinct, every length at least 1: around the window W and 2W; index_topk × ratio of each
// index source's ratio (where its selection stops being every group); the candidate pool (blocks × block size
// groups at the candidate source's ratio); each ratio's first whole group and the group edges of the pool and
// of the top-k; YaRN's original_seq_len where a layer uses it; Engram's n-gram size; each replay convention's
// exact span.
std::vector<V41BoundaryLength> v41_boundary_lengths(const V41Config& c, const V41Plan& p);

}  // namespace ced::v41
