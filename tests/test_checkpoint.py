import os

import pytest
import torch

from hasten.checkpoint import CheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state


def test_round_trip_loads_with_weights_only(tmp_path):
    state = {"step": 7, "model": {"w": torch.arange(4.0)}, "rng": rng_state()}
    path = save_checkpoint(tmp_path / "ckpt.pt", state)
    raw = torch.load(path, weights_only=True)
    assert raw["step"] == 7 and torch.equal(raw["model"]["w"], torch.arange(4.0))
    set_rng_state(load_checkpoint(path)["rng"])
    a = torch.rand(3)
    set_rng_state(state["rng"])
    assert torch.equal(a, torch.rand(3))


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "ckpt.pt", {"step": 1})

    def crash(obj, f, *a, **k):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"step": 2})
    assert load_checkpoint(path)["step"] == 1
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # no temp file left behind


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_checkpoint_is_a_clear_error(tmp_path, damage):
    path = save_checkpoint(tmp_path / "ckpt.pt", {"model": {"w": torch.randn(100)}})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(path)


def test_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "nope.pt")
