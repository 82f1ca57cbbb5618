"""The serving engines' CPU-runnable V4.1 building blocks against the reference's (docs/v41.md; the wheels' contents
as read in the project's notes): SGLang 0.5.23's FP4 fake quantization, candidate pool and late-layer tail layout,
vLLM 0.33.0's Engram primes and hash multipliers. Each test prints its agreement (``pytest -s`` or ``-rP``).

The packages are found on the path without being imported (their own imports pull triton and CUDA): the wheels
unpacked onto PYTHONPATH serve, e.g. ``pip download --no-deps sglang==0.5.23 vllm==0.33.0`` and unzip. Only the
named functions of single files are read and run, each alone in a namespace holding what it uses. Without a
package (or with another version lacking a file or a function) its tests are skipped, saying which.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import types
from pathlib import Path
from typing import Optional, Union

import numpy as np
import pytest

from ced import _core

torch = pytest.importorskip("torch", reason="the engines' building blocks are torch code")
F = torch.nn.functional

pytestmark = pytest.mark.engine_blocks


def package_file(package: str, relpath: str) -> Path:
    spec = importlib.util.find_spec(package)  # a top-level name: found, not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not on the path (pip download --no-deps it and unzip onto PYTHONPATH)")
    path = Path(list(spec.submodule_search_locations)[0]) / relpath
    if not path.is_file():
        pytest.skip(f"{package} {version(package)} has no {relpath}")
    return path


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def lift(package: str, relpath: str, names: tuple, **uses) -> types.SimpleNamespace:
    """The named top-level functions, classes and constants of one file of a package, run alone with ``uses`` as
    their globals: the file's imports (triton, the package's CUDA JIT) are never executed."""
    path = package_file(package, relpath)
    tree = ast.parse(path.read_text())

    def named(n):
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            return n.name
        return n.targets[0].id if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) else None
    nodes = [n for n in tree.body if named(n) in names]
    missing = set(names) - {named(n) for n in nodes}
    if missing:
        pytest.skip(f"{package} {version(package)}: {relpath} lacks {sorted(missing)}")
    space = dict(uses)
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), space)
    return types.SimpleNamespace(**{k: space[k] for k in names})


def agreement(what: str, same: int, total: int) -> None:
    print(f"agreement: {what}: {same}/{total} bitwise")
    assert same == total, f"{what}: {total - same} of {total} differ"


def flat_config(name: str) -> dict:
    return json.loads(_core.v41_config(name)["json"])


# ---- SGLang: FP4 fake quantization (kernels/ops/quantization/fp4_fake_quant.py) ------------------------------

def fp4_inputs(block: int) -> torch.Tensor:
    """bf16 rows of every scale, e2m1 ties at scale 1, zero blocks and blocks under the amax floors."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(64, 8 * block, generator=g) * 2.0 ** torch.randint(-40, 12, (64, 1), generator=g)]
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    rows.append(torch.cat([ties, -ties]).repeat(block * 8 // 16)[None])
    rows.append(torch.zeros(1, 8 * block))
    rows.append(torch.full((1, 8 * block), 2.0 ** -130))  # below 6 * 2^-126 and 6 * 2^-9
    rows.append(torch.full((1, 8 * block), 1e-3))          # below 6 * 2^-9 only
    return torch.cat(rows).to(torch.bfloat16)


def sglang_fp4() -> types.ModuleType:
    """The whole file: it imports torch alone."""
    spec = importlib.util.spec_from_file_location(
        "sglang_fp4_fake_quant", package_file("sglang", "kernels/ops/quantization/fp4_fake_quant.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def bits_same(ours: np.ndarray, theirs: torch.Tensor) -> int:
    return int((ours.astype(np.float32).view(np.uint32) == theirs.float().numpy().view(np.uint32)).sum())


def test_sglang_fake_quant_fp4_is_our_index_fp4_qdq_bit_for_bit():
    m = sglang_fp4()
    x = fp4_inputs(32)
    theirs = m.fake_quant_fp4(x)
    ours = _core.v41_fp4_qdq_ue8m0_32(x.float().numpy())
    agreement(f"sglang {version('sglang')} fake_quant_fp4 vs v41_fp4_qdq_ue8m0_32", bits_same(ours, theirs), x.numel())


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"),
                    reason=f"torch {torch.__version__} lacks float8_e4m3fn, which SGLang rounds the scale through")
def test_one_planted_ulp_in_our_fp4_qdq_fails_the_agreement():
    m = sglang_fp4()
    x = fp4_inputs(32)
    ours = _core.v41_fp4_qdq_ue8m0_32(x.float().numpy()).astype(np.float32)
    ours.flat[5] = np.nextafter(ours.flat[5], np.float32(np.inf))
    with pytest.raises(AssertionError, match="1 of .* differ"):
        agreement("planted", bits_same(ours, m.fake_quant_fp4(x)), x.numel())


def test_sglang_fake_quant_compressed_kv_is_our_compressed_kv_fp4_qdq_bit_for_bit():
    m = sglang_fp4()
    x = fp4_inputs(16)
    theirs = m.fake_quant_compressed_kv(x)
    ours = _core.v41_fp4_qdq_e4m3_16(x.float().numpy())
    agreement(f"sglang {version('sglang')} fake_quant_compressed_kv vs v41_fp4_qdq_e4m3_16", bits_same(ours, theirs),
              x.numel())


# ---- SGLang: the candidate pool (kernels/ops/attention/dsv4/candidate_blocks.py) --------------------------------

def causal_scores(rows: int, width: int, ratio: int, levels: Optional[int], first: int = 0):
    """Index scores of prefill rows first .. first + rows - 1 over ``width`` compressed positions, -inf past each row's
    compress length; ``levels`` rounds them to that many values (equal block maxima: ties)."""
    g = torch.Generator().manual_seed(rows * width + ratio)
    s = torch.randn(rows, width, generator=g)
    if levels:
        s = (s * levels / 4).round()
    lens = (torch.arange(first + 1, first + rows + 1) // ratio)[:, None]
    return s.masked_fill(torch.arange(width) >= lens, -torch.inf), lens


@pytest.mark.parametrize("rows,width,ratio,topk_blocks,block_size,levels,first", [
    (40, 40, 1, 3, 4, None, 0),          # v41-tiny's candidate source
    (80, 40, 2, 3, 4, None, 0),          # ratio 2: rows with no compressed position yet
    (300, 300, 1, 16, 8, None, 0),       # the wide preset's geometry
    (300, 300, 1, 16, 8, 3, 0),          # equal block maxima everywhere
    (4, 20000, 1, 2048, 8, None, 19996), # the release's 2048 blocks of 8, past 2048 blocks
])
def test_sglang_candidate_blocks_are_our_candidate_pool(rows, width, ratio, topk_blocks, block_size, levels, first):
    m = lift("sglang", "kernels/ops/attention/dsv4/candidate_blocks.py",
             ("select_candidate_block_ids", "candidate_block_mask"), torch=torch, F=F, Union=Union)
    scores, lens = causal_scores(rows, width, ratio, levels, first)
    ids = m.select_candidate_block_ids(scores, lens, topk_blocks, block_size)
    theirs = m.candidate_block_mask(ids, width, block_size).numpy().astype(np.uint8)
    ours = _core.v41_candidate_mask(scores.double().numpy(), lens[:, 0].numpy(), topk_blocks, block_size)
    same_rows = int(sum(np.array_equal(a, b) for a, b in zip(ours, theirs)))
    agreement(f"sglang select_candidate_block_ids + candidate_block_mask vs v41_candidate_mask "
              f"({topk_blocks} blocks of {block_size}, ratio {ratio}{', tied' if levels else ''}) rows",
              same_rows, rows)


# ---- SGLang: the late-layer tail (kernels/ops/attention/dsv4/attn_metadata_kernels.py) -------------------------

def sglang_tail():
    def async_h2d(lists, dtype, device):  # the H2D copy it stands for, on the CPU
        return torch.tensor(lists, dtype=dtype, device=device)
    m = lift("sglang", "kernels/ops/attention/dsv4/attn_metadata_kernels.py",
             ("late_layer_tail_lens", "late_layer_tail_layout", "_whole_extend_tail_layout"),
             torch=torch, Optional=Optional, async_h2d=async_h2d)
    window = lift("sglang", "srt/layers/attention/deepseek_v4_backend.py", ("SWA_WINDOW",)).SWA_WINDOW
    return m, window


def test_sglang_tail_length_is_our_bounded_tail_on_the_release():
    _, window = sglang_tail()
    ours = _core.v41_tail_layout("v41-flash", "sglang", 1000, 0)
    agreement(f"sglang SWA_WINDOW (late_layer_tail_layout's tail_len) {window} vs v41_bounded_tail {ours['tail']}",
              int(window == ours["tail"]), 1)


@pytest.mark.parametrize("prompts", [[1], [5], [127], [128], [129], [300], [4096], [300, 50, 200]])
def test_sglang_late_layer_tail_rows_and_floors_are_our_bounded_replays(prompts):
    m, window = sglang_tail()
    rows, lens, floor = m.late_layer_tail_layout(extend_lens_cpu=prompts, seq_lens_cpu=prompts, tail_len=window,
                                                 device=torch.device("cpu"))
    want_rows, want_lens, want_floor, start = [], [], [], 0
    for n in prompts:  # each request a cold prompt of n tokens, replayed by our sglang convention
        t = _core.v41_tail_layout("v41-flash", "sglang", n, 0)
        want_rows += range(start + t["first_row"], start + n)
        want_lens.append(n - t["first_row"])
        want_floor += [t["floor"]] * (n - t["first_row"])
        start += n
    same = int(rows.tolist() == want_rows) + int(lens == want_lens) + int(floor.tolist() == want_floor)
    agreement(f"sglang late_layer_tail_layout vs v41_tail_layout for prompts {prompts}: rows, lengths, floors", same, 3)
    assert (late := m.late_layer_tail_lens(prompts, window)) == want_lens, late


# ---- vLLM: Engram primes and hash multipliers (models/deepseek_v41/common/engram.py) ----------------------------

def vllm_engram():
    return lift("vllm", "models/deepseek_v41/common/engram.py",
                ("_is_prime", "find_next_prime", "compute_hash_multipliers", "EngramLayout"), np=np, torch=torch)


@pytest.mark.parametrize("config", ["v41-tiny", "v41-flash"])
def test_vllm_engram_layout_primes_are_ours(config):
    c = flat_config(config)
    layout = vllm_engram().EngramLayout(types.SimpleNamespace(**c, engram_pad_token_id=c["engram_pad_id"]))
    theirs = [[p for per_ngram in layer for p in per_ngram] for layer in layout.primes]
    ours = _core.v41_engram_primes(config)
    agreement(f"vllm {version('vllm')} EngramLayout.primes (find_next_prime) vs v41_engram_primes on {config}",
              sum(a == b for x, y in zip(theirs, ours) for a, b in zip(x, y)), sum(map(len, ours)))
    assert len(theirs) == len(ours) and all(len(x) == len(y) for x, y in zip(theirs, ours))


@pytest.mark.parametrize("config", ["v41-tiny", "v41-flash"])
def test_vllm_hash_multipliers_are_ours(config):
    c = flat_config(config)
    theirs = vllm_engram().compute_hash_multipliers(tuple(c["engram_layer_ids"]), c["engram_max_ngram_size"],
                                                    c["engram_compressed_vocab_size"]).tolist()
    ours = _core.v41_engram_multipliers(config)
    agreement(f"vllm {version('vllm')} compute_hash_multipliers vs v41_engram_multipliers on {config}",
              sum(a == b for x, y in zip(theirs, ours) for a, b in zip(x, y)), sum(map(len, ours)))
    assert np.shape(theirs) == np.shape(ours)
