"""pytest setup for the PyTorch example engine: its package on the path, the repository's golden/."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
REPO = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(scope="session")
def golden_dir() -> str:
    return os.path.join(REPO, "golden")
