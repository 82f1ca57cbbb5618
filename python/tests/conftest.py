"""Shared fixtures of the `ced` package tests (python/tests)."""
import numpy as np
import pytest

import ced


def pytest_configure(config):
    # Labelled tests that need what CI does not have; each skips, saying why, where it is missing.
    config.addinivalue_line("markers", "official: runs DeepSeek's official inference/model.py (the user's copy, "
                                       "CED_V41_OFFICIAL_INFERENCE / CED_V41_OFFICIAL_KERNEL; torch with FP8 dtypes)")
    config.addinivalue_line("markers", "engine_blocks: holds the sglang / vllm wheels' CPU-runnable building blocks "
                                       "against the reference's (the packages on the path)")


@pytest.fixture(scope="session")
def tiny():
    return ced.config("tiny")


def reference_engine(backend="reference-f64", plant=None):
    """An engine for ced.gate that answers with the harness's own reference;
    `plant(request, result)` may change the result before it is returned."""

    def engine(req: ced.Request):
        r = ced.run(req.config, req.tokens, mode=req.mode, replay=None if req.mode == "full" else req.replay,
                    prefix=None if req.prefix_len < 0 else req.prefix_len, decode=req.decode_steps,
                    capture=req.capture_layers, logits=req.logits, weight_seed=req.weight_seed, backend=backend)
        if plant is not None:
            plant(req, r)
        return r

    return engine


def with_layer_value_changed(result, layer, row, col, factor):
    """Multiplies one element of one captured layer's output (a plant)."""
    caps = result.layers
    for c in caps:
        if c.layer == layer:
            out = c.out.copy()
            out[row, col] *= factor
            c.out = out
    result.layers = caps
    return result
