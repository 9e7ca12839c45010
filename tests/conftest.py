import os

import pytest
import torch

# Tests must be quick and deterministic on 2 shared cores.
torch.set_num_threads(min(2, os.cpu_count() or 1))
os.environ.setdefault("HASTEN_PROGRESS", "0")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none is available")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path, monkeypatch):
    """Keep caches and run directories of every test inside its tmp_path."""
    monkeypatch.setenv("HASTEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HASTEN_RUNS", str(tmp_path / "runs"))
