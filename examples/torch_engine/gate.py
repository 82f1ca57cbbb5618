"""`ced.gate` over the golden files with this engine: every golden run request answered by the
PyTorch engine, judged under golden/policy-calibrated.toml; exit 0 when every run passes.

  python examples/torch_engine/gate.py [--golden DIR] [--only FILE[:RUN]] [--break-layer L]

--break-layer L multiplies layer L's attention scale by 1.01 (docs/spec.md §3.5), to see the gate
name the first divergent layer."""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ced  # noqa: E402

from ced_torch import harness  # noqa: E402
from ced_torch.layer import Layer  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--golden", default=os.path.join(os.path.dirname(__file__), "..", "..", "golden"))
    p.add_argument("--only")
    p.add_argument("--break-layer", type=int)
    a = p.parse_args()
    if a.break_layer is not None:
        original = Layer.attention_scale
        Layer.attention_scale = lambda self, like: original(self, like) * (1.01 if self.l == a.break_layer else 1.0)
    report = ced.gate(harness.GateEngine(), os.path.normpath(a.golden), policy="calibrated", only=a.only)
    for j in report.judged:
        if not j.passed:
            print(f"{j.file}:{j.report.run}: first divergent layer {j.first_divergent_layer}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
