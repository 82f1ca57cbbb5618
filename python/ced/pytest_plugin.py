"""The `ced` pytest plugin (an entry point of the package: installed with it, active in every pytest run).

A port's test suite gains the v41 gate, the CED properties and the generation verdicts in a few lines::

    # tests/test_ced.py of the port
    from ced.v41.testsuite import *      # test_gate[golden file], test_ced_property[name], test_generation

    $ pytest --ced-engine mypkg.engine:make tests/test_ced.py

``--ced-engine MODULE:FACTORY`` names a callable returning the port's :class:`ced.v41.Engine`; without it the
``ced_engine`` fixture skips. Other options: ``--ced-checkpoints DIR`` (where the tiny checkpoints are exported,
reused between runs), ``--ced-record DIR`` (the gate records every request and answer there, one folder per
golden file: ``ced.v41.replay(DIR/FILE)`` reproduces a failure without the engine).
Fixtures: ``ced_engine``, ``ced_checkpoints`` (the folder), ``ced_golden_file`` (parametrized over the golden
files of the engine's regime), ``ced_property`` (parametrized over the CED properties), ``ced_record``.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: Any) -> None:
    g = parser.getgroup("ced", "the CED harness's judge of a DeepSeek-V4.1 port")
    g.addoption("--ced-engine", default=None, metavar="MODULE:FACTORY",
                help="the port's engine factory (a callable returning a ced.v41.Engine)")
    g.addoption("--ced-checkpoints", default=None, metavar="DIR", help="where the tiny checkpoints are exported")
    g.addoption("--ced-record", default=None, metavar="DIR",
                help="record every request and answer of the gate there (ced.v41.replay reproduces them)")


def _factory(spec: str) -> Any:
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise pytest.UsageError(f"--ced-engine {spec}: want MODULE:FACTORY, e.g. mypkg.engine:make")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise pytest.UsageError(f"--ced-engine {spec}: {e}") from None


def pytest_configure(config: Any) -> None:
    spec = config.getoption("--ced-engine")
    if spec:
        _factory(spec)  # a malformed or unimportable factory is a usage error, before any test is collected


def pytest_generate_tests(metafunc: Any) -> None:
    if "ced_golden_file" in metafunc.fixturenames:
        from ced.v41 import golden_files
        spec = metafunc.config.getoption("--ced-engine")
        regime = getattr(_engine(spec), "regime", "release") if spec else "release"
        files = golden_files(regime)
        metafunc.parametrize("ced_golden_file", files, ids=[f.name for f in files])
    if "ced_property" in metafunc.fixturenames:
        from ced.v41.testsuite import PROPERTIES
        metafunc.parametrize("ced_property", PROPERTIES)


_engines: dict = {}


def _engine(spec: str) -> Any:
    """One engine per factory for the session: a port loads its model once per checkpoint."""
    if spec not in _engines:
        _engines[spec] = _factory(spec)()
    return _engines[spec]


@pytest.fixture(scope="session")
def ced_engine(request: Any) -> Any:
    spec = request.config.getoption("--ced-engine")
    if not spec:
        pytest.skip("no --ced-engine MODULE:FACTORY given")
    return _engine(spec)


@pytest.fixture(scope="session")
def ced_checkpoints(request: Any, tmp_path_factory: Any) -> Path:
    given = request.config.getoption("--ced-checkpoints")
    return Path(given) if given else tmp_path_factory.mktemp("ced-checkpoints")


@pytest.fixture(scope="session")
def ced_record(request: Any) -> Any:
    given = request.config.getoption("--ced-record")
    return Path(given) if given else None
