"""The PyTorch example engine as a package, so pytest names its modules apart from python/tests."""
