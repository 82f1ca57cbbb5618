// ced._core: the harness's C++ libraries for Python (python/ced wraps it with
// type hints and docstrings). Every function here calls the code the `ced`
// command runs; nothing is reimplemented. InputError (exit 2 in the CLI) is
// ced._core.InputError, a ValueError; NotSupported is NotSupportedError.
#include <fmt/format.h>
#include <pybind11/eigen.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <cstdio>

#include "python/src/numpy_arrays.hpp"
#include "backends/registry.hpp"
#include "compare/run_compare.hpp"
#include "golden/golden_set.hpp"
#include "models/lab/hdf5_files.hpp"
#include "io/untrusted.hpp"
#include "models/lab/weights_export.hpp"
#include "model/error.hpp"
#include "models/lab/plan.hpp"
#include "models/lab/schedule.hpp"
#include "models/lab/weights.hpp"

namespace py = pybind11;
using namespace ced;

namespace {

using IntMat = Eigen::Matrix<int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

py::array int_array(const std::vector<int64_t>& v) { return python::numpy_array({py::ssize_t(v.size())}, v.data()); }
std::vector<int64_t> int_vector(const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& a) {
  if (a.ndim() != 1) throw InputError(fmt::format("positions: want a 1-D array, got {} dimensions", a.ndim()));
  return {a.data(), a.data() + a.size()};
}
// A row-major matrix copied from an array numpy made C-contiguous in the matrix's dtype. Not pybind11's Eigen
// caster: pybind11 2.10 reads strides in units of an item size taken at numpy 1's descriptor layout, which
// numpy 2 changed (python/src/numpy_arrays.hpp), and crashed there; numpy converts, the copy is plain.
template <class Mat>
Mat matrix_of(const py::array_t<typename Mat::Scalar, py::array::c_style | py::array::forcecast>& a, const char* what) {
  if (a.ndim() != 2) throw InputError(fmt::format("{}: want a 2-D array, got {} dimensions", what, a.ndim()));
  Mat m(a.shape(0), a.shape(1));
  std::copy(a.data(), a.data() + a.size(), m.data());
  return m;
}
template <class Mat>
using MatrixArg = py::array_t<typename Mat::Scalar, py::array::c_style | py::array::forcecast>;

std::vector<int32_t> token_vector(const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& a) {
  if (a.ndim() != 1) throw InputError(fmt::format("tokens: want a 1-D array, got {} dimensions", a.ndim()));
  std::vector<int32_t> v;
  for (py::ssize_t i = 0; i < a.size(); ++i) {
    const int64_t t = a.data()[i];
    if (t < INT32_MIN || t > INT32_MAX) throw InputError(fmt::format("tokens: token {} is {}, outside int32", i, t));
    v.push_back(int32_t(t));
  }
  return v;
}

// A user's engine behind the Backend interface: ced.gate's Python callable,
// called with each golden request; it returns a RunResult (python/ced turns
// dicts and torch tensors into one). `supports` (None when the engine has no
// supports method) answers Backend::supports: "" or why not.
class PythonBackend : public Backend {
 public:
  PythonBackend(py::function call, py::object supports, Config c, uint64_t weight_seed, std::string dtype)
      : call_(std::move(call)), supports_(std::move(supports)), config_(std::move(c)), weight_seed_(weight_seed),
        dtype_(std::move(dtype)) {}
  std::string name() const override { return "python"; }
  std::string dtype() const override { return dtype_; }
  std::string supports(const RunRequest& req) const override {
    return supports_.is_none() ? "" : supports_(config_, weight_seed_, req).cast<std::string>();
  }
  RunResult run(const RunRequest& req) override {
    std::fflush(stdout);  // the gate's lines and the engine's prints in order
    RunResult r = call_(config_, weight_seed_, req).cast<RunResult>();
    std::fflush(stdout);
    return r;
  }

 private:
  py::function call_;
  py::object supports_;
  Config config_;
  uint64_t weight_seed_;
  std::string dtype_;
};

// The attributes-only backend result_for needs.
class NamedBackend : public Backend {
 public:
  NamedBackend(std::string n, std::string d) : n_(std::move(n)), d_(std::move(d)) {}
  std::string name() const override { return n_; }
  std::string dtype() const override { return d_; }
  RunResult run(const RunRequest&) override { throw NotSupported("attributes only"); }

 private:
  std::string n_, d_;
};

py::dict violation_dict(const Violation& v) {
  py::dict d;
  d["threshold"] = v.threshold;
  d["measured"] = v.measured;
  d["limit"] = v.limit;
  d["detail"] = v.detail;
  d["line"] = v.line();
  return d;
}

py::dict metrics_dict(const Comparison& c) {
  py::dict m;
  if (c.tensor) {
    const TensorCompare& t = *c.tensor;
    m["max_abs_err"] = t.max_abs_err;
    m["max_rel_err"] = t.max_rel_err;
    m["rel_l2"] = t.rel_l2;
    m["nmse"] = t.nmse;
    m["cosine"] = t.cosine;
    m["max_ulp"] = t.max_ulp;
    m["mismatches"] = t.mismatches;
    m["min_passing_atol"] = t.min_passing_atol;
    m["nan_pairs"] = t.nan_pairs;
    m["inf_mismatches"] = t.inf_mismatches;
  }
  if (c.logits) {
    m["max_kl"] = c.logits->max_kl;
    m["mean_kl"] = c.logits->mean_kl;
    m["top1_fraction"] = c.logits->top1_fraction;
    m["min_top5_overlap"] = c.logits->min_topk_overlap;
  }
  if (c.selection) {
    m["min_jaccard"] = c.selection->min_jaccard;
    m["mean_jaccard"] = c.selection->mean_jaccard;
    m["invalid_test"] = c.selection->invalid_t;
    m["invalid_reference"] = c.selection->invalid_r;
    m["differing"] = c.selection->differing;
  }
  return m;
}

py::dict run_diff_dict(const RunDiff& d) {
  py::dict out;
  out["run"] = d.run;
  out["passed"] = d.pass();
  out["problems"] = d.problems;
  out["first_divergent_layer"] = d.first_divergent_layer;
  out["first_inexact_layer"] = d.first_inexact_layer;
  py::list tensors;
  for (const TensorDiff& t : d.tensors) {
    py::dict td;
    td["name"] = t.name;
    td["layer"] = t.layer;
    td["passed"] = t.verdict.pass;
    td["bitwise_equal"] = t.bitwise_equal;
    td["worst"] = t.worst();
    td["rule"] = t.verdict.pattern;
    td["reason"] = t.verdict.reason;
    py::list vs;
    for (const Violation& v : t.verdict.violations) vs.append(violation_dict(v));
    td["violations"] = vs;
    td["unchecked"] = t.verdict.unchecked;
    td["metrics"] = metrics_dict(t.comparison);
    tensors.append(td);
  }
  out["tensors"] = tensors;
  out["text"] = format_run_diff(d, false);
  out["text_verbose"] = format_run_diff(d, true);
  return out;
}

Policy policy_of(const std::string& path) { return path.empty() ? exact_policy() : load_policy_file(path); }

}  // namespace

void bind_v41(py::module_& m);         // python/src/v41.cpp
void bind_v41_blocks(py::module_& m);  // python/src/v41_blocks.cpp
void bind_generation(py::module_& m);  // python/src/generation.cpp
void bind_cli(py::module_& m);         // python/src/cli.cpp

PYBIND11_MODULE(_core, m) {
  m.doc() = "The CED harness's C++ libraries (docs/spec.md); use the `ced` package, not this module.";
  static py::exception<InputError> input_error(m, "InputError", PyExc_ValueError);
  static py::exception<NotSupported> not_supported(m, "NotSupportedError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      input_error(e.what());
    } catch (const NotSupported& e) {
      not_supported(e.what());
    }
  });

  // ---- config (docs/spec.md §1) ----
  py::class_<Config> config(m, "Config", "A validated config of docs/spec.md §1 (read-only keys).");
  config.def_readonly("name", &Config::name);
  for (const auto& k : config_int_keys()) config.def_readonly(k.key, k.member);
  for (const auto& k : config_real_keys()) config.def_readonly(k.key, k.member);
  for (const auto& k : config_list_keys()) config.def_readonly(k.key, k.member);
  config.def_readonly("tie_decoder_kv", &Config::tie_decoder_kv)
      .def("to_toml", &to_toml, "Every key as TOML (a file `ced --config` reads back).")
      .def("to_json", &config_json, "Every key and the name as JSON text.")
      .def("__eq__", [](const Config& a, const Config& b) { return to_toml(a) == to_toml(b); })
      .def("__repr__", [](const Config& c) { return fmt::format("ced.Config('{}')", c.name); });
  m.def("load_config", [](const std::string& name, const std::vector<std::string>& overrides) {
    Config c = load_config(name);
    for (const auto& kv : overrides) c = with_override(c, kv);
    return c;
  });
  m.def("with_overrides", [](Config c, const std::vector<std::string>& overrides) {
    for (const auto& kv : overrides) c = with_override(c, kv);
    return c;
  });
  m.def("builtin_names", &builtin_names);
  m.def("backend_names", [] { return backend_names_of_family("lab"); });  // what ced.run accepts

  // ---- weights and tokens (docs/spec.md §2) ----
  m.def("weights", [](const Config& c, uint64_t seed, const std::string& dtype) {
    if (dtype != "f32" && dtype != "f64" && dtype != "bf16")
      throw InputError(fmt::format("dtype: '{}' is not f32, f64 or bf16", dtype));
    check_fits_in_memory(c, 1, dtype == "f64" ? "reference-f64" : "reference");
    py::dict out;
    for (const TensorSpec& t : weight_specs(c, make_plan(c))) {
      const std::vector<double> v = generate_tensor(t, seed);
      std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
      if (dtype == "f64") {
        out[py::str(t.name)] = python::numpy_array(shape, v.data());
      } else {
        py::array a = python::numpy_array<float>(shape);
        float* p = static_cast<float*>(a.mutable_data());
        for (size_t i = 0; i < v.size(); ++i)
          p[i] = dtype == "f32" ? float(v[i]) : std::bit_cast<float>(uint32_t(bf16_bits_of(v[i])) << 16);
        out[py::str(t.name)] = a;
      }
    }
    return out;
  });
  m.def("tokens", [](const Config& c, int64_t n, uint64_t seed) {
    if (n < 0) throw InputError(fmt::format("tokens: n must be >= 0 (got {})", n));
    const std::vector<int32_t> t = make_tokens(seed, c.vocab_size, n);
    return python::numpy_array({py::ssize_t(t.size())}, t.data());
  });
  m.def("export", [](const std::string& path, const Config& c, uint64_t weight_seed, const std::string& dtype,
                     const std::string& format, int64_t n_tokens, uint64_t token_seed, const std::string& generator) {
    WeightsExport e{c, weight_seed, dtype, n_tokens, token_seed, generator};
    check_fits_in_memory(c, 1, dtype == "f64" ? "reference-f64" : "reference");
    write_weights_export(path, e, format);
  });

  // ---- requests and results (docs/spec.md §4–§6, §9.1) ----
  py::class_<RunRequest>(m, "RunRequest", "What an engine is asked to run (docs/spec.md §4-§6).")
      .def(py::init<>())
      .def_property("mode", [](const RunRequest& r) { return std::string(mode_name(r.mode)); },
                    [](RunRequest& r, const std::string& s) { r.mode = parse_mode(s); })
      .def_property("replay", [](const RunRequest& r) { return r.replay.str(); },
                    [](RunRequest& r, const std::string& s) { r.replay = ReplayPolicy::parse(s); })
      .def_readwrite("n_prompt", &RunRequest::n_prompt)
      .def_readwrite("prefix_len", &RunRequest::prefix_len)
      .def_readwrite("decode_steps", &RunRequest::decode_steps)
      .def_readwrite("capture_layers", &RunRequest::capture_layers)
      .def_property("logits", [](const RunRequest& r) { return r.logits == LogitsScope::Last ? "last" : "all"; },
                    [](RunRequest& r, const std::string& s) {
                      if (s != "all" && s != "last") throw InputError(fmt::format("logits: '{}' is not all or last", s));
                      r.logits = s == "last" ? LogitsScope::Last : LogitsScope::All;
                    })
      .def_property("tokens", [](const RunRequest& r) { return python::numpy_array({py::ssize_t(r.tokens.size())}, r.tokens.data()); },
                    [](RunRequest& r, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& a) {
                      r.tokens = token_vector(a);
                    });
  m.def("n_replay", [](const Config& c, const RunRequest& r) { return n_replay(r.replay, make_plan(c), r.n_prompt); });
  m.def("validate_request", &validate_request);

  py::class_<LayerCapture>(m, "LayerCapture", "One layer's captured output X and selection S_l (docs/spec.md §9.1).")
      .def(py::init<>())
      .def_readwrite("layer", &LayerCapture::layer)
      .def_property("positions", [](const LayerCapture& l) { return int_array(l.positions); },
                    [](LayerCapture& l, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& a) {
                      l.positions = int_vector(a);
                    })
      .def_property("out", [](const LayerCapture& l) { return py::cast(l.out); },
                    [](LayerCapture& l, const MatrixArg<MatD>& a) { l.out = matrix_of<MatD>(a, "out"); })
      .def_property("topk", [](const LayerCapture& l) -> py::object { return l.has_topk ? py::cast(l.topk) : py::none(); },
                    [](LayerCapture& l, const std::optional<MatrixArg<IntMat>>& t) {
                      l.has_topk = t.has_value();
                      l.topk = t ? matrix_of<IntMat>(*t, "topk") : IntMat();
                    });

  py::class_<RunResult>(m, "RunResult", "One run's outputs and attributes (docs/spec.md §9.1 /runs/<run>).")
      .def(py::init<>())
      .def_readwrite("backend", &RunResult::backend)
      .def_readwrite("dtype", &RunResult::dtype)
      .def_property("mode", [](const RunResult& r) { return std::string(mode_name(r.mode)); },
                    [](RunResult& r, const std::string& s) { r.mode = parse_mode(s); })
      .def_property("replay", [](const RunResult& r) { return r.replay.str(); },
                    [](RunResult& r, const std::string& s) { r.replay = ReplayPolicy::parse(s); })
      .def_readwrite("n_prompt", &RunResult::n_prompt)
      .def_readwrite("n_replay", &RunResult::n_replay)
      .def_readwrite("replay_start", &RunResult::replay_start)
      .def_readwrite("prefix_len", &RunResult::prefix_len)
      .def_readwrite("decode_steps", &RunResult::decode_steps)
      .def_property("positions", [](const RunResult& r) { return int_array(r.positions); },
                    [](RunResult& r, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& a) {
                      r.positions = int_vector(a);
                    })
      .def_property("logits", [](const RunResult& r) { return py::cast(r.logits); },
                    [](RunResult& r, const MatrixArg<MatD>& a) { r.logits = matrix_of<MatD>(a, "logits"); })
      .def_readwrite("layers", &RunResult::layers)
      .def_property_readonly("flops", [](const RunResult& r) { return r.flops.per_layer.empty() ? 0 : r.flops.total(); })
      .def_readonly("prefill_seconds", &RunResult::prefill_seconds)
      .def_readonly("decode_seconds", &RunResult::decode_seconds);
  m.def("result_for", [](const Config& c, const RunRequest& req, const std::string& backend, const std::string& dtype) {
    return result_for(NamedBackend(backend, dtype), req, make_plan(c));
  });

  m.def("run", [](const Config& c, RunRequest req, const std::string& backend, uint64_t weight_seed) {
    check_fits_in_memory(c, req.n_prompt + req.decode_steps, backend);
    validate_request(c, req);
    auto be = make_backend(backend, c, weight_seed);
    if (std::string why = be->supports(req); !why.empty()) throw NotSupported(why);
    py::gil_scoped_release release;
    return be->run(req);
  });

  // ---- comparison (docs/spec.md §8) ----
  m.def("diff", [](const RunResult& t, const RunResult& r, const std::string& policy, const std::string& run) {
    return run_diff_dict(diff_runs(run, t, r, policy_of(policy)));
  });

  // ---- files (docs/spec.md §9) ----
  m.def("write_run_file", [](const std::string& path, const Config& c,
                             const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& tokens,
                             const std::vector<std::pair<std::string, RunResult>>& runs, uint64_t weight_seed,
                             uint64_t token_seed, bool tokens_explicit, const std::string& weights_dtype,
                             const std::string& generator) {
    RunFile f;
    f.generator = generator;
    f.config = c;
    f.tokens = token_vector(tokens);
    f.weight_seed = weight_seed;
    f.token_seed = token_seed;
    f.tokens_explicit = tokens_explicit;
    f.weights_dtype = weights_dtype;
    for (const auto& [name, r] : runs) f.runs.push_back({name, r});
    write_run_file(path, f);
  });
  m.def("read_run_file", [](const std::string& path) {
    const RunFile f = read_untrusted_run_file(path);
    py::dict d;
    d["generator"] = f.generator;
    d["config"] = f.config;
    d["tokens"] = python::numpy_array({py::ssize_t(f.tokens.size())}, f.tokens.data());
    d["weight_seed"] = f.weight_seed;
    d["token_seed"] = f.token_seed;
    d["tokens_explicit"] = f.tokens_explicit;
    d["weights_dtype"] = f.weights_dtype;
    py::list runs;
    for (const NamedRun& r : f.runs) runs.append(py::make_tuple(r.name, r.result));
    d["runs"] = runs;
    return d;
  });

  // ---- the gate (docs/spec.md §10 `ced gate`) ----
  m.def("default_golden_dir", [] { return golden::default_golden_dir().string(); });
  m.def("gate", [](py::function engine, py::object supports, const std::string& dir, const std::string& policy,
                   const std::string& only, const std::string& dtype, bool verbose, bool quiet) {
    BackendEntry entry;
    entry.name = "python";
    entry.scalar = dtype;
    // The stored calibration is read only for a policy with self-calibrating
    // rules, so a golden directory without one can be gated bitwise.
    const std::string policy_path = policy.empty() ? (std::filesystem::path(dir) / "policy-calibrated.toml").string() : policy;
    const Policy p = load_policy_file(policy_path);
    entry.gate_calibrated = std::any_of(p.rules.begin(), p.rules.end(), [](const Rule& r) { return r.calibrate; });
    entry.golden_policy = "policy-calibrated.toml";
    entry.description = "a Python engine (ced.gate)";
    entry.factory = [engine, supports, dtype](const Config& c, uint64_t seed) {
      return std::make_unique<PythonBackend>(engine, supports, c, seed, dtype);
    };
    golden::GateOptions o;
    o.dir = dir;
    o.backend = "python";
    o.policy = policy;
    o.only = only;
    o.verbose = verbose;
    o.quiet = quiet;
    o.entry = &entry;
    std::fflush(stdout);
    const golden::GateReport rep = golden::run_gate(o);
    std::fflush(stdout);
    py::dict d;
    d["runs"] = rep.runs;
    d["passed"] = rep.passed;
    py::list failures, judged, unsupported;
    for (const auto& f : rep.failures) failures.append(py::dict(py::arg("file") = f.file, py::arg("run") = f.run, py::arg("what") = f.what));
    for (const auto& n : rep.not_supported) unsupported.append(py::dict(py::arg("file") = n.file, py::arg("run") = n.run, py::arg("why") = n.why));
    for (const auto& j : rep.judged) {
      py::dict jd = run_diff_dict(j.diff);
      jd["file"] = j.file;
      judged.append(jd);
    }
    d["failures"] = failures;
    d["not_supported"] = unsupported;
    d["judged"] = judged;
    return d;
  });
  bind_v41(m);
  bind_v41_blocks(m);
  bind_generation(m);
  bind_cli(m);
}
