"""The example engine's tests (see ../README.md)."""
