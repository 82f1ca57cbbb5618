#!/usr/bin/env python3
"""Side-by-side prefill benchmark (docs/spec.md §10, `scripts/bench-numpy.py`).

Times, in one run and on one pinned core, a full prefill of the `reference`
(f32) and `reference-f64` backends of `ced` against the same model written
plainly in numpy (float64 and float32, BLAS-backed: Debian's numpy calls the
libblas.so.3 alternative, OpenBLAS here), and prints the ratios. Before any
figure is printed the numpy model's last-position logits are validated
against reference-f64's (float64: relative max difference below 1e-9;
float32: below 1e-3); a model that disagrees is reported and the script
exits 1 without timings.

The numpy model follows docs/spec.md §3 in full mode (§4.1): projections as
matrix products over all positions, the compressor, index scoring and the
candidate pool per §3.3-§3.4, attention per query position, MoE with rows
grouped by expert. Its weights and tokens are read from the run file that
`ced run --weights` writes, so it needs no generator of its own.

CPU seconds are printed beside wall seconds (a shared machine stretches the
latter): ced's are the CPU time of its run as `ced run` prints it (weights
generation and file writing left out), numpy's the process time of its
prefill.

Usage: scripts/bench-numpy.py --ced build/tools/ced [--config bench] [--tokens 1024]
       [--core 0] [--repeat 1] [--threads 1] [--json out.json]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

# BLAS threads must be pinned before numpy loads OpenBLAS.
def _pin_threads(argv):
    threads = "1"
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            threads = argv[i + 1]
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = threads
    return threads


_THREADS = _pin_threads(sys.argv)
import numpy as np  # noqa: E402
import h5py  # noqa: E402


def fail(msg):
    print(f"bench-numpy: {msg}", file=sys.stderr)
    sys.exit(2)


class Model:
    """docs/spec.md §3 in numpy, in the scalar type `dt`."""

    def __init__(self, f, dt, plant="none"):
        self.dt = dt
        self.plant = plant  # a planted modelling fault (tests of the validation)
        cfg = dict(f["config"].attrs)
        for k in ("compress_ratios", "kv_source_layers", "index_source_layers"):
            cfg[k] = [int(x) for x in f["config"][k][()]]
        self.c = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in cfg.items()}
        self.w = {name: np.ascontiguousarray(ds[()].astype(dt)) for name, ds in f["weights"].items()}
        c = self.c
        self.L, self.E = int(c["n_layers"]), int(c["n_encoder_layers"])
        self.eps = dt(c["rms_eps"])
        # Plan (docs/spec.md §1.3).
        self.plan = []
        for l in range(self.L):
            r = c["compress_ratios"][l]
            lp = {"r": r, "role": "swa"}
            if r > 0:
                lp["kv_src"] = max(s for s in c["kv_source_layers"] if s <= l)
                lp["idx_src"] = max(s for s in c["index_source_layers"] if s <= l)
                kv, ix = l in c["kv_source_layers"], l in c["index_source_layers"]
                lp["role"] = "full" if kv else "reindex" if ix else "reuse"
                lp["cand"] = l == c["candidate_source_layer"]
                lp["in_pool"] = ix and c["candidate_source_layer"] >= 0 and l >= c["candidate_source_layer"]
                lp["wl"] = self.E if (kv and c["tie_decoder_kv"] and l > self.E) else l
            self.plan.append(lp)

    def W(self, name):
        return self.w[name]

    def rmsnorm(self, X, w):
        ss = np.sum(X * X, axis=-1, keepdims=True)
        inv = self.dt(1) / np.sqrt(ss / self.dt(X.shape[-1]) + self.eps)
        return (X * inv) * w

    def rope(self, V, pos, sign=1):
        """V [..., P, dim] (or [P, H, dim] with heads=True handled by caller), pos [P]."""
        c = self.c
        dim, rd = V.shape[-1], int(c["rope_dim"])
        o = dim - rd
        i = np.arange(rd // 2, dtype=np.float64)
        inv_freq = np.power(float(c["rope_theta"]), -2.0 * i / rd)
        ang = sign * np.asarray(pos, dtype=np.float64)[:, None] * inv_freq[None, :]
        cs, sn = np.cos(ang).astype(self.dt), np.sin(ang).astype(self.dt)
        if V.ndim == 3:  # [P, H, dim]
            cs, sn = cs[:, None, :], sn[:, None, :]
        out = V.copy()
        a, b = V[..., o::2], V[..., o + 1::2]
        out[..., o::2] = a * cs - b * sn
        out[..., o + 1::2] = a * sn + b * cs
        return out

    def compress(self, l, xin):
        """docs/spec.md §3.3: global entries g and index keys ik of kv source l."""
        c, lp = self.c, self.plan[l]
        r, wl = lp["r"], lp["wl"]
        C = xin @ self.W(f"layers.{wl}.comp_wkv")
        n = xin.shape[0] // r
        if r == 1:
            raw = C
        else:
            Z = (xin[: n * r] @ self.W(f"layers.{wl}.comp_wgate")).reshape(n, r, -1)
            C = C[: n * r].reshape(n, r, -1)
            e = np.exp(Z - Z.max(axis=1, keepdims=True))
            raw = np.sum((e / e.sum(axis=1, keepdims=True)) * C, axis=1)
        lat = self.rmsnorm(raw, self.W(f"layers.{wl}.comp_norm"))
        pos = np.arange(n) * r
        ik = self.rope(self.rmsnorm(lat @ self.W(f"layers.{wl}.idx_wk"), self.W(f"layers.{wl}.idx_knorm")), pos)
        return self.rope(lat, pos), ik

    @staticmethod
    def ranked(ids, scores, k):
        """Higher score first, equal scores -> larger id first (§3.4)."""
        order = np.lexsort((-ids, -scores))
        return ids[order[:k]]

    def select(self, l, xhat, q_lat, srcs, sel, pools):
        c, lp = self.c, self.plan[l]
        N = xhat.shape[0]
        if lp["role"] == "reuse":
            sel[l] = sel[lp["idx_src"]]
            return
        ih, ihd = int(c["index_n_heads"]), int(c["index_head_dim"])
        iq = self.rope((q_lat @ self.W(f"layers.{l}.idx_wq")).reshape(N, ih, ihd), np.arange(N))
        wts = (xhat @ self.W(f"layers.{l}.idx_wweights")) * self.dt(1.0 / np.sqrt(float(ihd * ih)))
        g, ik = srcs[lp["kv_src"]]
        r, bs = lp["r"], int(c["candidate_block_size"])
        dots = (iq.reshape(N * ih, ihd) @ ik.T).reshape(N, ih, -1)
        scores_all = np.sum(wts[:, :, None] * np.maximum(dots, self.dt(0)), axis=1)  # [N, n_entries]
        k_top, k_blocks = int(c["index_topk"]), int(c["candidate_topk_blocks"])
        cand = c["candidate_source_layer"]
        out, pool_out = [], []
        for p in range(N):
            nv = min(ik.shape[0], (p + 1) // r)
            if lp["in_pool"] and not lp["cand"]:
                ids = np.array([j for b in pools[cand][p] for j in range(b * bs, min(nv, (b + 1) * bs))], dtype=np.int64)
            else:
                ids = np.arange(nv, dtype=np.int64)
            s = scores_all[p, ids]
            if lp["cand"]:
                pool = []
                if nv > 0:
                    nb = (nv + bs - 1) // bs
                    newest = nb - 1
                    padded = np.full(nb * bs, -np.inf, dtype=self.dt)
                    padded[:nv] = s
                    bscore = padded.reshape(nb, bs).max(axis=1)
                    others = np.arange(nb - 1, dtype=np.int64)
                    pool = [newest] + list(self.ranked(others, bscore[:-1], k_blocks - 1))
                pool_out.append(pool)
                ids = np.array([j for b in pool for j in range(b * bs, min(nv, (b + 1) * bs))], dtype=np.int64)
                s = scores_all[p, ids]
            out.append(self.ranked(ids, s, k_top))
        sel[l] = out
        if lp["cand"]:
            pools[l] = pool_out

    def attend(self, l, q, K, srcs, sel):
        c, lp = self.c, self.plan[l]
        N, H, hd, Wn = q.shape[0], int(c["n_heads"]), int(c["head_dim"]), int(c["window"])
        scale = self.dt(1.0 / np.sqrt(float(hd)))
        sink = self.W(f"layers.{l}.attn_sink")
        G = srcs[lp["kv_src"]][0] if lp["r"] > 0 else None
        out = np.empty((N, H, hd), dtype=self.dt)
        for p in range(N):
            keys = K[max(0, p - Wn + 1): p + 1]
            if G is not None and len(sel[l][p]):
                keys = np.concatenate([keys, G[sel[l][p]]])
            logits = (q[p] @ keys.T) * scale  # [H, E]
            m = np.maximum(sink, logits.max(axis=1))
            e = np.exp(logits - m[:, None])
            den = np.exp(sink - m) + e.sum(axis=1)
            if self.plant == "sink-dropped":
                den = e.sum(axis=1)
            out[p] = (e / den[:, None]) @ keys
        return self.rope(out, np.arange(N), sign=-1).reshape(N, H * hd)

    def swiglu(self, v, pre):
        h1, h3 = v @ self.W(pre + ".w1"), v @ self.W(pre + ".w3")
        return ((h1 / (self.dt(1) + np.exp(-h1))) * h3) @ self.W(pre + ".w2")

    def ffn(self, l, X):
        c = self.c
        f = self.rmsnorm(X, self.W(f"layers.{l}.ffn_norm"))
        out = np.zeros_like(X)
        ne, na = int(c["n_routed_experts"]), int(c["n_active_experts"])
        if ne > 0:
            a = f @ self.W(f"layers.{l}.router")
            s = np.sqrt(np.maximum(a, self.dt(0)) + np.log1p(np.exp(-np.abs(a))))
            key = s + self.W(f"layers.{l}.router_bias")
            chosen = np.argsort(-key, axis=1, kind="stable")[:, :na]  # ties -> lower e
            mask = np.zeros_like(s, dtype=bool)
            np.put_along_axis(mask, chosen, True, axis=1)
            gate = np.where(mask, s, self.dt(0))
            gate = gate / np.sum(gate, axis=1, keepdims=True) * self.dt(c["routed_scaling_factor"])
            for e in range(ne):
                rows = np.nonzero(mask[:, e])[0]
                if len(rows):
                    out[rows] += gate[rows, e, None] * self.swiglu(f[rows], f"layers.{l}.expert.{e}")
        for s_ in range(int(c["n_shared_experts"])):
            out += self.swiglu(f, f"layers.{l}.shared.{s_}")
        return X + out

    def prefill(self, tokens):
        """Full mode (§4.1); the logits of the last position."""
        c = self.c
        N, H, hd = len(tokens), int(c["n_heads"]), int(c["head_dim"])
        X = self.W("embed")[tokens]
        srcs, sel, pools, xhat_E = {}, {}, {}, None
        for l in range(self.L):
            lp = self.plan[l]
            xhat = self.rmsnorm(X, self.W(f"layers.{l}.attn_norm"))
            if l == self.E:
                xhat_E = xhat
            if lp["role"] == "full":
                srcs[l] = self.compress(l, xhat_E if l >= self.E else xhat)
            q_lat = self.rmsnorm(xhat @ self.W(f"layers.{l}.wq_a"), self.W(f"layers.{l}.q_norm"))
            q = self.rope((q_lat @ self.W(f"layers.{l}.wq_b")).reshape(N, H, hd), np.arange(N))
            K = self.rope(self.rmsnorm(xhat @ self.W(f"layers.{l}.wkv"), self.W(f"layers.{l}.kv_norm")), np.arange(N))
            if lp["r"] > 0:
                self.select(l, xhat, q_lat, srcs, sel, pools)
            heads = self.attend(l, q, K, srcs, sel)
            G, R = int(c["o_groups"]), int(c["o_lora_rank"])
            per = (H // G) * hd
            u = np.concatenate([heads[:, g * per:(g + 1) * per] @ self.W(f"layers.{l}.wo_a.{g}") for g in range(G)], axis=1)
            X = X + u @ self.W(f"layers.{l}.wo_b")
            X = self.ffn(l, X)
        return self.rmsnorm(X[-1:], self.W("final_norm")) @ self.W("lm_head")


def ced_run(ced, core, config, tokens, backend, out, weights, cpu=None):
    """The run seconds `ced run` prints; with `cpu` (a list), also appends the
    CPU seconds it prints for the run."""
    cmd = ["taskset", "-c", str(core), ced, "run", "--config", config, "--tokens", str(tokens), "--backend", backend,
           "--logits", "last", "--out", out] + (["--weights"] if weights else [])
    env = dict(os.environ, OMP_NUM_THREADS=_THREADS)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    m = re.search(r"^([0-9.]+) s, .*, CPU ([0-9.]+) s$", r.stdout, re.M)
    if not m:
        fail(f"no timing in the output of {' '.join(cmd)}")
    if cpu is not None:
        cpu.append(float(m.group(2)))
    return float(m.group(1))


def last_logits(path):
    with h5py.File(path, "r") as f:
        (run,) = list(f["runs"].keys())
        return f["runs"][run]["logits"][()][-1].astype(np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ced", required=True)
    ap.add_argument("--config", default="bench")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds; the best of each is reported")
    ap.add_argument("--threads", default="1", help="OpenMP/OpenBLAS threads for every side")
    ap.add_argument("--json")
    ap.add_argument("--plant", default="none", choices=("none", "sink-dropped"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.tokens < 1 or a.repeat < 1:
        fail("--tokens >= 1 and --repeat >= 1")
    os.sched_setaffinity(0, {a.core})
    names = ("reference-f64", "reference", "numpy-f64", "numpy-f32")
    with tempfile.TemporaryDirectory() as tmp:
        ref64, ref32 = os.path.join(tmp, "f64.h5"), os.path.join(tmp, "f32.h5")
        times = {k: [] for k in names}
        cpu = {k: [] for k in names}  # a loaded machine stretches wall time, much less these
        times["reference-f64"].append(
            ced_run(a.ced, a.core, a.config, a.tokens, "reference-f64", ref64, False, cpu["reference-f64"]))
        times["reference"].append(ced_run(a.ced, a.core, a.config, a.tokens, "reference", ref32, False, cpu["reference"]))
        ced_run(a.ced, a.core, a.config, 1, "reference-f64", os.path.join(tmp, "w.h5"), True)  # weights and tokens
        ref64_logits = last_logits(ref64)
        with h5py.File(ref64, "r") as f:
            toks = f["inputs"]["tokens"][()][: a.tokens].astype(np.int64)
        ref64 = os.path.join(tmp, "w.h5")
        with h5py.File(ref64, "r") as f:
            models = {"numpy-f64": Model(f, np.float64, a.plant), "numpy-f32": Model(f, np.float32, a.plant)}
        want = ref64_logits
        # Validate before timing (docs/spec.md §8's habit: a wrong engine has no speed).
        bounds = {"numpy-f64": 1e-9, "numpy-f32": 1e-3}
        for name, m in models.items():
            t0, c0 = time.perf_counter(), time.process_time()
            got = m.prefill(toks)[0].astype(np.float64)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            rel = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            print(f"{name}: last-position logits vs reference-f64, max |diff| / max |ref| = {rel:.3g} "
                  f"(bound {bounds[name]:g}), argmax {int(np.argmax(got))} vs {int(np.argmax(want))}")
            if not rel < bounds[name]:
                print(f"bench-numpy: {name} disagrees with reference-f64; no timings", file=sys.stderr)
                return 1
        for _ in range(a.repeat - 1):  # further interleaved rounds
            for be, out in (("reference-f64", ref64), ("reference", ref32)):
                times[be].append(ced_run(a.ced, a.core, a.config, a.tokens, be, os.path.join(tmp, "r.h5"), False, cpu[be]))
            for name, m in models.items():
                t0, c0 = time.perf_counter(), time.process_time()
                m.prefill(toks)
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    best = {k: min(v) for k, v in times.items()}
    best_cpu = {k: min(v) for k, v in cpu.items()}
    print(f"config {a.config}, N = {a.tokens}, full prefill, core {a.core}, {a.threads} thread(s), "
          f"best of {a.repeat}; load {os.getloadavg()[0]:.2f}")
    print(f"  {'':14s} {'wall s':>9s} {'CPU s':>9s}")
    for k, v in best.items():
        print(f"  {k:14s} {v:9.3f} {best_cpu[k]:9.3f}   (wall: {', '.join(f'{x:.3f}' for x in times[k])}; "
              f"CPU: {', '.join(f'{x:.3f}' for x in cpu[k])})")
    pairs = (("reference-f64", "numpy-f64"), ("reference", "numpy-f32"), ("reference-f64", "reference"))
    ratios = {f"{x} / {y}": best[x] / best[y] for x, y in pairs}
    cpu_ratios = {f"{x} / {y}": best_cpu[x] / best_cpu[y] for x, y in pairs}
    print(f"  {'ratio':28s} {'wall':>7s} {'CPU':>7s}")
    for k in ratios:
        print(f"  {k:28s} {ratios[k]:7.3f} {cpu_ratios[k]:7.3f}")
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"config": a.config, "n_prompt": a.tokens, "threads": a.threads, "core": a.core,
                       "seconds": times, "cpu_seconds": cpu, "best": best, "best_cpu": best_cpu, "ratios": ratios,
                       "cpu_ratios": cpu_ratios, "load_average": os.getloadavg()[0]}, fh, indent=1)
        os.replace(tmp, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
