"""``python -m ced``: the ``ced`` command (ced.cli)."""
from .cli import run

run()
