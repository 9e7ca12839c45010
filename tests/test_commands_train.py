"""`hasten train` on the command line: bad input is one clear line, options become the config."""

import re

import pytest

from hasten.checkpoint import save_checkpoint
from hasten.cli import main
from hasten.recipes.train import TrainConfig


def _cli(*args):
    return main(["train", *args])


@pytest.mark.parametrize(
    "world,args,match",
    [
        ("3", ["--batch-size", "16"], "global batch 16 is not divisible by the world size 3"),
        ("4", ["--bn-group", "3"], r"--bn-group 3 does not divide the world size 4; use one of \[1, 2, 4\]"),
        ("1", ["--lr", "-1"], "--lr must be > 0, got -1"),
        ("1", ["--ghost-batch", "5", "--batch-size", "16"], "--ghost-batch 5 must divide the per-replica batch 16"),
        ("1", ["--warmup-epochs", "5", "--epochs", "2"], r"--warmup-epochs must be in \[0, epochs=2.0\)"),
        ("1", ["--model", "vgg"], "unknown model 'vgg'"),
        ("1", ["--label-smoothing", "1.5"], "--label-smoothing must be in"),
        ("1", ["--batch-size", "0"], "--batch-size must be >= 1"),
        ("1", ["--loader", "stream", "--train-subset", "10"], "--train-subset needs --loader device"),
    ],
)
def test_bad_configuration_is_one_clear_line_before_any_work(world, args, match, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", world)
    assert _cli("--data", str(tmp_path / "never-read"), *args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(match, err), err
    assert not (tmp_path / "runs").exists()  # no run directory, no process group


def test_corrupt_or_mismatched_checkpoint_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    assert _cli("--data", "x", "--resume", str(bad)) == 2
    assert "corrupt or truncated" in capsys.readouterr().err
    save_checkpoint(bad, {"config": {**TrainConfig().__dict__, "batch_size": 64}, "model": {}})
    assert _cli("--data", "x", "--resume", str(bad)) == 2
    assert "batch_size: checkpoint 64, now 512" in capsys.readouterr().err


@pytest.mark.parametrize("args,lr,scaling", [
    (["--optimizer", "lars"], 10.0, "none"),
    (["--optimizer", "sgd"], 0.1, "linear"),
    (["--optimizer", "lars", "--lr", "3", "--lr-scaling", "linear"], 3.0, "linear"),
])
def test_learning_rate_defaults_by_optimizer(args, lr, scaling, monkeypatch):
    import hasten.recipes.train as recipe

    seen = []

    def fake_train(cfg, **kwargs):
        seen.append(cfg)
        raise KeyboardInterrupt  # stop before any work

    monkeypatch.setattr(recipe, "train", fake_train)
    assert _cli("--data", "x", *args) == 130
    assert isinstance(seen[0], TrainConfig) and (seen[0].lr, seen[0].lr_scaling) == (lr, scaling)
