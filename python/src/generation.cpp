// ced._core's generation-level verdicts (docs/spec.md §8.7, compare/generation.hpp):
// the KL distribution of two logits tensors, vLLM's greedy rule and the greedy
// agreement over prompts, each the C++ function `ced diff` uses, with numpy in and
// dicts out. Bad input is ced._core.InputError (core.cpp translates InputError).
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <span>
#include <utility>
#include <vector>

#include "compare/generation.hpp"
#include "model/error.hpp"

namespace py = pybind11;
using namespace ced;

namespace {

using Logits = py::array_t<double, py::array::c_style | py::array::forcecast>;

// A [rows, V] logits array; `what` names it in messages.
Logits logits_of(const py::handle& h, const char* what) {
  Logits a = Logits::ensure(h);
  if (!a) throw InputError(fmt::format("{}: want a 2-D float64 array", what));
  if (a.ndim() != 2) throw InputError(fmt::format("{}: want a 2-D array [rows, vocab], got {} dimensions", what, a.ndim()));
  return a;
}
std::span<const double> values(const Logits& a) { return {a.data(), static_cast<size_t>(a.size())}; }

// A 1-D integer token array; floats are refused rather than truncated.
std::vector<int64_t> tokens_of(const py::handle& h, const std::string& what) {
  const py::array raw = py::array::ensure(h);
  if (!raw) throw InputError(fmt::format("{}: want a 1-D integer array", what));
  if (raw.size() > 0 && raw.dtype().kind() != 'i' && raw.dtype().kind() != 'u')
    throw InputError(fmt::format("{}: want integer tokens, got dtype {}", what, std::string(py::str(raw.dtype()))));
  if (raw.ndim() != 1) throw InputError(fmt::format("{}: want a 1-D array, got {} dimensions", what, raw.ndim()));
  const auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(raw);
  return {a.data(), a.data() + a.size()};
}

py::dict kl_dict(const KlDistribution& d) {
  py::dict m;
  m["count"] = d.count;
  m["mean"] = d.mean;
  m["p50"] = d.p50;
  m["p99"] = d.p99;
  m["p999"] = d.p999;
  m["max"] = d.max;
  m["p50_row"] = d.p50_row;
  m["p99_row"] = d.p99_row;
  m["p999_row"] = d.p999_row;
  m["max_row"] = d.max_row;
  m["quantile_rule"] = "nearest-rank";
  return m;
}

py::dict greedy_dict(const GreedyDivergence& g) {
  py::dict m;
  m["passed"] = g.pass;
  m["steps"] = g.steps;
  m["top_n"] = g.top_n;
  m["step"] = g.step;
  m["token_a"] = g.token_a;
  m["token_b"] = g.token_b;
  m["rank_a_in_b"] = g.rank_a_in_b;
  m["rank_b_in_a"] = g.rank_b_in_a;
  m["gap_a"] = g.gap_a;
  m["gap_b"] = g.gap_b;
  m["top2_margin_a"] = g.top2_margin_a;
  m["top2_margin_b"] = g.top2_margin_b;
  return m;
}

}  // namespace

void bind_generation(py::module_& m) {
  m.def(
      "kl_distribution",
      [](const py::handle& ref, const py::handle& test) {
        const Logits r = logits_of(ref, "ref"), t = logits_of(test, "test");
        if (r.shape(0) != t.shape(0) || r.shape(1) != t.shape(1))
          throw InputError(fmt::format("kl_distribution: ref is [{}, {}], test is [{}, {}]", r.shape(0), r.shape(1),
                                       t.shape(0), t.shape(1)));
        return kl_dict(kl_distribution(values(r), values(t), r.shape(0), r.shape(1)));
      },
      py::arg("ref"), py::arg("test"),
      "KL(softmax ref || softmax test) per row of two [rows, V] arrays: mean and nearest-rank p50, p99, p99.9, "
      "max, each with the first row attaining it (docs/spec.md §8.7).");
  m.def(
      "greedy_divergence",
      [](const py::handle& tokens_a, const py::handle& logits_a, const py::handle& tokens_b,
         const py::handle& logits_b, int64_t top_n) {
        const Logits la = logits_of(logits_a, "logits_a"), lb = logits_of(logits_b, "logits_b");
        if (la.shape(1) != lb.shape(1))
          throw InputError(fmt::format("greedy_divergence: vocab {} vs {}", la.shape(1), lb.shape(1)));
        return greedy_dict(greedy_divergence(tokens_of(tokens_a, "tokens_a"), values(la),
                                             tokens_of(tokens_b, "tokens_b"), values(lb), la.shape(1), top_n));
      },
      py::arg("tokens_a"), py::arg("logits_a"), py::arg("tokens_b"), py::arg("logits_b"),
      py::arg("top_n") = kGreedyTopN,
      "vLLM's greedy rule: at the first step where the tokens differ, each side's token must be in the other's "
      "top-N; the step, both tokens, their ranks and both margins (docs/spec.md §8.7).");
  m.def(
      "greedy_agreement",
      [](const py::sequence& pairs) {
        std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> seqs;
        for (size_t i = 0; i < pairs.size(); ++i) {
          const py::object item = pairs[i];
          if (!py::isinstance<py::sequence>(item) || py::len(item) != 2)
            throw InputError(fmt::format("greedy_agreement: prompt {} is not a pair (tokens_a, tokens_b)", i));
          const auto pair = py::reinterpret_borrow<py::sequence>(item);
          seqs.emplace_back(tokens_of(pair[0], fmt::format("prompt {} tokens_a", i)),
                            tokens_of(pair[1], fmt::format("prompt {} tokens_b", i)));
        }
        const GreedyAgreement g = greedy_agreement(seqs);
        py::dict d;
        d["prompts"] = g.prompts;
        d["agreeing"] = g.agreeing;
        d["rate"] = g.rate;
        d["mean_prefix"] = g.mean_prefix;
        d["first_disagreeing"] = g.first_disagreeing;
        return d;
      },
      py::arg("sequences"),
      "Over prompts, each a pair of greedy token sequences: the fraction that agree exactly and the mean "
      "length of the shared prefix (docs/spec.md §8.7).");
}
