"""resolve_source and load_dataset: what a path holds is decided once, then its reader reads it."""

import tarfile

import numpy as np
import pytest
from PIL import Image

from hasten.data import archive, sources
from hasten.data.cifar10 import RECORD_BYTES, TEST_FILES, TRAIN_FILES
from hasten.data.dataset import Source
from hasten.data.sources import load_dataset, resolve_source
from hasten.errors import DataError


def _cifar_dir(root):
    batches = root / "cifar-10-batches-bin"
    batches.mkdir(parents=True)
    for name in TRAIN_FILES + TEST_FILES:
        (batches / name).write_bytes(bytes([3]) + bytes(RECORD_BYTES - 1))
    return root


def _image_folder(root):
    for split in ("train", "test"):
        for c in ("cat", "dog"):
            (root / split / c).mkdir(parents=True)
            Image.fromarray(np.full((4, 4, 3), 7 if c == "cat" else 200, np.uint8)).save(root / split / c / "0.png")
    return root


def _tar(src, path):
    with tarfile.open(path, "w:gz") as tf:
        tf.add(src, arcname="wrapped")
    return path


def test_each_kind_and_container_is_recognised(tmp_path):
    cifar, folder = _cifar_dir(tmp_path / "c"), _image_folder(tmp_path / "f")
    cases = [(cifar, "cifar10-binary", "dir"), (_tar(cifar, tmp_path / "my-copy.tar.gz"), "cifar10-binary", "tar"),
             (folder, "image-folder", "dir"), (_tar(folder, tmp_path / "pets.tgz"), "image-folder", "tar")]
    for path, kind, container in cases:
        assert resolve_source(path) == Source(kind, path, container)
    assert resolve_source(tmp_path / "pets.tgz").name == "pets" and resolve_source(folder).name == "f"


def test_missing_and_unsupported_paths_are_one_data_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        resolve_source(tmp_path / "nothing")
    (tmp_path / "x.rar").write_bytes(b"x")
    with pytest.raises(DataError, match="not a directory or a supported archive"):
        resolve_source(tmp_path / "x.rar")
    with pytest.raises(ValueError, match="kind"):
        Source("imagenet", tmp_path, "dir")


@pytest.mark.parametrize("make,kind", [(_cifar_dir, "cifar10-binary"), (_image_folder, "image-folder")])
def test_load_dataset_asks_what_the_path_is_once(tmp_path, monkeypatch, make, kind):
    path = _tar(make(tmp_path / "src"), tmp_path / "data.tar.gz")
    calls = []

    def counted(p):
        calls.append(p)
        return real(p)

    real = archive.archive_kind
    monkeypatch.setattr(archive, "archive_kind", counted)
    monkeypatch.setattr(sources, "archive_kind", counted)
    ds = load_dataset(path, workers=1, cache=False)
    assert len(calls) == 1
    assert ds.name == ("CIFAR-10" if kind == "cifar10-binary" else "data")
    assert ds.train.labels.tolist() == ([3] * 5 if kind == "cifar10-binary" else [0, 1])


def test_bad_options_are_refused_before_the_path_is_looked_at(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "resolve_source", None)  # any use would fail
    with pytest.raises(DataError, match="workers"):
        load_dataset(tmp_path / "nothing", workers=0)
