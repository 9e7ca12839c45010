"""hasten.harness.launch.spawn: the checks made before any rank starts."""

import pytest
import torch

from hasten.errors import ConfigError
from hasten.harness.launch import spawn


def _never_called(rank, world):  # pragma: no cover - spawn must refuse before forking
    raise AssertionError("a rank was started")


def test_nccl_with_more_ranks_than_gpus_is_one_clear_error(monkeypatch):
    """On a 1-GPU machine, 2 NCCL ranks would die in a child with "invalid device ordinal"."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="needs a GPU of its own.*torch sees 1 CUDA device"):
        spawn(_never_called, 2, backend="nccl")
