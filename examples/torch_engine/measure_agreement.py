"""The engine's agreement with reference-f64: rel L2 of its logits against a run file written by
`ced run --backend reference-f64` or a golden file, run by run, beside the f32 reference's own
error (golden/calibration.toml) where the file is a golden one.

  python measure_agreement.py golden/tiny.h5 [more.h5 ...] [--dtype f32|f64]
"""
from __future__ import annotations

import argparse
import os
import sys
import tomllib

import h5py
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ced_torch import config, weights  # noqa: E402
from ced_torch.model import Engine  # noqa: E402


def calibration(path: str) -> dict:
    cal = os.path.join(os.path.dirname(path), "calibration.toml")
    if not os.path.exists(cal):
        return {}
    with open(cal, "rb") as f:
        for entry in tomllib.load(f)["file"]:
            if entry["name"] == os.path.basename(path):
                return {t["name"]: t["rel_l2"] for t in entry["tensors"]}
    return {}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+")
    p.add_argument("--dtype", default="f32", choices=["f32", "f64"])
    a = p.parse_args()
    dtype = torch.float32 if a.dtype == "f32" else torch.float64
    print(f"{'file':28s} {'run':20s} {'N':>5s} {'engine ' + a.dtype:>12s} {'reference f32':>14s}")
    for path in a.files:
        with h5py.File(path, "r") as f:
            cfg = config.from_h5(f["config"])
            seed = int(f["inputs/tokens"].attrs["weight_seed"])
            eng = Engine(cfg, weights.generate(cfg, seed, dtype), dtype=dtype)
            toks = f["inputs/tokens"][()].tolist()
            cal = calibration(path)
            for run, g in f["runs"].items():
                at = dict(g.attrs)
                n, k = int(at["n_prompt"]), int(at["decode_steps"])
                replay = None if at["replay"] == "none" else at["replay"]
                res = eng.run(toks[: n + k], mode=at["mode"], replay=replay,
                              prefix=None if at["prefix_len"] < 0 else int(at["prefix_len"]), decode=k,
                              logits="all" if len(g["positions"]) > 1 + k else "last", capture=False)
                ref = torch.from_numpy(g["logits"][()])
                rel = float(torch.linalg.norm(res.logits.double() - ref) / torch.linalg.norm(ref))
                own = cal.get(f"runs/{run}/logits")
                print(f"{os.path.basename(path):28s} {run:20s} {n:5d} {rel:12.3e} "
                      f"{'' if own is None else f'{own:14.3e}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
