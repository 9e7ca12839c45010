"""hasten.data.jpeg_export and `hasten data jpeg`: the CIFAR-10-JPEG archive made from
the canonical binary format (a small archive the test builds), read back by hasten."""

import tarfile

import numpy as np
import pytest
import torch
from test_data_cifar10 import make_cifar_binary

from hasten.cli import main
from hasten.data import ImageDataset, Split, load_dataset
from hasten.data.cifar10 import CLASSES
from hasten.data.jpeg_export import write_jpeg_folder
from hasten.errors import ConfigError


def smooth_split(n, seed):
    # JPEG keeps smooth images close; noise would test the codec, not the layout.
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(40, 210, (n, 3, 1, 1), generator=g)
    ramp = torch.linspace(-30, 30, 32).view(1, 1, 1, 32)
    labels = torch.arange(n) % 3
    return Split((base + ramp).clamp(0, 255).expand(n, 3, 32, 32).to(torch.uint8).contiguous(), labels)


DATA = ImageDataset("toy", ["ant", "bee", "cat"], smooth_split(12, 0), smooth_split(6, 1), "memory")


@pytest.mark.parametrize("name", ["out", "out.tar", "out.tar.xz"])
def test_written_folder_or_archive_reads_back_with_labels_and_pixels(tmp_path, name):
    counts = write_jpeg_folder(DATA, tmp_path / name)
    assert counts == {"train": 12, "test": 6}
    back = load_dataset(tmp_path / name, cache=False)
    assert back.classes == DATA.classes
    for ours, theirs in ((DATA.train, back.train), (DATA.test, back.test)):
        # The reader orders by class then name: our numbering within a class keeps the order.
        order = torch.argsort(ours.labels, stable=True)
        assert torch.equal(theirs.labels, ours.labels[order])
        error = (theirs.images.float() - ours.images[order].float()).abs().mean()
        assert error < 4, error  # lossy, but the same pictures
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_archive_layout_is_split_class_number(tmp_path):
    write_jpeg_folder(DATA, tmp_path / "a.tar.xz")
    with tarfile.open(tmp_path / "a.tar.xz") as tf:
        names = sorted(tf.getnames())
    assert names[:4] == ["test/ant/0000.jpg", "test/ant/0001.jpg", "test/bee/0000.jpg", "test/bee/0001.jpg"]
    assert len(names) == 18 and all(n.endswith(".jpg") for n in names)


def test_refuses_existing_output_and_bad_quality_and_leaves_nothing(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        write_jpeg_folder(DATA, tmp_path / "taken")
    with pytest.raises(ConfigError, match="--quality"):
        write_jpeg_folder(DATA, tmp_path / "new", quality=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_failure_midway_leaves_no_partial_output(tmp_path, monkeypatch):
    import hasten.data.jpeg_export as export

    calls = []

    def failing(image, quality):
        calls.append(1)
        if len(calls) == 5:
            raise OSError("disk full")
        return b"\xff\xd8"

    monkeypatch.setattr(export, "encode_jpeg", failing)
    with pytest.raises(OSError):
        write_jpeg_folder(DATA, tmp_path / "out.tar.xz")
    assert list(tmp_path.iterdir()) == []


def test_command_makes_cifar10_jpeg_from_the_canonical_binary(tmp_path, capsys):
    # 60 records per file, seed 1: every class appears in the test file, as in the real one (a
    # folder-per-class archive cannot hold a class without images; seed 0 draws no ship).
    _, archive, (train_x, train_y), (_, test_y) = make_cifar_binary(tmp_path / "src", n=60, seed=1)
    assert set(test_y.tolist()) == set(range(10))
    out = tmp_path / "cifar10-jpeg.tar.xz"
    assert main(["data", "jpeg", str(archive), str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    back = load_dataset(out, cache=False)
    assert back.name == "CIFAR-10-JPEG" and back.classes == list(CLASSES)
    assert len(back.train.labels) == len(train_y)
    assert np.array_equal(np.bincount(back.train.labels.numpy(), minlength=10), np.bincount(train_y, minlength=10))


def test_command_rejects_unsupported_archive_name_in_one_line(tmp_path, capsys):
    _, archive, _, _ = make_cifar_binary(tmp_path / "src")
    assert main(["data", "jpeg", str(archive), str(tmp_path / "x.zip")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ".tar.xz" in err[0]
