"""`hasten train`: bad configurations, the report, resume after SIGKILL, torchrun."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hasten.checkpoint import save_checkpoint
from hasten.cli import main
from hasten.data import ImageDataset, Split
from hasten.recipes.train import TrainConfig, train


def _tensors(n, seed):
    """Two classes a small ResNet separates quickly: dark and light noisy images."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = (60 + 120 * y.view(-1, 1, 1, 1) + 40 * torch.randn(n, 3, 8, 8, generator=g)).clamp(0, 255)
    return x.to(torch.uint8), y


def tiny_dataset():
    (xa, ya), (xb, yb) = _tensors(96, 0), _tensors(32, 1)
    return ImageDataset("tiny", ["dark", "light"], Split(xa, ya), Split(xb, yb), source="test")


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    for split, (x, y) in [("train", _tensors(96, 0)), ("test", _tensors(32, 1))]:
        for i, (img, label) in enumerate(zip(x, y)):
            d = root / split / ["dark", "light"][label]
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img.permute(1, 2, 0).numpy()).save(d / f"{i}.png")
    return root


TINY = ["--model", "resnet10", "--width", "4", "--batch-size", "16", "--warmup-epochs", "1",
        "--deterministic"]


def _cli(*args):
    return main(["train", *args])


# --- bad input ----------------------------------------------------------------

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
    import re

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


def test_dataset_smaller_than_one_batch():
    cfg = TrainConfig(model="resnet10", width=4, batch_size=128, epochs=1, warmup_epochs=0)
    with pytest.raises(ValueError, match="96 images, fewer than one global batch of 128"):
        train(cfg, dataset=tiny_dataset())


# --- training -------------------------------------------------------------------

@pytest.mark.parametrize("optimizer,extra", [("lars", {}), ("sgd", {"ghost_batch": 4, "bf16": True})])
def test_tiny_run_learns_and_reports(optimizer, extra):
    cfg = TrainConfig(model="resnet10", width=4, batch_size=16, epochs=4, warmup_epochs=1,
                      optimizer=optimizer, lr=0.4 if optimizer == "sgd" else None, **extra)
    report = train(cfg, dataset=tiny_dataset())
    assert report["accuracy"] >= 0.8  # chance is 0.5
    assert report["steps"] == 24 and report["epochs"] == 4 and report["global_batch"] == 16
    assert report["world_size"] == 1 and report["time_s"] > 0 and report["images_per_s"] > 0


def _wait_for_step(metrics: Path, step: int, proc, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if metrics.exists():
            for line in metrics.read_text().splitlines():
                if json.loads(line).get("step", 0) >= step:
                    return
        if proc.poll() is not None:
            raise AssertionError(f"training ended (rc {proc.returncode}) before step {step}")
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {timeout} s")


def test_sigkill_then_resume_ends_with_the_same_weights(image_folder, tmp_path):
    args = [sys.executable, "-m", "hasten", "train", "--data", str(image_folder), *TINY,
            "--batch-size", "8", "--epochs", "12", "--checkpoint-every", "10", "--optimizer", "lars"]
    env = {**os.environ, "HASTEN_RUNS": str(tmp_path / "killed"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    runs = tmp_path / "killed"
    try:
        deadline = time.time() + 60
        while not list(runs.glob("train-*")):
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.02)
        killed_dir = next(runs.glob("train-*"))
        _wait_for_step(killed_dir / "metrics.jsonl", 36, proc)  # epoch 3 of 12 logged
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (killed_dir / "results.json").exists()  # really interrupted
    saved = torch.load(killed_dir / "checkpoint.pt", weights_only=True)
    assert 30 <= saved["step"] < 144

    env["HASTEN_RUNS"] = str(tmp_path / "resumed")
    subprocess.run(args + ["--resume", str(killed_dir), "--json", str(tmp_path / "resumed.json")],
                   env=env, check=True, capture_output=True)
    env["HASTEN_RUNS"] = str(tmp_path / "straight")
    subprocess.run(args + ["--json", str(tmp_path / "straight.json")], env=env, check=True,
                   capture_output=True)
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    straight = json.loads((tmp_path / "straight.json").read_text())
    assert resumed["resumed_from_step"] == saved["step"] and resumed["steps"] == straight["steps"] == 144
    a = torch.load(Path(resumed["run_dir"]) / "checkpoint.pt", weights_only=True)
    b = torch.load(Path(straight["run_dir"]) / "checkpoint.pt", weights_only=True)
    for k in b["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert resumed["accuracy"] == straight["accuracy"]


@pytest.mark.multiproc
def test_torchrun_two_ranks_with_group_bn_matches_one_process(image_folder, tmp_path):
    common = ["--data", str(image_folder), *TINY, "--epochs", "2", "--optimizer", "lars"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--standalone", "-m", "hasten", "train", *common, "--bn-group", "2",
                    "--json", str(tmp_path / "two.json")], env=env, check=True, capture_output=True,
                   timeout=120)
    subprocess.run([sys.executable, "-m", "hasten", "train", *common, "--json", str(tmp_path / "one.json")],
                   env=env, check=True, capture_output=True, timeout=120)
    two = json.loads((tmp_path / "two.json").read_text())
    one = json.loads((tmp_path / "one.json").read_text())
    assert two["world_size"] == 2 and two["local_batch"] == 8 and two["steps"] == one["steps"] == 12
    a = torch.load(Path(two["run_dir"]) / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(Path(one["run_dir"]) / "checkpoint.pt", weights_only=True)["model"]
    for k in b:
        if a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4, msg=k)


def test_streaming_loader_trains_from_the_image_folder(image_folder, tmp_path):
    out = tmp_path / "report.json"
    assert _cli("--data", str(image_folder), *TINY, "--epochs", "4", "--loader", "stream",
                "--json", str(out)) == 0
    report = json.loads(out.read_text())
    assert report["loader"] == "stream" and report["steps"] == 24  # 96 images / 16 x 4 epochs
    assert report["accuracy"] >= 0.8
