import os

import pytest
import torch

from hasten.checkpoint import (CheckpointError, CheckpointInfo, load_checkpoint, newest_checkpoint, rng_state,
                               save_checkpoint, set_rng_state)


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


# --- keeping the previous checkpoint, and finding the newest complete one ----------

def test_keep_previous_rotates_and_newest_is_the_last_written(tmp_path):
    for step in (10, 20, 30):
        save_checkpoint(tmp_path / "checkpoint.pt", {"step": step, "w": torch.full((3,), float(step))},
                        keep_previous=True)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-previous.pt", "checkpoint.pt"]
    assert load_checkpoint(tmp_path / "checkpoint-previous.pt")["step"] == 20
    assert newest_checkpoint(tmp_path) == CheckpointInfo(tmp_path / "checkpoint.pt", 30)


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage"])
def test_newest_complete_checkpoint_skips_a_damaged_newer_file(tmp_path, damage):
    save_checkpoint(tmp_path / "checkpoint.pt", {"step": 10, "w": torch.randn(1000)}, keep_previous=True)
    save_checkpoint(tmp_path / "checkpoint.pt", {"step": 20, "w": torch.randn(1000)}, keep_previous=True)
    path = tmp_path / "checkpoint.pt"
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) - 100], "empty": b"", "garbage": b"PK\x03\x04junk"}[damage])
    assert newest_checkpoint(tmp_path) == CheckpointInfo(tmp_path / "checkpoint-previous.pt", 10)


def test_newest_checkpoint_ignores_temp_files_of_an_interrupted_write(tmp_path):
    """A process killed mid-write leaves only a hidden temp file: never a candidate."""
    assert newest_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path / "checkpoint.pt", {"step": 5}, keep_previous=True)
    newer = tmp_path / "newer.pt"
    save_checkpoint(newer, {"step": 99})
    (tmp_path / f".checkpoint.pt.tmp-{os.getpid() + 1}").write_bytes(newer.read_bytes())
    newer.unlink()
    assert newest_checkpoint(tmp_path) == CheckpointInfo(tmp_path / "checkpoint.pt", 5)


def test_a_kill_between_the_renames_still_leaves_a_complete_checkpoint(tmp_path, monkeypatch):
    """keep_previous renames twice; a crash after the first leaves checkpoint-previous.pt only."""
    save_checkpoint(tmp_path / "checkpoint.pt", {"step": 10}, keep_previous=True)
    real_replace, calls = os.replace, []

    def replace_then_die(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the temp file -> checkpoint.pt rename never happens
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "checkpoint.pt", {"step": 20}, keep_previous=True)
    monkeypatch.undo()
    assert newest_checkpoint(tmp_path) == CheckpointInfo(tmp_path / "checkpoint-previous.pt", 10)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-previous.pt"]  # the temp file was removed


def test_newest_checkpoint_needs_an_integer_step(tmp_path):
    save_checkpoint(tmp_path / "checkpoint.pt", {"model": {}})
    assert newest_checkpoint(tmp_path) is None
