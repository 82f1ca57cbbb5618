#pragma once
// The judge of two v41 run files (docs/v41.md §12.7, §12.8): what `ced diff A.h5 B.h5` prints and ced.compare
// returns. Two full prefills: A (under test) judged op by op against B (the reference) by the sound gate's bounds
// (docs/sound-bounds.md) where A's inputs to the op are B's bit for bit, the rest listed as not judged. A CED or
// resumed prefill on either side: every tensor compared bit for bit at the positions both hold, the family's
// claim judged (an exact replay's last position and decode steps are the full prefill's).
#include <string>

namespace ced::v41 {

struct V41DiffOptions {
  std::string a, b;        // the run files, read as a user's files (io/untrusted.hpp)
  std::string checkpoint;  // the weights the judge needs: a release-layout folder, or "" for B's weight seed
  bool verbose = false;    // every tensor's row and the ops not judged
};
struct V41DiffReport {
  bool pass = false;  // nothing judged fails (a CED file: the claim holds)
  std::string text;   // the report, as `ced diff` prints it
};
// InputError (one line) for files of other models, regimes or prompts, or a checkpoint of other weights.
V41DiffReport v41_diff(const V41DiffOptions& o);

}  // namespace ced::v41
