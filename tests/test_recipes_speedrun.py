import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch

from hasten.data import ImageDataset, Split, load_dataset
from hasten.data.normalize import channel_stats
from hasten.errors import ConfigError
from hasten.models.speedrun_net import NetConfig, SpeedrunNet
from hasten.recipes.speedrun import (LADDER, PRESETS, SpeedrunConfig, build_recipe, choose_preset, default_target,
                                     ladder_recipes, lr_factor, make_optimizer, run, train_run)
from hasten.rundir import RunDir

CIFAR_JPEG = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-jpeg.tar.xz"


def test_optimizer_groups_scale_bias_lr_and_decouple_weight_decay():
    r = PRESETS["airbench94"]
    opt = make_optimizer(SpeedrunNet(NetConfig(widths=(8, 8, 8))), r)
    biases, others = opt.param_groups
    assert biases["lr"] == pytest.approx(others["lr"] * r.bias_scaler)
    # lr * wd is the same for both groups: weight decay does not follow the bias scaler
    assert biases["lr"] * biases["weight_decay"] == pytest.approx(others["lr"] * others["weight_decay"])
    assert others["nesterov"] and others["momentum"] == r.momentum


def test_lr_schedule_is_airbench_triangle():
    assert lr_factor(0, 100, 0.23) == pytest.approx(0.2)
    assert lr_factor(23, 100, 0.23) == pytest.approx(1.0)
    assert lr_factor(100, 100, 0.23) == pytest.approx(0.07)
    assert lr_factor(10, 100, 0.23) < lr_factor(20, 100, 0.23)


def test_ladder_starts_plain_and_ends_at_the_full_recipe():
    top = PRESETS["cpu"]
    rungs = ladder_recipes(top)
    assert len(rungs) == len(LADDER)
    base = rungs[0][1]
    assert not base.device_loader and not base.whiten and base.tta == "none" and base.net.activation == "relu"
    assert rungs[-1][1] == top
    # every rung changes something
    assert all(a[1] != b[1] for a, b in zip(rungs, rungs[1:]))
    assert dict(rungs)["+ ghost batch norm (32/chunk)"].net.ghost_batch_size == 32
    with pytest.raises(ConfigError, match="ghost batch"):
        ladder_recipes(top.replace(batch_size=48))  # 32 does not divide 48


def test_presets_are_chosen_by_device_and_changed_with_clear_errors():
    assert choose_preset("auto", torch.device("cpu"))[0] == "cpu"
    assert choose_preset("auto", torch.device("cuda"))[0] == "airbench94"
    assert choose_preset("tiny", torch.device("cuda"))[0] == "tiny"
    assert default_target(torch.device("cuda")) == 0.94 and default_target(torch.device("cpu")) == 0.80
    assert build_recipe("tiny", epochs=1, **{"net.activation": "relu"}).net.activation == "relu"
    assert PRESETS["tiny"].epochs == 2  # presets are frozen: changes make new recipes
    with pytest.raises(ConfigError, match="epochs"):
        build_recipe("tiny", epochs=-1)
    with pytest.raises(ConfigError, match="unknown preset"):
        build_recipe("nope")
    with pytest.raises(ConfigError, match="--runs"):
        SpeedrunConfig(recipe=PRESETS["tiny"], preset="tiny", runs=0)
    with pytest.raises(ConfigError, match="--target"):
        SpeedrunConfig(recipe=PRESETS["tiny"], preset="tiny", target=1.5)


def _subset(data: ImageDataset, n_train: int, n_test: int) -> ImageDataset:
    data = data.with_train_subset(n_train)
    return ImageDataset(data.name, data.classes, data.train,
                        Split(data.test.images[::len(data.test) // n_test], data.test.labels[::len(data.test) // n_test]),
                        data.source)


@pytest.mark.skipif(not CIFAR_JPEG.exists(), reason=f"{CIFAR_JPEG} not present")
def test_tiny_run_on_cifar_subset_learns(tmp_path):
    data = _subset(load_dataset(CIFAR_JPEG), 10_000, 2_000)
    t0 = time.perf_counter()
    result = train_run(PRESETS["tiny"].replace(epochs=3), data, torch.device("cpu"),
                       mean_std=channel_stats(data.train.images), seed=0)
    elapsed = time.perf_counter() - t0
    # 10 classes: chance is 10%; a working recipe gets far above it in 3 short epochs.
    assert result.tta_accuracy >= 0.45, result.epochs
    assert result.time_s <= elapsed
    assert [e["epoch"] for e in result.epochs] == [1, 2, 3]


def _colours(n: int, seed: int) -> Split:
    """16x16 images whose class (0..2) is the dominant colour channel."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    images = torch.randint(0, 60, (n, 3, 16, 16), generator=g)
    images[torch.arange(n), labels] += 150
    return Split(images.to(torch.uint8), labels)


TINY_DATA = ImageDataset("colours", ["r", "g", "b"], _colours(96, 0), _colours(30, 1), "memory")
SMALL = build_recipe("tiny", epochs=2, batch_size=32, **{"net.widths": (8, 8, 8)})


def test_run_trains_n_runs_and_writes_the_run_directory(tmp_path):
    lines = []
    with RunDir("speedrun", root=tmp_path) as run_dir:
        summary = run(SpeedrunConfig(recipe=SMALL, preset="tiny", runs=2, seed=3), run_dir=run_dir,
                      dataset=TINY_DATA, log=lines.append)
    assert len(summary["runs"]) == 2 and summary["preset"] == "tiny" and summary["data"] == "colours"
    assert summary["flops_per_run"] > 0 and summary["mean_time_s"] > 0
    assert summary["rundir"] == str(run_dir.path)
    config = json.loads((run_dir.path / "config.json").read_text())
    assert config["seed"] == 3 and config["recipe"]["batch_size"] == 32
    metrics = [json.loads(line) for line in (run_dir.path / "metrics.jsonl").read_text().splitlines()]
    assert [(m["run"], m["epoch"]) for m in metrics] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert json.loads((run_dir.path / "results.json").read_text())["runs"] == summary["runs"]
    assert (run_dir.path / "accuracy_vs_time.png").exists()
    assert any("val_acc" in line for line in lines) and len(lines) >= 2 + 4


def test_building_the_network_is_outside_the_timed_span(monkeypatch):
    import hasten.recipes.speedrun as recipe

    class SlowToBuild(SpeedrunNet):
        def __init__(self, *args, **kwargs):
            time.sleep(1.0)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(recipe, "SpeedrunNet", SlowToBuild)
    t0 = time.perf_counter()
    result = train_run(SMALL.replace(epochs=1), TINY_DATA, torch.device("cpu"),
                       mean_std=channel_stats(TINY_DATA.train.images))
    assert result.time_s < time.perf_counter() - t0 - 0.9


def test_run_ablation_ladder_reports_every_rung(tmp_path):
    config = SpeedrunConfig(recipe=SMALL.replace(epochs=1), preset="tiny", ablate=True, target=0.5, warmup=False)
    summary = run(config, dataset=TINY_DATA)
    assert [row["rung"] for row in summary["rungs"]] == [name for name, _ in LADDER]
    assert all(0 <= row["final_accuracy"] <= 1 and row["time_s"] > 0 for row in summary["rungs"])
    assert summary["target"] == 0.5 and summary["rundir"] is None


def test_run_with_a_train_subset_and_too_small_a_set():
    config = SpeedrunConfig(recipe=SMALL.replace(epochs=1), preset="tiny", train_subset=64, warmup=False)
    assert run(config, dataset=TINY_DATA)["runs"][0]["time_s"] > 0
    with pytest.raises(ConfigError, match="fewer than one global batch of 32"):
        run(dataclasses.replace(config, train_subset=16), dataset=TINY_DATA)
