"""`hasten train`: bad configurations, the report, resume after SIGKILL, torchrun."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from PIL import Image

from hasten.cli import main
from hasten.data import ImageDataset, Split
from hasten.errors import ConfigError
from hasten.recipes.train import DEFAULT_BASE_LR, DEFAULT_LR_SCALING, TrainConfig, train
from hasten.recipes.train_input import TrainInput, device_input


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


# --device cpu: these runs mean the CPU (gloo); on a GPU machine "auto" would put every rank on CUDA.
TINY = ["--model", "resnet10", "--width", "4", "--batch-size", "16", "--warmup-epochs", "1",
        "--deterministic", "--device", "cpu"]


def _cli(*args):
    return main(["train", *args])


# --- bad input ----------------------------------------------------------------

def test_config_is_frozen_and_lr_defaults_are_sgds():
    import dataclasses

    cfg = TrainConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0
    assert (cfg.lr, cfg.lr_scaling) == (DEFAULT_BASE_LR["sgd"], DEFAULT_LR_SCALING["sgd"])
    assert cfg.peak_lr == pytest.approx(0.1 * 512 / 256)
    lars = dataclasses.replace(cfg, optimizer="lars", lr=10.0, lr_scaling="none")
    assert lars.peak_lr == 10.0 and cfg.optimizer == "sgd"


def test_hook_names_are_the_distributed_packages():
    from hasten.distributed.hooks import HOOKS
    from hasten.recipes import train as recipe

    assert recipe.HOOKS is HOOKS


def test_device_input_is_a_named_record_with_this_ranks_share():
    cfg = TrainConfig(model="resnet10", width=4, batch_size=16, train_subset=64, channels_last=True)
    data = device_input(cfg, tiny_dataset(), torch.device("cpu"), rank=1, world=2, local_batch=8)
    assert isinstance(data, TrainInput)
    assert (data.steps_per_epoch, data.num_classes, data.image_size, data.name) == (4, 2, 8, "tiny")
    x, y = next(data.epoch_batches(0))
    assert x.shape == (8, 3, 8, 8) and x.dtype == torch.float32 and len(y) == 8
    test = list(data.test_batches(batch_size=10))  # rank 1 of 2: batches 1 and 3 of 32 images
    assert [len(y) for _, y in test] == [10, 2]
    assert test[0][0].is_contiguous(memory_format=torch.channels_last)
    assert abs(float(test[0][0].mean())) < 1.5  # normalised, not 0..255


def test_dataset_smaller_than_one_batch():
    cfg = TrainConfig(model="resnet10", width=4, batch_size=128, epochs=1, warmup_epochs=0)
    with pytest.raises(ValueError, match="96 images, fewer than one global batch of 128"):
        train(cfg, dataset=tiny_dataset())


# --- training -------------------------------------------------------------------

@pytest.mark.parametrize("optimizer,extra", [
    ("lars", {"lr": DEFAULT_BASE_LR["lars"], "lr_scaling": DEFAULT_LR_SCALING["lars"]}),
    ("sgd", {"lr": 0.4, "ghost_batch": 4, "bf16": True}),
])
def test_tiny_run_learns_and_reports(optimizer, extra):
    cfg = TrainConfig(model="resnet10", width=4, batch_size=16, epochs=4, warmup_epochs=1,
                      optimizer=optimizer, **extra)
    report = train(cfg, dataset=tiny_dataset())
    assert report["accuracy"] >= 0.8  # chance is 0.5
    assert report["steps"] == 24 and report["epochs"] == 4 and report["global_batch"] == 16
    assert report["world_size"] == 1 and report["time_s"] > 0 and report["images_per_s"] > 0


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_run_leaves_the_callers_algorithm_settings(deterministic, monkeypatch):
    # Deterministic mode left on after a run would slow all later work (torch.empty fills memory).
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    before = torch.are_deterministic_algorithms_enabled()
    seen = []
    monkeypatch.setattr("hasten.recipes.train._train", lambda *a: seen.append(
        (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)) or {})
    cfg = TrainConfig(model="resnet10", width=4, batch_size=16, epochs=1, warmup_epochs=0, device="cpu",
                      deterministic=deterministic)
    train(cfg, dataset=tiny_dataset())
    assert seen == [(deterministic or before, not deterministic)]  # during the run: what it asked for
    assert torch.are_deterministic_algorithms_enabled() == before and torch.backends.cudnn.benchmark is False


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


# --- the same run, found again: stable run directory, resume plan, the lost-peer line --------

def test_run_path_is_derived_from_the_training_math_and_data(tmp_path, image_folder):
    import dataclasses

    from hasten.recipes.train import default_run_path

    cfg = TrainConfig(data=str(image_folder), model="resnet10", width=4)
    path = default_run_path(cfg, root=tmp_path)
    assert path.parent == tmp_path and path.name.startswith("train-")
    # Options that do not change the math (or name the same data differently) find the same run ...
    for same in (dict(checkpoint_every=50, collective_timeout=5.0, hook="ring", workers=3),
                 dict(data=str(image_folder) + "/")):
        assert default_run_path(dataclasses.replace(cfg, **same), root=tmp_path) == path, same
    # ... any that do, another one.
    for other in (dict(seed=1), dict(lr=0.2), dict(epochs=11.0), dict(data=str(tmp_path))):
        assert default_run_path(dataclasses.replace(cfg, **other), root=tmp_path) != path, other


def _saved(run: Path, cfg: TrainConfig, step: int):
    from hasten.checkpoint import save_checkpoint

    return save_checkpoint(run / "checkpoint.pt", {"config": asdict(cfg), "model": {}, "step": step},
                           keep_previous=True)


def test_plan_resume_fresh_auto_explicit_and_restarted(tmp_path):
    from hasten.errors import ConfigError
    from hasten.recipes.train import plan_resume

    cfg, run = TrainConfig(batch_size=64), tmp_path / "run"
    plan = plan_resume(cfg, run, None)
    assert (plan.state, plan.source, plan.note) == (None, None, None)
    plan = plan_resume(cfg, run, "auto")
    assert plan.state is None and plan.note == f"no checkpoint in {run} yet; starting fresh"
    _saved(run, cfg, 10)
    _saved(run, cfg, 20)
    (run / "checkpoint.pt").write_bytes(b"PK\x03\x04 cut short")  # the newest is damaged
    for resume, restarted in (("auto", False), (None, True)):
        plan = plan_resume(cfg, run, resume, restarted=restarted)
        assert plan.state["step"] == 10 and plan.source == run / "checkpoint-previous.pt"
        assert plan.note == f"resuming from {run / 'checkpoint-previous.pt'} (step 10)"
    # A fresh start must not overwrite the run's checkpoints.
    with pytest.raises(ConfigError, match="already holds a checkpoint of this run \\(step 10\\); continue it "
                       "with --resume auto"):
        plan_resume(cfg, run, None)
    # An explicit older checkpoint from elsewhere: refused here too; from this directory: fine.
    other = tmp_path / "other"
    _saved(other, cfg, 5)
    with pytest.raises(ConfigError, match="--run-dir DIR"):
        plan_resume(cfg, run, str(other))
    assert plan_resume(cfg, tmp_path / "new", str(other)).state["step"] == 5
    # A restarted worker prefers the run's own newer checkpoint to the one it was started from.
    assert plan_resume(cfg, run, str(run / "checkpoint-previous.pt"), restarted=True).state["step"] == 10
    with pytest.raises(ConfigError, match="--batch-size: checkpoint 64, now 128"):
        plan_resume(TrainConfig(batch_size=128), run, "auto")


def test_plan_resume_of_a_finished_run_gives_its_report_instead_of_a_state(tmp_path):
    from hasten.recipes.train import plan_resume

    cfg, run = TrainConfig(batch_size=64), tmp_path / "run"
    _saved(run, cfg, 10)
    report = {"steps": 10, "accuracy": 0.5}
    (run / "results.json").write_text(json.dumps(report))
    for resume in (None, "auto"):
        plan = plan_resume(cfg, run, resume)
        assert plan.finished == report and plan.state is None
        assert f"{run} holds this run, finished at step 10" in plan.note
    assert plan_resume(cfg, run, str(run / "checkpoint.pt")).state["step"] == 10  # an explicit resume is done
    _saved(run, cfg, 20)  # the results of step 10 are not of the newest checkpoint: not finished
    assert plan_resume(cfg, run, "auto").finished is None


def test_lost_peer_message_names_step_checkpoint_and_what_to_do(tmp_path, monkeypatch):
    from hasten.distributed.faults import Terminated
    from hasten.recipes.train_stops import lost_peer_message

    cfg, run = TrainConfig(checkpoint_every=100), tmp_path / "run"
    gloo = RuntimeError("[/x/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:4: Connection reset by peer. "
                        "This is typically caused by a remote worker hanging. GLHF!")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    assert lost_peer_message(gloo, 4, 417, cfg, run) == (
        f"lost contact with a peer rank at step 417 (torch.distributed: Connection reset by peer); no checkpoint "
        f"in {run} yet (saved every 100 steps; --checkpoint-every N); rerun with --resume auto")
    _saved(run, cfg, 400)
    assert lost_peer_message(gloo, 4, 417, cfg, run) == (
        f"lost contact with a peer rank at step 417 (torch.distributed: Connection reset by peer); newest "
        f"checkpoint: {run / 'checkpoint.pt'} (step 400); rerun with --resume auto")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    assert lost_peer_message(Terminated(), 4, 417, cfg, run).startswith(
        "stopped by SIGTERM at step 417 (torchrun sends it when another rank fails)")
    assert lost_peer_message(Terminated(), 4, 417, cfg, run).endswith(
        "torchrun restarts the workers (restart 1 of 3), which resume from it")
    assert lost_peer_message(gloo, 1, 417, cfg, run) is None  # one process has no peers
    assert lost_peer_message(RuntimeError("shapes cannot be multiplied"), 4, 417, cfg, run) is None


def test_resume_mid_epoch_restores_the_shard_loaders_own_position(image_folder, tmp_path):
    """A loader with state_dict() (the shard loader) is checkpointed per rank and resumes
    itself mid-epoch; the loop must then not skip batches again."""
    from hasten.rundir import RunDir
    from hasten.stream.pack import pack

    pack(image_folder, tmp_path / "shards", shard_bytes=65536)
    cfg = TrainConfig(data=str(tmp_path / "shards"), loader="stream", model="resnet10", width=4, image_size=8,
                      batch_size=16, epochs=2, warmup_epochs=1, deterministic=True, checkpoint_every=4)
    with RunDir("train", path=tmp_path / "straight") as rd:
        assert train(cfg, run_dir=rd)["steps"] == 12  # 96 images / 16 = 6 steps per epoch
    previous = torch.load(tmp_path / "straight" / "checkpoint-previous.pt", weights_only=True)
    # Step 8 is 2 batches into epoch 1: the loader says so itself.
    assert previous["step"] == 8 and previous["data"] == {"world_size": 1, "ranks": [{"epoch": 1, "position": 32}]}
    with RunDir("train", path=tmp_path / "resumed") as rd:
        assert train(cfg, run_dir=rd, resume=tmp_path / "straight" / "checkpoint-previous.pt")["steps"] == 12
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=True)["model"]
    for k in a:
        assert torch.equal(a[k], b[k]), k


# --- the gradient noise scale (hasten train --noise-scale) ----------------------------

def test_noise_scale_needs_a_batch_it_can_split():
    with pytest.raises(ConfigError, match="--noise-scale"):
        TrainConfig(batch_size=1, noise_scale=True).validate(1)
    with pytest.raises(ConfigError, match="--noise-scale"):
        TrainConfig(batch_size=16, ghost_batch=16, noise_scale=True).validate(1)
    TrainConfig(batch_size=16, ghost_batch=4, noise_scale=True).validate(1)
    TrainConfig(batch_size=2, noise_scale=True).validate(2)  # DDP: one image per rank is enough


def test_noise_scale_in_metrics_report_and_last_line(image_folder, tmp_path, capsys):
    out, run = tmp_path / "report.json", tmp_path / "run"
    assert _cli("--data", str(image_folder), *TINY, "--epochs", "4", "--noise-scale", "--run-dir", str(run),
                "--json", str(out)) == 0
    ns = json.loads(out.read_text())["noise_scale"]
    assert ns["measurements"] == 3 and (ns["b_small"], ns["b_big"]) == (8, 16)  # 24 steps, probe every 10
    assert ns["suggested_batch"] >= 1 and ns["why"] and 0 < ns["overhead_fraction"] < 1
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("noise_scale" in m for m in metrics)
    assert "noise scale" in capsys.readouterr().out.splitlines()[-1]


@pytest.mark.multiproc
def test_torchrun_two_ranks_measure_the_noise_scale_every_step(image_folder, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           "-m", "hasten", "train", "--data", str(image_folder), *TINY, "--epochs", "2",
                           "--noise-scale", "--hook", "ring", "--json", str(tmp_path / "two.json")],
                          env=env, check=True, capture_output=True, text=True, timeout=120)
    ns = json.loads((tmp_path / "two.json").read_text())["noise_scale"]
    assert ns["measurements"] == 12 and (ns["b_small"], ns["b_big"]) == (8, 16)
    assert "suggested global batch" in done.stdout or "no usable estimate" in done.stdout
