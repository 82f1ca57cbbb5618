"""The v41 golden files (DeepSeek's official code run on `ced export` checkpoints) and their checkpoints."""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from .. import _core

PathLike = Union[str, "os.PathLike[str]"]


def golden_dir() -> Path:
    """The repository's golden/v41 (``CED_GOLDEN_DIR``/v41 when set)."""
    return Path(_core.default_golden_dir()) / "v41"


@dataclass
class GoldenRun:
    """One official run file (docs/v41.md §12): its prompt, every layer's captures, logits, decode steps."""
    path: Path
    config_name: str
    regime: str
    weight_seed: Optional[int]
    weights_digest: str
    provenance: dict
    tokens: object               # int64 [N]
    result: dict                 # {"logits", "final_collapsed", "final_normed", "layers": [capture dicts]}
    decode: Optional[dict] = field(repr=False, default=None)  # {"tokens", "seed", "steps"} or None
    request: dict = field(default_factory=lambda: {"mode": "full"})  # a CED or resumed prefill's (docs/v41.md §12.8)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def boost(self) -> list[str]:
        """The boosts its checkpoint was exported with ("TENSOR=K"), as its provenance records them."""
        b = self.provenance.get("boost", "")
        return [x for x in b.split(",") if x]


def read_golden(path: PathLike) -> GoldenRun:
    """Reads a v41 run file strictly (``ced.InputError`` with one line otherwise)."""
    d = _core.v41_read_run_file(os.fspath(path))
    return GoldenRun(path=Path(path), config_name=d["config"]["name"], regime=d["regime"],
                     weight_seed=d["weight_seed"], weights_digest=d["weights_digest"], provenance=dict(d["provenance"]),
                     tokens=d["tokens"], result=d["result"], decode=d["decode"],
                     request=dict(d["request"]))


def golden_files(regime: Optional[str] = None, directory: Optional[PathLike] = None) -> list[Path]:
    """The golden files of a regime ("release" files are the official fp8 runs), sorted by name."""
    tag = {None: "", "release": "-fp8-", "bf16": "-bf16-"}.get(regime)
    if tag is None:
        raise ValueError(f"regime {regime!r}: the golden files are of 'release' or 'bf16'")
    d = Path(directory) if directory is not None else golden_dir()
    return sorted(p for p in d.glob("*.h5") if tag in p.name)


def export(config: str, out: PathLike, weight_seed: int = 0, boost: Optional[list[str]] = None,
           shard_bytes: int = 0) -> str:
    """``ced export --config C --weight-seed S --out DIR``: a release-layout checkpoint folder a port's own loader
    reads unchanged; returns its weights digest."""
    return _core.v41_export(config, int(weight_seed), os.fspath(out), int(shard_bytes), list(boost or []))


def config_checkpoint(config: str, folder: Optional[PathLike] = None, weight_seed: int = 0,
                      purpose: str = "ced") -> Path:
    """A built-in's checkpoint folder: ``folder`` (exported there unless it holds one already) or a new
    temporary folder; for the checks that run on a config rather than on a golden file."""
    path = Path(folder) if folder else Path(tempfile.mkdtemp(prefix=f"ced-v41-{purpose}-")) / config
    if not (path / "config.json").exists():
        export(config, path, weight_seed)
    return path


def checkpoint_for(golden: GoldenRun, cache: Optional[PathLike] = None) -> Path:
    """The checkpoint folder a golden file ran, exported once into ``cache`` (default: a folder under the
    system's temporary directory) and checked against the file's weights digest."""
    root = Path(cache) if cache is not None else Path(tempfile.gettempdir()) / "ced-v41-checkpoints"
    key = hashlib.sha256(",".join(golden.boost).encode()).hexdigest()[:8] if golden.boost else "plain"
    folder = root / f"{golden.config_name}-s{golden.weight_seed}-{key}"
    if not (folder / "model.safetensors.index.json").exists():
        if golden.weight_seed is None:
            raise ValueError(f"{golden.name}: records no weight seed: not a `ced export` checkpoint")
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".export-"))
        os.rmdir(tmp)
        digest = export(golden.config_name, tmp, golden.weight_seed, golden.boost)
        try:
            os.rename(tmp, folder)  # atomic: a half-written folder is never taken for a checkpoint
        except OSError:
            pass  # another process made it first
        if digest != golden.weights_digest:
            raise ValueError(f"{golden.name}: its checkpoint made again has digest {digest}, the file's is "
                             f"{golden.weights_digest}")
    return folder
