"""`hasten train` on the command line: bad input is one clear line, options become the config."""

import json
import re
from pathlib import Path

import pytest
import torch

from cli_helpers import exit_status
from hasten.checkpoint import save_checkpoint
from hasten.cli import main
from hasten.recipes.train import TrainConfig


def _cli(*args):
    return exit_status(["train", *args])


@pytest.mark.parametrize(
    "world,args,match",
    [
        ("3", ["--batch-size", "16"], "global batch 16 is not divisible by the world size 3"),
        ("4", ["--bn-group", "3"], r"--bn-group 3 does not divide the world size 4; use one of \[1, 2, 4\]"),
        ("1", ["--lr", "-1"], "argument --lr: must be a finite number > 0, got '-1'"),
        ("1", ["--ghost-batch", "5", "--batch-size", "16"], "--ghost-batch 5 must divide the per-replica batch 16"),
        ("1", ["--warmup-epochs", "5", "--epochs", "2"], r"--warmup-epochs 5 must be >= 0 and less than --epochs 2"),
        ("1", ["--model", "vgg"], "argument --model: invalid choice: 'vgg'"),
        ("1", ["--label-smoothing", "1.5"], "argument --label-smoothing: must be a finite number >= 0 and < 1"),
        ("1", ["--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got '0'"),
        ("1", ["--loader", "stream", "--train-subset", "10"], "--train-subset needs --loader device"),
    ],
)
def test_bad_configuration_is_one_clear_line_before_any_work(world, args, match, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", world)
    (tmp_path / "never-read").mkdir()
    assert _cli("--data", str(tmp_path / "never-read"), *args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(match, err), err
    assert not (tmp_path / "runs").exists()  # no run directory, no process group


def test_corrupt_or_mismatched_checkpoint_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    assert _cli("--data", str(tmp_path), "--resume", str(bad)) == 2
    assert "corrupt or truncated" in capsys.readouterr().err
    save_checkpoint(bad, {"config": {**TrainConfig().__dict__, "batch_size": 64}, "model": {}})
    assert _cli("--data", str(tmp_path), "--resume", str(bad)) == 2
    assert "--batch-size: checkpoint 64, now 512" in capsys.readouterr().err


@pytest.mark.parametrize("args,lr,scaling", [
    (["--optimizer", "lars"], 10.0, "none"),
    (["--optimizer", "sgd"], 0.1, "linear"),
    (["--optimizer", "lars", "--lr", "3", "--lr-scaling", "linear"], 3.0, "linear"),
])
def test_learning_rate_defaults_by_optimizer(args, lr, scaling, monkeypatch, tmp_path):
    import hasten.recipes.train as recipe

    seen = []

    def fake_train(cfg, **kwargs):
        seen.append(cfg)
        raise KeyboardInterrupt  # stop before any work

    monkeypatch.setattr(recipe, "train", fake_train)
    assert _cli("--data", str(tmp_path), *args) == 130
    assert isinstance(seen[0], TrainConfig) and (seen[0].lr, seen[0].lr_scaling) == (lr, scaling)


# --- --resume auto, --run-dir, and what a torchrun restart does ------------------------------

TINY = ["--model", "resnet10", "--width", "4", "--batch-size", "32", "--warmup-epochs", "1", "--epochs", "2",
        "--checkpoint-every", "5", "--deterministic", "--device", "cpu"]


def test_resume_auto_starts_fresh_then_continues_the_same_run(colours, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    args = ["--data", str(colours), *TINY, "--json", str(tmp_path / "r.json")]
    assert _cli(*args, "--resume", "auto") == 0
    err = capsys.readouterr().err.strip().splitlines()
    run = Path(json.loads((tmp_path / "r.json").read_text())["run_dir"])
    # The run directory is the one derived from the settings, under $HASTEN_RUNS.
    assert run.parent == tmp_path / "runs" and run.name.startswith("train-")
    assert err == [f"hasten train: no checkpoint in {run} yet; starting fresh"]
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 12
    # The same command again: the run is finished, so it says so and exits 0, training nothing.
    before = run.joinpath("metrics.jsonl").read_text()
    assert _cli(*args) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == (f"hasten train: {run} holds this run, finished at step 12: nothing to train "
                                    "(a new run: --run-dir DIR)")
    assert "already complete" in captured.out and run.joinpath("metrics.jsonl").read_text() == before
    # A run that did not finish (stopped before its results were written) is not overwritten by a
    # fresh one: refused in one line.
    (run / "results.json").unlink()
    assert _cli(*args) == 2
    assert capsys.readouterr().err.strip() == (
        f"hasten train: error: {run} already holds a checkpoint of this run (step 12); continue it with "
        "--resume auto, or start a new run with --run-dir DIR")
    # A worker restarted by torchrun resumes by itself, from the newest checkpoint.
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert _cli(*args) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == f"hasten train: resuming from {run / 'checkpoint.pt'} (step 12)"
    # The run was complete: no step trained, so no rate (it used to print "0 images/s").
    assert "already complete, nothing trained" in captured.out and "images/s" not in captured.out
    assert json.loads((tmp_path / "r.json").read_text())["resumed_from_step"] == 12
    # --run-dir puts a run where asked, fresh.
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    assert _cli(*args, "--run-dir", str(tmp_path / "mine")) == 0
    assert json.loads((tmp_path / "r.json").read_text())["run_dir"] == str(tmp_path / "mine")


def test_two_processes_on_one_gpu_is_one_line_not_a_cuda_traceback(colours, monkeypatch, capsys):
    """torchrun --nproc-per-node 2 on a one-GPU machine, as rank 1 sees it (torch's CUDA faked)."""
    for var, value in dict(WORLD_SIZE=2, RANK=1, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2).items():
        monkeypatch.setenv(var, str(value))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: pytest.fail(f"set_device({d}) called"))
    assert _cli("--data", str(colours), "--model", "resnet10", "--batch-size", "32") == 2  # --device auto
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.fullmatch(
        r"hasten train: error: local rank 1 of 2 processes on this node needs a GPU of its own, but torch sees "
        r"1 CUDA device; .*--nproc-per-node 1.*--device cpu", err[0]), err


def test_collective_timeout_must_be_positive(tmp_path, capsys):
    assert _cli("--data", str(tmp_path), "--collective-timeout", "0") == 2
    assert "argument --collective-timeout: must be a finite number > 0, got '0'" in capsys.readouterr().err


def test_help_states_the_retries_default_and_every_url_scheme(capsys):
    from hasten.stream.retry import DEFAULT_RETRIES

    for command in ("train", "echo"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
        for scheme in ("s3://", "gs://", "az://", "http://", "https://"):
            assert scheme in text, (command, scheme)
        if command == "train":
            assert f"(default {DEFAULT_RETRIES})" in text
