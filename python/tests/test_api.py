"""The `ced` Python package against docs/spec.md: each check is shown failing on a
planted difference in the same test."""
import io
import json
import struct
import contextlib

import numpy as np
import pytest

import ced
from conftest import reference_engine, with_layer_value_changed


# ---- config, weights, tokens (docs/spec.md §1, §2) -------------------------

def test_config_reads_builtins_and_overrides_like_set(tiny):
    assert tiny.window == 4 and tiny.compress_ratios == [0, 2, 2, 2, 1, 1, 1, 1]
    c = ced.config("tiny", window=5, tie_decoder_kv=False)
    assert c.window == 5 and c.name == "tiny[window=5][tie_decoder_kv=false]"
    assert ced.config(c, window=6).window == 6
    assert c != tiny


def test_a_bad_config_is_an_input_error_with_the_clis_message():
    with pytest.raises(ced.InputError, match=r"^config: window: ") as e:
        ced.config("tiny", window=0)
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    with pytest.raises(ced.InputError, match="nope"):
        ced.config("nope")


def test_weights_have_the_spec_names_shapes_and_test_vectors(tiny):
    w = ced.weights(tiny, seed=1)
    assert w["embed"].shape == (97, 32) and w["embed"].dtype == np.float32
    assert w["layers.1.wq_a"].shape == (32, 16) and w["lm_head"].shape == (32, 97)
    assert "layers.1.comp_wgate" in w and "layers.4.comp_wgate" not in w  # Full r >= 2 only
    # docs/spec.md §2.4 test vectors (weight seed 1).
    np.testing.assert_array_equal(w["embed"][0, :4],
                                  np.float32([-0.714873552, -0.0762129724, -0.200827211, 1.33563972]))
    w64 = ced.weights(tiny, seed=1, dtype="f64")
    assert w64["layers.0.attn_norm"][0] == 1.0984661189262428
    assert w64["layers.1.wq_a"][0, 1] == -0.078054622983584981
    assert w64["lm_head"][0, 0] == 0.30084368998587074
    # A planted seed change is seen.
    assert not np.array_equal(ced.weights(tiny, seed=2)["embed"], w["embed"])


def test_bf16_weights_are_the_f32_value_rounded_to_bf16_nearest_even(tiny):
    w32 = ced.weights(tiny, seed=1)["embed"]
    wbf = ced.weights(tiny, seed=1, dtype="bf16")["embed"]
    u = w32.view(np.uint32).astype(np.uint64)
    want = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(wbf, want)
    assert not np.array_equal(wbf, w32)


def test_tokens_are_the_spec_stream(tiny):
    assert ced.tokens(tiny, 20, seed=2).tolist() == [40, 62, 55, 19, 80, 7, 71, 93, 66, 56, 93, 25, 85, 54, 96, 52,
                                                     6, 90, 66, 18]
    assert ced.tokens(tiny, 8).tolist() == [64, 68, 72, 7, 68, 29, 5, 15]


def read_safetensors(path):
    """A reader written from the safetensors format alone (not the harness's)."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        if e["dtype"] == "BF16":
            a = (np.frombuffer(data[b:end], "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(data[b:end], {"F32": "<f4", "F64": "<f8", "I32": "<i4"}[e["dtype"]])
        out[name] = a.reshape(e["shape"])
    return header["__metadata__"], out, n


@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16"])
def test_export_writes_safetensors_equal_to_ced_weights(tmp_path, tiny, dtype):
    p = tmp_path / "w.safetensors"
    ced.export(p, tiny, weight_seed=1, dtype=dtype, tokens=17, token_seed=2)
    meta, tensors, n = read_safetensors(p)
    assert (8 + n) % 8 == 0
    assert json.loads(meta["config"])["window"] == 4 and meta["weight_seed"] == "1" and meta["dtype"] == dtype
    w = ced.weights(tiny, seed=1, dtype=dtype)
    assert set(tensors) == set(w) | {"tokens"}
    for name, a in w.items():
        np.testing.assert_array_equal(tensors[name], a, err_msg=name)
    np.testing.assert_array_equal(tensors["tokens"], ced.tokens(tiny, 17, seed=2))
    # The check sees a planted difference: another seed's weights.
    assert not np.array_equal(tensors["embed"], ced.weights(tiny, seed=0, dtype=dtype)["embed"])


def test_export_refuses_a_bad_dtype_and_leaves_no_file(tmp_path, tiny):
    with pytest.raises(ced.InputError, match="f16"):
        ced.export(tmp_path / "w.safetensors", tiny, dtype="f16")
    assert list(tmp_path.iterdir()) == []


# ---- runs (docs/spec.md §4–§6) -------------------------------------------------

def test_run_returns_numpy_logits_positions_layers_and_attributes(tiny):
    r = ced.run(tiny, 17, mode="ced", replay="bounded", decode=3, capture=True, weight_seed=1, token_seed=2,
                backend="reference-f64")
    assert r.logits.shape[1] == 97 and r.logits.dtype == np.float64
    assert r.positions[-1] == 19 and list(r.positions) == sorted(r.positions)
    assert r.mode == "ced" and r.replay == "bounded" and r.replay_start == 13 and r.decode_steps == 3
    # docs/spec.md §2.4 end-to-end vector: ced-bounded logits at position 13.
    row = r.logits[list(r.positions).index(13)]
    np.testing.assert_array_equal(row[:2], [1.1990480354706847, 0.10467197381647814])
    assert [c.layer for c in r.layers] == list(range(8))
    assert r.layers[0].topk is None and r.layers[1].topk.shape[1] == tiny.index_topk
    assert r.layers[3].out.shape == (len(r.layers[3].positions), 32)


def test_token_ids_are_checked_against_int32_at_its_exact_bounds(tiny):
    # one past either end of int32 cannot be held at all; the ends themselves are int32s, refused only as
    # outside the vocabulary (docs/spec.md §2.3), with that message
    for t in (2**31, -2**31 - 1):
        with pytest.raises(ced.InputError, match=f"token 1 is {t}, outside int32"):
            ced.run(tiny, [1, t])
    for t in (2**31 - 1, -2**31):
        with pytest.raises(ced.InputError, match=rf"token {t} at index 1 is out of range \[0, 97\)"):
            ced.run(tiny, [1, t])


def test_a_result_that_counted_no_flops_reports_zero(tiny):
    # a result an engine builds (or one from a backend without a counter) has no per-layer counts: 0, not
    # a made-up figure; a reference run counts its own
    assert ced.RunResult().flops == 0
    assert ced.run(tiny, 5).flops > 0


def test_exact_replay_equals_full_at_the_last_position_and_bounded_does_not_always(tiny):
    toks = ced.tokens(tiny, 40, seed=3)
    full = ced.run(tiny, toks, logits="last")
    exact = ced.run(tiny, toks, mode="ced", replay="exact", logits="last")
    np.testing.assert_array_equal(exact.logits, full.logits)
    one = ced.run(tiny, toks, mode="ced", replay="1", logits="last")
    assert not np.array_equal(one.logits, full.logits)  # the same check on a truncated replay sees it


def test_a_request_that_breaks_the_spec_raises_the_clis_line(tiny):
    with pytest.raises(ced.InputError, match="--prefix"):
        ced.run(tiny, 10, mode="resume", prefix=11)
    with pytest.raises(ced.InputError, match="token"):
        ced.run(tiny, [1, 2, 500])
    with pytest.raises(ced.InputError, match="bogus"):
        ced.run(tiny, 10, backend="bogus")


def test_help_of_run_documents_its_arguments():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        help(ced.run)
    for word in ("replay", "prefix", "decode", "capture", "InputError", "docs/spec.md"):
        assert word in buf.getvalue()


# ---- compare (docs/spec.md §8) ----------------------------------------------------

def test_compare_passes_identical_runs_and_names_a_planted_layer_and_position(tiny):
    ref = ced.run(tiny, 17, capture=True, weight_seed=1, backend="reference-f64")
    same = ced.compare(ref, ced.run(tiny, 17, capture=True, weight_seed=1, backend="reference-f64"))
    assert same.passed and same.first_inexact_layer == -1 and same.first_divergent_layer == -1
    bad = with_layer_value_changed(ced.run(tiny, 17, capture=True, weight_seed=1, backend="reference-f64"),
                                   layer=5, row=9, col=3, factor=1 + 1e-9)
    rep = ced.compare(bad, ref, policy="golden")
    assert not rep.passed and rep.first_divergent_layer == 5
    failing = rep.failures[0]
    assert failing.name == "runs/run/layers/5/out" and failing.worst.startswith("position 9, column 3")
    assert failing.metrics["max_abs_err"] > 0 and failing.violations
    assert "FAIL" in str(rep)


def test_compare_sees_a_structural_difference(tiny):
    a = ced.run(tiny, 17, weight_seed=1)
    b = ced.run(tiny, 17, mode="ced", replay="exact", weight_seed=1)
    rep = ced.compare(a, b)
    assert not rep.passed and any("mode" in p for p in rep.problems)


# ---- files (docs/spec.md §9) --------------------------------------------------------

def test_write_run_then_read_run_round_trips_bitwise(tmp_path, tiny):
    toks = ced.tokens(tiny, 20, seed=2)
    r = ced.run(tiny, toks, decode=3, capture=True, weight_seed=1)
    ced.write_run(tmp_path / "r.h5", tiny, toks, {"mine": r}, weight_seed=1, token_seed=2)
    f = ced.read_run(tmp_path / "r.h5")
    assert f.config == tiny and f.weight_seed == 1 and not f.tokens_explicit
    np.testing.assert_array_equal(f.tokens, toks)
    back = f.runs["mine"]
    assert ced.compare(back, r).first_inexact_layer == -1 and ced.compare(back, r).passed
    np.testing.assert_array_equal(back.logits, r.logits)
    planted = back.logits.copy()
    planted[2, 5] = np.nextafter(planted[2, 5], np.inf)  # one ulp: the round-trip check sees it
    back.logits = planted
    rep = ced.compare(back, r)
    assert not rep.passed and rep.failures[0].worst.startswith("position 2, column 5")


def test_read_run_refuses_a_damaged_file_with_one_line(tmp_path):
    p = tmp_path / "bad.h5"
    p.write_bytes(b"not an hdf5 file")
    with pytest.raises(ced.InputError, match=r"^cannot read '.*bad\.h5'") as e:
        ced.read_run(p)
    assert "\n" not in str(e.value)


def test_write_run_refuses_a_bad_run_name_and_leaves_no_file(tmp_path, tiny):
    r = ced.run(tiny, 5)
    with pytest.raises(ced.InputError, match="run name"):
        ced.write_run(tmp_path / "r.h5", tiny, ced.tokens(tiny, 5), {"a/b": r})
    assert not (tmp_path / "r.h5").exists()


# ---- the gate (docs/spec.md §10 `ced gate`) -------------------------------------------

def test_gate_passes_the_reference_engine_on_the_golden_files(capfd):
    rep = ced.gate(reference_engine(), policy="golden", only="tiny.h5")
    assert rep.passed and rep.runs == len(rep.judged) >= 4 and not rep.failures
    assert all(j.first_divergent_layer == -1 for j in rep.judged)
    out = capfd.readouterr().out
    assert "pass  tiny.h5:full" in out and "passed, 0 failed" in out


def test_gate_fails_an_engine_with_one_value_changed_naming_run_layer_and_position(capfd):
    def plant(req, r):
        if req.mode == "full" and req.capture_layers:
            with_layer_value_changed(r, layer=3, row=7, col=1, factor=1 + 1e-6)

    rep = ced.gate(reference_engine(plant=plant), policy="golden", only="tiny.h5")
    assert not rep.passed
    assert [f["run"] for f in rep.failures] == ["full"]
    assert (rep.runs, rep.passed_runs) == (5, 4)  # one failing run among five: four passed, not five
    (bad,) = [j for j in rep.judged if not j.passed]
    assert bad.report.run == "full" and bad.first_divergent_layer == 3
    assert bad.report.failures[0].worst.startswith("position 7, column 1")
    assert "runs/full/layers/3/out" in rep.failures[0]["what"]
    out = capfd.readouterr().out
    assert "first divergent layer 3" in out and "5 runs, 4 passed, 1 failed, 0 not supported" in out


def test_gate_judges_the_f32_reference_under_the_calibrated_policy():
    rep = ced.gate(reference_engine("reference"), policy="calibrated", only="tiny.h5", quiet=True)
    assert rep.passed, rep.failures
    planted = ced.gate(reference_engine("reference", plant=lambda q, r: with_layer_value_changed(
        r, layer=6, row=0, col=0, factor=1.5) if q.capture_layers else None), policy="calibrated", only="tiny.h5",
        quiet=True)
    failed = [j for j in planted.judged if not j.passed]
    assert failed and all(j.first_divergent_layer == 6 for j in failed)


def test_gate_accepts_a_dict_of_arrays_and_propagates_engine_errors():
    def dict_engine(req):
        r = reference_engine()(req)
        return {"logits": r.logits, "positions": r.positions, "replay_start": r.replay_start,
                "layers": {c.layer: {"positions": c.positions, "out": c.out, "topk": c.topk} for c in r.layers}}

    assert ced.gate(dict_engine, policy="golden", only="tiny.h5:full", quiet=True).passed

    def broken(req):
        raise RuntimeError("engine exploded")

    with pytest.raises(RuntimeError, match="engine exploded"):
        ced.gate(broken, only="tiny.h5:full", quiet=True)


def test_gate_with_an_unknown_selection_is_an_input_error():
    with pytest.raises(ced.InputError, match="--only"):
        ced.gate(reference_engine(), only="tiny.h5:nope", quiet=True)


def test_gate_reads_the_stored_calibration_only_for_a_self_calibrating_policy(tmp_path):
    import shutil
    golden = ced._core.default_golden_dir()
    for name in ("tiny.h5", "policy.toml", "policy-calibrated.toml"):
        shutil.copy(f"{golden}/{name}", tmp_path / name)
    assert ced.gate(reference_engine(), golden_dir=tmp_path, policy="golden", quiet=True).passed
    with pytest.raises(ced.InputError, match="calibration"):
        ced.gate(reference_engine("reference"), golden_dir=tmp_path, policy="calibrated", quiet=True)
    with pytest.raises(ced.InputError, match="policy"):
        ced.gate(reference_engine(), golden_dir=tmp_path, policy=None, quiet=True)


class _Refusing:
    """A reference engine whose ``supports`` refuses the runs ``refuse(request)`` names."""

    def __init__(self, refuse):
        self.refuse, self.called = refuse, []
        self.engine = reference_engine()

    def supports(self, req):
        return "this test's engine does not do it" if self.refuse(req) else ""

    def __call__(self, req):
        self.called.append(req.mode)
        return self.engine(req)


def test_gate_lists_the_runs_an_engine_does_not_support_and_judges_the_rest():
    e = _Refusing(lambda req: req.mode == "resume")
    rep = ced.gate(e, policy="golden", only="tiny.h5", quiet=True)
    assert rep.passed and (rep.runs, rep.passed_runs, len(rep.judged)) == (5, 4, 4)
    assert [(n["run"], n["why"]) for n in rep.not_supported] == [("resume", "this test's engine does not do it")]
    assert "resume" not in e.called  # asked before running: never called for it


def test_gate_that_judged_no_run_does_not_pass_and_says_so(capfd):
    e = _Refusing(lambda req: True)
    rep = ced.gate(e, policy="golden", only="tiny.h5")
    assert not rep.passed and not rep and not rep.failures
    assert (rep.runs, rep.passed_runs, len(rep.judged), len(rep.not_supported)) == (5, 0, 0, 5) and not e.called
    out = capfd.readouterr().out
    assert "5 runs, 0 passed, 0 failed, 5 not supported" in out
    assert "FAIL: no run was judged: the engine supports none of the 5 selected runs" in out


def test_gate_with_no_golden_run_to_judge_is_an_input_error(tmp_path, tiny):
    import shutil
    shutil.copy(f"{ced._core.default_golden_dir()}/policy.toml", tmp_path / "policy.toml")
    with pytest.raises(ced.InputError, match="no .h5 files"):
        ced.gate(reference_engine(), golden_dir=tmp_path, policy="golden", quiet=True)
    ced.write_run(tmp_path / "empty.h5", tiny, ced.tokens(tiny, 5), {})
    with pytest.raises(ced.InputError, match="hold no run: no run was judged"):
        ced.gate(reference_engine(), golden_dir=tmp_path, policy="golden", quiet=True)


_EXACT_POLICY = """[[rule]]
pattern = "runs/*/layers/*/topk"
reason = "this test: exact selections"
min_jaccard = 1

[[rule]]
pattern = "**"
reason = "this test: any difference fails"
atol = 0
rtol = 0
"""


@pytest.mark.parametrize("policy,backend", [("golden", "reference-f64"), ("calibrated", "reference")])
def test_gate_judges_under_the_policy_files_of_the_golden_dir_it_is_given(tmp_path, policy, backend):
    # The named policy is the file in golden_dir, not in the repository's golden/: a copy of
    # the golden folder whose policy allows no difference at all fails what the shipped one passes
    # (the f64 engine's logits changed by 1e-13 relative, within the shipped rtol of 1e-11; the
    # f32 reference, within its calibrated bounds).
    import shutil
    golden = ced._core.default_golden_dir()
    for name in ("tiny.h5", "calibration.toml", "policy.toml", "policy-calibrated.toml"):
        shutil.copy(f"{golden}/{name}", tmp_path / name)

    def plant(req, r):
        if backend == "reference-f64":
            L = r.logits.copy()
            i = np.unravel_index(np.argmax(np.abs(L)), L.shape)
            L[i] *= 1 + 1e-13
            r.logits = L

    engine = reference_engine(backend, plant=plant)
    assert ced.gate(engine, policy=policy, only="tiny.h5:full", quiet=True).passed
    assert ced.gate(engine, golden_dir=tmp_path, policy=policy, only="tiny.h5:full", quiet=True).passed
    name = "policy.toml" if policy == "golden" else "policy-calibrated.toml"
    (tmp_path / name).write_text(_EXACT_POLICY)
    rep = ced.gate(engine, golden_dir=tmp_path, policy=policy, only="tiny.h5:full", quiet=True)
    assert not rep.passed and [f["run"] for f in rep.failures] == ["full"]
