"""`python -m ced_torch`: run the engine on a request, write its run file, or time its prefill.

  run    --weights F.safetensors --tokens-from GOLDEN.h5 | --tokens N [--token-seed S]
         [--mode full|ced|resume] [--replay P] [--prefix P] [--decode K] [--logits all|last]
         [--capture] [--run NAME] --out F.h5        (written with ced.write_run)
  bench  --config C --tokens N [--mode full|ced] [--repeat R] [--threads T] [--device D]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from . import config, harness, weights
from .model import Engine


def _ced_config(ced, meta: dict):
    """The exported file's config as a `ced.Config` (through a TOML file `ced.config` reads)."""
    import tempfile

    keys = json.loads(meta["config"])
    name = keys.pop("name", "custom")
    if name in ced.builtin_configs():
        return ced.config(name)
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/{name}.toml"
        with open(path, "w") as f:
            f.writelines(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
        return ced.config(path)


def _replay(text):
    return int(text) if text is not None and text.isdigit() else text


def cmd_run(a) -> int:
    import ced

    eng = harness.load(a.weights, a.device, torch.float64 if a.dtype == "f64" else torch.float32)
    meta = weights.safetensors_metadata(a.weights)
    weight_seed = int(meta.get("weight_seed", 0))
    if a.tokens_from:
        golden = ced.read_run(a.tokens_from)            # its /inputs/tokens (docs/spec.md §9.1)
        toks, token_seed = golden.tokens.tolist(), golden.token_seed
        toks = toks[: a.tokens + a.decode] if a.tokens else toks
    else:
        token_seed = a.token_seed
        toks = weights.token_stream(eng.cfg, a.tokens + a.decode, token_seed)
    t0 = time.perf_counter()
    res = eng.run(toks, mode=a.mode, replay=_replay(a.replay), prefix=a.prefix, decode=a.decode,
                  logits=a.logits, capture=a.capture)
    dt = time.perf_counter() - t0
    cfg = _ced_config(ced, meta)
    run = harness.to_ced_result(res, cfg, toks, a.logits, a.dtype)
    ced.write_run(a.out, cfg, toks, {a.run: run}, weight_seed=weight_seed, token_seed=token_seed,
                  generator="ced_torch (examples/torch_engine)")
    print(f"ced_torch: {eng.cfg.name} N={res.n_prompt} {res.mode} replay={res.replay} s={res.replay_start} "
          f"on {eng.device} in {dt:.3f} s -> {a.out} (run '{a.run}')")
    return 0


def cmd_bench(a) -> int:
    torch.set_num_threads(a.threads)
    cfg = config.builtin(a.config)
    t0 = time.perf_counter()
    eng = Engine(cfg, weights.generate(cfg, a.weight_seed), device=a.device or harness.default_device())
    print(f"ced_torch bench: config {cfg.name}, N={a.tokens}, mode {a.mode}, weight seed {a.weight_seed}, "
          f"token seed {a.token_seed}, {a.threads} thread(s), device {eng.device} "
          f"(weights generated in {time.perf_counter() - t0:.1f} s)")
    toks = weights.token_stream(cfg, a.tokens, a.token_seed)
    times, cpu = [], []
    for i in range(a.repeat + 1):                      # the first run warms up and is not counted
        t0, c0 = time.perf_counter(), time.process_time()
        eng.run(toks, mode=a.mode, replay=None if a.mode == "full" else "bounded", logits="last", capture=False)
        if eng.device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    med = statistics.median(times)
    # CPU time beside wall time: on a shared machine the wall clock also counts other jobs
    print(f"prefill {a.mode}: median {med * 1e3:.1f} ms wall, {statistics.median(cpu) * 1e3:.1f} ms CPU "
          f"over {a.repeat} runs (wall min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}); "
          f"{a.tokens / med:.0f} tokens/s")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ced_torch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--weights", required=True)
    r.add_argument("--tokens-from")
    r.add_argument("--tokens", type=int, default=0)
    r.add_argument("--token-seed", type=int, default=0)
    r.add_argument("--mode", default="full", choices=["full", "ced", "resume"])
    r.add_argument("--replay")
    r.add_argument("--prefix", type=int)
    r.add_argument("--decode", type=int, default=0)
    r.add_argument("--logits", default="all", choices=["all", "last"])
    r.add_argument("--capture", action="store_true")
    r.add_argument("--dtype", default="f32", choices=["f32", "f64"])
    r.add_argument("--device")
    r.add_argument("--run", default="run")
    r.add_argument("--out", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--config", default="v41-shape")
    b.add_argument("--tokens", type=int, default=1024)
    b.add_argument("--mode", default="full", choices=["full", "ced"])
    b.add_argument("--repeat", type=int, default=3)
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--weight-seed", type=int, default=0)
    b.add_argument("--token-seed", type=int, default=0)
    b.add_argument("--device")
    a = p.parse_args(argv)
    try:
        from safetensors import SafetensorError
    except ImportError:                                # only `run` reads safetensors
        SafetensorError = ValueError
    try:
        return cmd_run(a) if a.cmd == "run" else cmd_bench(a)
    except (ValueError, OSError, SafetensorError) as e:    # bad input: one line, exit 2
        print(f"ced_torch: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
