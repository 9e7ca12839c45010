import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hasten.cli import main
from hasten.commands.speedrun import train_subset
from hasten.data import ImageDataset, Split, load_dataset
from hasten.models.speedrun_net import NetConfig, SpeedrunNet
from hasten.recipes.speedrun import LADDER, PRESETS, ladder_recipes, lr_factor, make_optimizer, train_run

CIFAR_JPEG = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-jpeg.tar.xz"


def test_net_shapes_and_dirac_init():
    net = SpeedrunNet(NetConfig(widths=(8, 16, 16)))
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    w = net.layers[0].conv2.weight  # 8 -> 8: identity on every filter
    centre = w[:, :, 1, 1]
    assert torch.equal(centre, torch.eye(8)) and w.abs().sum() == 8
    bn = net.layers[0].norm1
    assert not bn.weight.requires_grad and bn.bias.requires_grad  # frozen BN scale


def test_pool_before_activation_changes_order_not_shape():
    x = torch.randn(2, 3, 32, 32)
    a = SpeedrunNet(NetConfig(widths=(8, 8, 8), pool_before_act=True))
    b = SpeedrunNet(NetConfig(widths=(8, 8, 8), pool_before_act=False))
    b.load_state_dict(a.state_dict())
    assert a(x).shape == b(x).shape and not torch.allclose(a(x), b(x))


def test_invalid_net_config():
    with pytest.raises(ValueError, match="gelu"):
        NetConfig(activation="swish")


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


def _subset(data: ImageDataset, n_train: int, n_test: int) -> ImageDataset:
    data = train_subset(data, n_train)
    return ImageDataset(data.name, data.classes, data.train,
                        Split(data.test.images[::len(data.test) // n_test], data.test.labels[::len(data.test) // n_test]),
                        data.source)


def test_train_subset_is_seeded_and_keeps_all_classes():
    images = torch.arange(100, dtype=torch.uint8).view(100, 1, 1, 1).expand(100, 3, 2, 2).contiguous()
    labels = torch.arange(100) // 10  # stored class by class, like an image folder
    data = ImageDataset("x", list("abcdefghij"), Split(images, labels), Split(images, labels), "mem")
    a, b = train_subset(data, 50), train_subset(data, 50)
    assert torch.equal(a.train.labels, b.train.labels) and len(a.train) == 50
    assert len(set(a.train.labels.tolist())) == 10
    assert torch.equal(a.train.images[:, 0, 0, 0].long() // 10, a.train.labels)  # images stay paired with labels
    with pytest.raises(ValueError, match="train-subset"):
        train_subset(data, 0)


@pytest.mark.skipif(not CIFAR_JPEG.exists(), reason=f"{CIFAR_JPEG} not present")
def test_tiny_run_on_cifar_subset_learns(tmp_path):
    data = _subset(load_dataset(CIFAR_JPEG), 10_000, 2_000)
    t0 = time.perf_counter()
    result = train_run(PRESETS["tiny"].replace(epochs=3), data, torch.device("cpu"), seed=0)
    elapsed = time.perf_counter() - t0
    # 10 classes: chance is 10%; a working recipe gets far above it in 3 short epochs.
    assert result.tta_accuracy >= 0.45, result.epochs
    assert result.time_s <= elapsed
    assert [e["epoch"] for e in result.epochs] == [1, 2, 3]


def _image_folder(root: Path, per_class=12, classes=("a", "b", "c")) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", 4)):
        for k, name in enumerate(classes):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 60, (32, 32, 3), dtype=np.uint8)
                img[..., k] += 150  # class = dominant colour
                Image.fromarray(img).save(d / f"{i}.png")
    return root


def test_cli_writes_run_directory_and_json(tmp_path, capsys):
    data = _image_folder(tmp_path / "data")
    out = tmp_path / "summary.json"
    rc = main(["speedrun", "--data", str(data), "--preset", "tiny", "--runs", "2", "--epochs", "1",
               "--batch-size", "12", "--device", "cpu", "--json", str(out)])
    assert rc == 0
    summary = json.loads(out.read_text())
    for key in ("runs", "mean_accuracy", "std_accuracy", "mean_time_s", "device", "preset", "flops_per_run"):
        assert key in summary
    assert len(summary["runs"]) == 2 and set(summary["runs"][0]) >= {"accuracy", "tta_accuracy", "time_s"}
    assert summary["flops_per_run"] > 0 and summary["preset"] == "tiny"
    rundir = Path(summary["rundir"])
    for name in ("config.json", "environment.json", "metrics.jsonl", "results.json", "accuracy_vs_time.png"):
        assert (rundir / name).exists(), name
    lines = (rundir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["run"] == 0
    printed = capsys.readouterr().out
    assert "preset: tiny" in printed and "val_acc" in printed


def test_cli_rejects_bad_input_with_one_line(tmp_path, capsys):
    assert main(["speedrun", "--runs", "0", "--data", str(tmp_path)]) == 2
    assert "--runs" in capsys.readouterr().err
    assert main(["speedrun", "--data", str(tmp_path / "missing"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "missing" in err and "Traceback" not in err
    data = _image_folder(tmp_path / "small")
    assert main(["speedrun", "--data", str(data), "--preset", "tiny", "--device", "cpu"]) == 2
    assert "--batch-size" in capsys.readouterr().err
    assert main(["speedrun", "--data", str(data), "--epochs", "-1", "--device", "cpu"]) == 2
    assert "epochs" in capsys.readouterr().err
