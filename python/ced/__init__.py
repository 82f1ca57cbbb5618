"""The CED harness from Python: weights, reference runs, the judge and the golden gate.

Everything here calls the harness's C++ libraries (the code the ``ced`` command
runs); the contract is the repository's ``docs/spec.md``, cited by section.

>>> import ced
>>> c = ced.config("tiny")
>>> w = ced.weights(c, seed=1)              # docs/spec.md §2.2, numpy arrays
>>> t = ced.tokens(c, 17, seed=2)           # docs/spec.md §2.3
>>> r = ced.run(c, t, mode="ced", replay="bounded", weight_seed=1, capture=True)
>>> ced.compare(r, r).passed
True

Errors are exceptions carrying the command line's one-line message:
:class:`InputError` (a ``ValueError``; the CLI's exit 2) and
:class:`NotSupportedError` (a backend that cannot do a request).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from . import _core
from ._core import Config, LayerCapture, RunRequest, RunResult

#: The harness's version: the CMake project's, as ``ced --version`` prints it and the wheel's metadata carries it.
__version__: str = _core.__version__

# An installed wheel carries the golden runs, their policies and the capture scripts as package data (ced/data);
# the C++ side finds them there. Without it (a module built in a checkout) they are the source tree's.
_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
if os.path.isdir(_DATA):
    _core.set_data_root(_DATA)

InputError = _core.InputError
NotSupportedError = _core.NotSupportedError

__all__ = [
    "__version__", "Config", "LayerCapture", "RunRequest", "RunResult", "InputError", "NotSupportedError",
    "Request", "CompareReport", "TensorReport", "GateReport", "GateRun", "RunFile",
    "config", "weights", "tokens", "run", "result", "compare", "write_run", "read_run", "export", "gate",
    "builtin_configs", "backends", "check",
]

ArrayLike = Any  # numpy arrays, lists, or torch tensors (moved to the CPU)
ConfigLike = Union[str, "os.PathLike[str]", Config]


def _numpy(x: ArrayLike, dtype: Any = None) -> np.ndarray:
    """An array from numpy, a list or a torch tensor (detached and moved to the CPU)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=dtype))


def _format_override(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return f"{key}={'true' if value else 'false'}"
    if isinstance(value, (list, tuple, np.ndarray)):
        return f"{key}={','.join(str(int(v)) for v in value)}"
    return f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}"


def config(name_or_path: ConfigLike, **overrides: Any) -> Config:
    """A validated config (docs/spec.md §1): a built-in name or a TOML file, with overrides.

    ``ced.config("v41-shape", window=64)`` is ``ced --config v41-shape --set window=64``;
    lists are given as lists (``compress_ratios=[0, 2, 2, 1]``), the boolean as a bool.
    Raises :class:`InputError` (``config: <key>: <why>``) for a config that breaks §1.2.
    """
    kvs = [_format_override(k, v) for k, v in overrides.items()]
    if isinstance(name_or_path, Config):
        return _core.with_overrides(name_or_path, kvs)
    return _core.load_config(os.fspath(name_or_path), kvs)


def _config_dict(c: Config) -> dict:
    import json
    return json.loads(c.to_json())


def _as_config(c: ConfigLike) -> Config:
    return c if isinstance(c, Config) else config(c)


def builtin_configs() -> list[str]:
    """The built-in config names (docs/spec.md §1.1)."""
    return list(_core.builtin_names())


def backends() -> list[str]:
    """The backend names ``ced.run`` accepts (docs/spec.md §10)."""
    return list(_core.backend_names())


def weights(config: ConfigLike, seed: int = 0, dtype: str = "f32") -> dict[str, np.ndarray]:
    """Every weight tensor of docs/spec.md §2.2 by name, generated from ``seed`` (§2.1).

    Shapes are the spec's, row-major (``layers.1.wq_a`` is ``[d, q_lora_rank]``: a row
    vector times it). ``dtype``: ``"f32"`` (float32, the double rounded to nearest),
    ``"f64"`` (float64, the generator's value), ``"bf16"`` (float32 arrays holding the
    double rounded to f32 then to bf16, nearest even each time: ``torch.from_numpy(a).bfloat16()``
    is exact). The same bits as ``ced export``.
    """
    return dict(_core.weights(_as_config(config), int(seed), dtype))


def tokens(config: ConfigLike, n: int, seed: int = 0) -> np.ndarray:
    """The first ``n`` tokens of docs/spec.md §2.3's stream for ``seed`` (int32 [n])."""
    return _core.tokens(_as_config(config), int(n), int(seed))


def _request(cfg: Config, toks: ArrayLike, mode: str, replay: Optional[str], prefix: Optional[int], decode: int,
             capture: bool, logits: str) -> RunRequest:
    req = RunRequest()
    req.mode = mode
    req.replay = ("none" if mode == "full" else "bounded") if replay is None else str(replay)
    t = _numpy(toks, np.int64)
    req.tokens = t
    req.decode_steps = int(decode)
    req.n_prompt = int(t.shape[0]) - int(decode)
    req.prefix_len = -1 if prefix is None else int(prefix)
    req.capture_layers = bool(capture)
    req.logits = logits
    return req


def run(config: ConfigLike, tokens: Union[ArrayLike, int], mode: str = "full", replay: Optional[str] = None,
        prefix: Optional[int] = None, decode: int = 0, backend: str = "reference", capture: bool = False,
        logits: str = "all", weight_seed: int = 0, token_seed: int = 0) -> RunResult:
    """One run of a harness backend, as ``ced run`` does it (docs/spec.md §4-§6).

    Args:
      config: a :class:`Config`, a built-in name or a TOML path.
      tokens: the token ids, prompt then the decode steps' tokens (length N + decode),
        or an int N: the first N + decode tokens of §2.3's stream for ``token_seed``.
      mode: ``"full"`` | ``"ced"`` | ``"resume"`` (§4.1, §4.2, §6).
      replay: ``"bounded"`` | ``"exact"`` | ``"full"`` | a count K (§4.3); default
        ``bounded`` in ced and resume modes, none in full mode.
      prefix: the cached prefix P of a resume (§6).
      decode: teacher-forced decode steps after the prefill (§5).
      backend: one of :func:`backends` (``reference`` f32, ``reference-f64``, ...).
      capture: also return every layer's output and selection (``result.layers``).
      logits: ``"all"`` prefill positions or only the ``"last"``.
      weight_seed, token_seed: the seeds of §2.

    Returns a :class:`RunResult`: ``logits`` [P, V] (float64 numpy), ``positions`` [P],
    ``layers`` (a list of :class:`LayerCapture`: ``layer``, ``positions``, ``out`` [P_l, d],
    ``topk`` [P_l, k] or None), and the §9.1 attributes (``mode``, ``replay``, ``n_replay``,
    ``replay_start``, ``prefix_len``, ``decode_steps``, ``flops``).
    Raises :class:`InputError` for a request that breaks the spec, with the CLI's message.

    A v41 config (a built-in ``v41-*`` or a release-layout folder) runs the release's reference instead
    (:func:`ced.v41.run`, the same modes; ``backend`` and ``logits`` do not apply) and returns its result dict;
    without ``capture`` its layers keep the selections, experts and mixes and the last row's output only.
    """
    from . import v41
    if v41.is_config(config):  # the release's family: ced.v41.run's result dict
        return v41.run(config, tokens, mode=mode, replay=replay, prefix=prefix, decode=decode, weight_seed=weight_seed,
                       token_seed=token_seed, capture=capture)
    cfg = _as_config(config)
    if isinstance(tokens, (int, np.integer)):
        tokens = _core.tokens(cfg, int(tokens) + int(decode), int(token_seed))
    return _core.run(cfg, _request(cfg, tokens, mode, replay, prefix, decode, capture, logits), backend,
                     int(weight_seed))


@dataclass
class Request:
    """One golden run an engine is asked to compute (what ``ced.gate`` passes to it).

    ``tokens`` holds the prompt then the decode steps' tokens (teacher forcing, §5);
    ``n_replay`` is the replay policy's length (§4.3, -1 in full mode); the engine
    returns ``replay_start`` (the decoder's s, §4.2) with its outputs.
    """
    name: str                 # "<file>:<run>"
    config: Config
    weight_seed: int
    tokens: np.ndarray        # int32 [n_prompt + decode_steps]
    mode: str                 # "full" | "ced" | "resume"
    replay: str               # "none" | "bounded" | "exact" | "full" | "K"
    n_prompt: int
    n_replay: int
    prefix_len: int           # -1 unless resume
    decode_steps: int
    capture_layers: bool      # return every layer's out and topk
    logits: str               # "all" | "last"
    core: RunRequest = field(repr=False)


def result(request: Union[Request, RunRequest], logits: ArrayLike, positions: ArrayLike,
           layers: Optional[Union[Mapping[int, Any], Sequence[Any]]] = None, *, config: Optional[Config] = None,
           replay_start: int = 0, n_replay: Optional[int] = None, backend: str = "python", dtype: str = "f32") -> RunResult:
    """A :class:`RunResult` from an engine's arrays, with the request's §9.1 attributes.

    ``logits`` [P, V] at ``positions`` [P] (ascending); ``layers`` maps a layer number to
    ``{"positions": [P_l], "out": [P_l, d], "topk": [P_l, k] or None}`` (or a tuple in that
    order). numpy arrays, lists and torch tensors are accepted.
    """
    if isinstance(request, Request):
        config, request = request.config, request.core
    if config is None:
        raise InputError("result: pass the config with a bare RunRequest")
    r = _core.result_for(config, request, backend, dtype)
    r.logits = _numpy(logits, np.float64).reshape(-1, config.vocab_size)
    r.positions = _numpy(positions, np.int64)
    r.replay_start = int(replay_start)
    if n_replay is not None:
        r.n_replay = int(n_replay)
    caps = []
    items = layers.items() if isinstance(layers, Mapping) else enumerate(layers or [])
    for l, v in items:
        cap = LayerCapture()
        cap.layer = int(l)
        if isinstance(v, Mapping):
            pos, out, topk = v.get("positions"), v.get("out"), v.get("topk")
        else:
            pos, out, topk = v
        cap.positions = _numpy(pos, np.int64)
        cap.out = _numpy(out, np.float64)
        cap.topk = None if topk is None else _numpy(topk, np.int64)
        caps.append(cap)
    r.layers = caps
    return r


@dataclass
class TensorReport:
    """One tensor's §8 verdict: its metrics, the violated thresholds and the worst place."""
    name: str
    layer: int
    passed: bool
    bitwise_equal: bool
    worst: str                 # "position P[, column C]" of the first violated threshold, "-" when passing
    rule: str
    reason: str
    violations: list[dict]
    unchecked: list[str]
    metrics: dict[str, float]


@dataclass
class CompareReport:
    """A run diff (docs/spec.md §8.6): verdict, per-tensor reports, first divergent layer."""
    run: str
    passed: bool
    problems: list[str]
    first_divergent_layer: int   # -1: none
    first_inexact_layer: int     # -1: bitwise equal everywhere
    tensors: list[TensorReport]
    text: str = field(repr=False)
    text_verbose: str = field(repr=False)

    @property
    def failures(self) -> list[TensorReport]:
        return [t for t in self.tensors if not t.passed]

    def __str__(self) -> str:
        return self.text


def _compare_report(d: dict) -> CompareReport:
    d = dict(d)
    d["tensors"] = [TensorReport(**t) for t in d["tensors"]]
    d.pop("file", None)
    return CompareReport(**d)


def _policy_path(policy: Optional[str], golden_dir: Optional[str] = None) -> str:
    names = {"exact": "", "golden": "policy.toml", "calibrated": "policy-calibrated.toml", "bf16": "policy-bf16.toml"}
    if policy is None:
        return ""
    if policy in names:
        if not names[policy]:
            return ""
        return os.path.join(golden_dir or _core.default_golden_dir(), names[policy])
    return os.fspath(policy)


def compare(test: RunResult, reference: RunResult, policy: Optional[str] = None, run: str = "run") -> CompareReport:
    """Judges ``test`` against ``reference`` as ``ced diff`` does (docs/spec.md §8).

    Two v41 run files (paths, or :class:`ced.v41.GoldenRun` as :func:`read_run` returns them) are judged by the
    release's judge (docs/v41.md §12.7, §12.8) and return a :class:`ced.v41.DiffReport`.

    ``policy``: None or ``"exact"`` (any difference fails), ``"golden"`` / ``"bf16"``
    (the shipped policies, §8.5), or a policy TOML path. Self-calibrating rules need the
    stored calibration: use :func:`gate` for those.
    Returns a :class:`CompareReport` (``passed``, ``first_divergent_layer``, per-tensor
    metrics and worst places; ``str(report)`` is ``ced diff``'s table).
    """
    from . import v41
    as_path = lambda r: os.fspath(r.path) if isinstance(r, v41.GoldenRun) else \
        (os.fspath(r) if isinstance(r, (str, os.PathLike)) else None)
    a, b = as_path(test), as_path(reference)
    if a is not None and b is not None:  # two v41 run files: the release's judge, as `ced diff` runs it
        if policy is not None:
            raise InputError("policy: v41 runs are judged by derived bounds (docs/sound-bounds.md), not a policy")
        return v41.compare_files(a, b)
    if not isinstance(test, RunResult) or not isinstance(reference, RunResult):
        raise InputError("ced.compare judges two lab runs (ced.RunResult) or two v41 run files (paths or "
                         "ced.v41.GoldenRun; write a result dict with ced.write_run)")
    return _compare_report(_core.diff(test, reference, _policy_path(policy), run))


@dataclass
class RunFile:
    """A run file (docs/spec.md §9.1): config, tokens with their seeds, named runs."""
    config: Config
    tokens: np.ndarray
    weight_seed: int
    token_seed: int
    tokens_explicit: bool
    weights_dtype: str
    generator: str
    runs: dict[str, RunResult]


def write_run(path: Union[str, "os.PathLike[str]"], config: ConfigLike, tokens: ArrayLike,
              runs: Mapping[str, RunResult], weight_seed: int = 0, token_seed: int = 0,
              tokens_explicit: Optional[bool] = None, weights_dtype: str = "",
              generator: str = "ced (Python)") -> None:
    """Writes a run file in the layout of docs/spec.md §9.1 (atomically), as ``ced run`` does.

    ``tokens`` is ``/inputs/tokens`` (the prompt and decode tokens of the longest run);
    ``tokens_explicit`` defaults to whether they differ from §2.3's stream for ``token_seed``.
    ``weights_dtype`` ``"f32"``/``"f64"``/``"bf16"`` also stores ``/weights``.
    ``ced diff`` and ``ced gate`` read what this writes.

    With a v41 config, ``runs`` is one prefill's result dict (``logits`` and the captures the engine has) and
    the file is the v41 run file (:func:`ced.v41.write_run`; ``weight_seed`` names the checkpoint's seed).
    """
    from . import v41
    if v41.is_config(config):  # one prefill's result dict, in the v41 run file
        v41.write_run(path, config, tokens, runs, weight_seed=weight_seed, generator=generator)
        return
    cfg = _as_config(config)
    t = _numpy(tokens, np.int64)
    if tokens_explicit is None:
        tokens_explicit = not np.array_equal(t, _core.tokens(cfg, int(t.shape[0]), int(token_seed)))
    _core.write_run_file(os.fspath(path), cfg, t, list(runs.items()), int(weight_seed), int(token_seed),
                         bool(tokens_explicit), weights_dtype, generator)


def read_run(path: Union[str, "os.PathLike[str]"]) -> RunFile:
    """Reads a run file (docs/spec.md §9.1), checked as ``ced diff`` checks it (in a child
    process with a time and memory limit); :class:`InputError` with one line otherwise.
    A v41 run file is read as :func:`ced.v41.read_run` reads it (a :class:`ced.v41.GoldenRun`)."""
    if _core.v41_is_run_file(os.fspath(path)):
        from . import v41
        return v41.read_run(path)
    d = _core.read_run_file(os.fspath(path))
    d["runs"] = dict(d["runs"])
    return RunFile(**d)


def export(path: Union[str, "os.PathLike[str]"], config: ConfigLike, weight_seed: int = 0, dtype: str = "f32",
           format: str = "safetensors", tokens: int = 0, token_seed: int = 0) -> None:
    """``ced export``: every §2.2 tensor (and ``tokens`` > 0 prompt tokens) as safetensors
    (docs/spec.md §9.4) or HDF5 ``/weights`` (§9.1), written atomically."""
    _core.export(os.fspath(path), _as_config(config), int(weight_seed), dtype, format, int(tokens), int(token_seed),
                 "ced.export (Python)")


@dataclass
class GateRun:
    """One golden run judged by :func:`gate`."""
    file: str
    report: CompareReport

    @property
    def passed(self) -> bool:
        return self.report.passed

    @property
    def first_divergent_layer(self) -> int:
        return self.report.first_divergent_layer


@dataclass
class GateReport:
    """What :func:`gate` found: every judged run, the failures and the unsupported runs."""
    runs: int
    passed_runs: int
    judged: list[GateRun]
    failures: list[dict]          # {"file", "run", "what"}: ``ced gate``'s failure lines
    not_supported: list[dict]     # {"file", "run", "why"}

    @property
    def passed(self) -> bool:
        """No run failed and at least one was judged (a gate that judged nothing does not pass)."""
        return not self.failures and self.passed_runs > 0

    def __bool__(self) -> bool:
        return self.passed


Engine = Callable[[Request], Any]


def _is_v41_engine(engine: Any) -> bool:
    """A ced.v41.Engine (or an object of its protocol: a loader and declared capabilities)."""
    from .v41.engine import Engine as V41Engine
    return isinstance(engine, V41Engine) or (hasattr(engine, "load") and hasattr(engine, "capabilities"))


def check(engine: Any, **kwargs: Any) -> Any:
    """The CED property suite on a port of the release: :func:`ced.v41.check` (docs/v41-ports.md)."""
    from . import v41
    return v41.check(engine, **kwargs)


def gate(engine: Engine, golden_dir: Optional[str] = None, policy: Optional[str] = "calibrated",
         only: Optional[str] = None, dtype: str = "f32", verbose: bool = False, quiet: bool = False) -> GateReport:
    """Reruns every golden run on ``engine`` and judges it as ``ced gate`` does (docs/spec.md §10).

    A port of the released architecture (a :class:`ced.v41.Engine`) is judged by :func:`ced.v41.gate` instead,
    against the official code's golden runs (``golden_dir``: a v41 golden file or folder).

    ``engine(request)`` gets a :class:`Request` for each run the golden files hold and
    returns its outputs: a :class:`RunResult` (see :func:`result`) or a dict with
    ``logits`` [P, V], ``positions`` [P], optionally ``layers`` (as :func:`result` takes
    them, required when ``request.capture_layers``), ``replay_start`` and ``n_replay``.
    Arrays may be numpy or torch. An engine with a ``supports(request)`` method is asked
    before each run, as a harness backend is: a non-empty answer (why not) lists the run
    as not supported, neither passed nor failed, and the engine is not called for it.
    The same code as ``ced gate`` judges each run (the golden policy, the stored
    calibration for self-calibrating rules) and prints its lines. ``golden_dir``: the
    golden files, and the policy and calibration files the named policies read
    (default the repository's ``golden/``). ``policy``: ``"calibrated"`` (default, for
    f32 engines), ``"golden"`` (bitwise to 1e-11), ``"bf16"``, or a TOML path. ``only``:
    ``"FILE"`` or ``"FILE:RUN"``. ``dtype`` is the engine's (it picks the ULP unit).

    Returns a :class:`GateReport` (``passed``, per run verdicts with the first divergent
    layer and worst places, ``ced gate``'s failure lines). It passes only when a run was
    judged and none failed: an engine that supports none of the selected runs does not
    pass. An exception the engine raises propagates unchanged.
    """
    if _is_v41_engine(engine):  # a port of the release: the v41 gate (docs/v41-ports.md)
        from . import v41
        return v41.gate(engine, golden_dir, quiet=quiet)
    gdir = os.fspath(golden_dir) if golden_dir is not None else _core.default_golden_dir()
    if policy is None or policy == "exact":
        raise InputError(f"gate: policy {policy!r}: name 'calibrated', 'golden', 'bf16' or a policy TOML file")

    def request_of(cfg: Config, weight_seed: int, core: RunRequest) -> Request:
        return Request(name="", config=cfg, weight_seed=int(weight_seed), tokens=core.tokens, mode=core.mode,
                       replay=core.replay, n_prompt=core.n_prompt, n_replay=_core.n_replay(cfg, core),
                       prefix_len=core.prefix_len, decode_steps=core.decode_steps,
                       capture_layers=core.capture_layers, logits=core.logits, core=core)

    ask = getattr(engine, "supports", None)
    supports = None if ask is None else lambda cfg, seed, core: str(ask(request_of(cfg, seed, core)) or "")

    def call(cfg: Config, weight_seed: int, core: RunRequest) -> RunResult:
        req = request_of(cfg, weight_seed, core)
        out = engine(req)
        sys.stdout.flush()
        if isinstance(out, RunResult):
            return out
        if not isinstance(out, Mapping):
            raise TypeError(f"ced.gate: the engine returned {type(out).__name__}; want a ced.RunResult or a dict")
        return result(req, out["logits"], out["positions"], out.get("layers"), replay_start=out.get("replay_start", 0),
                      n_replay=out.get("n_replay"), dtype=dtype)

    sys.stdout.flush()
    d = _core.gate(call, supports, gdir, _policy_path(policy, gdir), only or "", dtype, bool(verbose), bool(quiet))
    rep = GateReport(runs=d["runs"], passed_runs=d["passed"],
                     judged=[GateRun(file=j["file"], report=_compare_report(j)) for j in d["judged"]],
                     failures=list(d["failures"]), not_supported=list(d["not_supported"]))
    if not quiet:
        print(f"{rep.runs} runs, {rep.passed_runs} passed, {len(rep.failures)} failed, "
              f"{len(rep.not_supported)} not supported")
        if rep.failures:
            print("failures:")
            for f in rep.failures:
                print(f"  {f['file']}:{f['run']}: {f['what']}\n    reproduce: ced.gate(engine, only=\"{f['file']}:{f['run']}\")")
        elif not rep.judged:
            print(f"FAIL: no run was judged: the engine supports none of the {rep.runs} selected runs "
                  f"({rep.not_supported[0]['why']})")
    return rep
