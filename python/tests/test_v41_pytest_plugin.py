"""The `ced` pytest plugin as a port uses it: one import line and `--ced-engine`, the gate, the properties and the
generation verdicts as tests; a planted bug fails with the layer, tensor and position in its message."""
from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

PORT = '''
import ced.v41 as v41

def make():
    return v41.ReferenceEngine(convention="sglang", encoder_replay="vllm")

def make_buggy():
    return v41.ReferenceEngine(fault="v4-q-norm")

def make_ring_bug():
    return v41.ReferenceEngine(fault="ced-ring-slot-of-row", convention="sglang", encoder_replay="vllm")


class Diverging(v41.ReferenceEngine):
    """Its second decode step's top-1 pushed to rank 10: a greedy choice outside the reference's top-5."""
    def prefill(self, tokens):
        self.steps = 0
        return super().prefill(tokens)

    def decode(self, token):
        import numpy as np
        self.steps += 1
        logits = np.array(super().decode(token))
        if self.steps == 2:
            order = np.argsort(-logits)
            logits[order[9]] = logits[order[0]] + 1.0
        return logits


def make_diverging():
    return Diverging()


def make_bf16():
    return v41.ReferenceEngine("bf16")
'''
SUITE = "from ced.v41.testsuite import *\n"


@pytest.fixture
def port(pytester):
    pytester.makepyfile(myport=PORT, test_ced=SUITE)
    pytester.syspathinsert()
    return pytester


def test_a_port_passes_the_whole_suite_with_one_import_and_one_option(port, tmp_path):
    r = port.runpytest("--ced-engine", "myport:make", "--ced-checkpoints", str(tmp_path), "-q", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=8 + 6 + 1)  # the release golden files, the properties, the generation verdict


def test_a_planted_bug_fails_the_gate_with_layer_tensor_and_position(port, tmp_path):
    r = port.runpytest("--ced-engine", "myport:make_buggy", "--ced-checkpoints", str(tmp_path), "-q",
                       "-k", "test_gate and tiny-fp8-n17.h5", "-p", "no:cacheprovider")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*tiny-fp8-n17.h5: teacher forced, layer 0, attn_q (forced x):*at layer 0 position *, "
                            "index *: ours * official *"])


def test_a_planted_replay_bug_fails_its_property_test(port, tmp_path):
    r = port.runpytest("--ced-engine", "myport:make_ring_bug", "--ced-checkpoints", str(tmp_path), "-q",
                       "-k", "test_ced_property", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=5, failed=1)
    r.stdout.fnmatch_lines(["*a decode step after a ced prefill*not bitwise*"])


def test_a_free_running_divergence_outside_the_top_n_fails_the_generation_test(port, tmp_path):
    r = port.runpytest("--ced-engine", "myport:make_diverging", "--ced-checkpoints", str(tmp_path), "-q",
                       "-k", "test_generation", "-p", "no:cacheprovider")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*first divergent step 2: reference * (rank * on the engine), engine *outside the top-5*"])


def test_without_an_engine_the_suite_skips(port):
    r = port.runpytest("-q", "-k", "test_generation", "-p", "no:cacheprovider")
    r.assert_outcomes(skipped=1)


@pytest.mark.parametrize("spec", ["myport", ":make", "myport:"])
def test_a_malformed_engine_option_is_a_usage_error(spec, port):
    """MODULE:FACTORY needs all three: the colon, a module before it and a factory after it."""
    r = port.runpytest("--ced-engine", spec, "-q", "-p", "no:cacheprovider")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([f"*--ced-engine {spec}: want MODULE:FACTORY*"])


@pytest.mark.parametrize("factory,regime", [("make", "release"), ("make_bf16", "bf16")])
def test_an_engine_is_handed_only_the_golden_files_of_its_own_regime(factory, regime, port):
    """A bf16 port judged against the official fp8 runs would fail for numerics it never claimed (and a release port
    judged against bf16 runs would pass a regime it does not compute): test_gate is parametrized over exactly the
    golden files of the engine's regime."""
    import ced.v41 as v41
    r = port.runpytest("--ced-engine", f"myport:{factory}", "--collect-only", "-q", "-k", "test_gate",
                       "-p", "no:cacheprovider")
    assert r.ret == pytest.ExitCode.OK, r.stdout.str()
    ids = sorted(line.split("[", 1)[1].rstrip("]") for line in r.stdout.lines
                 if line.startswith("test_ced.py::test_gate["))
    expected = sorted(f.name for f in v41.golden_files(regime))
    tag = {"release": "-fp8-", "bf16": "-bf16-"}[regime]
    assert expected and all(tag in name for name in expected), expected
    assert ids == expected, r.stdout.str()
