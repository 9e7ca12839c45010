"""Image-folder datasets: layout, labels, pixels, bad-file policy, decode cache."""

import logging
import os
import shutil
import tarfile
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from hasten.data import image_folder, load_dataset
from hasten.data.cifar10 import CLASSES as CIFAR10_CLASSES
from hasten.errors import DataError


def make_folder(root, classes=("cat", "dog"), n_train=3, n_test=2, size=(8, 8), fmt="PNG", seed=0):
    """Write root/{train,test}/<class>/<i>.<ext> images; return {relative name: RGB array}."""
    rng = np.random.default_rng(seed)
    ext = {"PNG": "png", "JPEG": "jpg"}[fmt]
    written = {}
    for split, n in (("train", n_train), ("test", n_test)):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                array = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
                name = f"{split}/{c}/{i:03d}.{ext}"
                Image.fromarray(array).save(root / name, fmt)
                written[name] = array
    return written


def _pack(src, archive, top=""):
    """Archive the tree at src; members under ``top`` if given."""
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive, "w") as zf:
            for p in sorted(src.rglob("*")):
                zf.write(p, top + p.relative_to(src).as_posix())
    else:
        mode = {".gz": "w:gz", ".xz": "w:xz", ".tar": "w"}[archive.suffix]
        with tarfile.open(archive, mode) as tf:
            tf.add(src, arcname=top.rstrip("/") or ".")
    return archive


def _expected(written, classes, split):
    names = sorted(n for n in written if n.startswith(split + "/"))
    names.sort(key=lambda n: classes.index(n.split("/")[1]))
    images = torch.from_numpy(np.stack([written[n] for n in names])).permute(0, 3, 1, 2)
    labels = torch.tensor([classes.index(n.split("/")[1]) for n in names])
    return images, labels


def test_directory_layout_labels_and_exact_png_pixels(tmp_path):
    root = tmp_path / "pets"
    classes = ["zebra", "ant", "moth"]  # unsorted on purpose: labels follow sorted names
    written = make_folder(root, classes, n_train=3, n_test=2)
    ds = load_dataset(root, workers=1)
    assert ds.classes == ["ant", "moth", "zebra"] and ds.name == "pets"
    for split in ("train", "test"):
        images, labels = _expected(written, ds.classes, split)
        got = getattr(ds, split)
        assert got.images.dtype == torch.uint8 and got.images.is_contiguous()
        assert torch.equal(got.images, images)
        assert torch.equal(got.labels, labels)
    assert ds.skipped == [] and not ds.cached


@pytest.mark.parametrize("archive_name,top", [("pets.tar", ""), ("pets.tar.gz", "pets/"), ("pets.tar.xz", ""),
                                              ("pets.zip", "pets/")])
def test_archives_give_the_same_tensors_as_the_directory(tmp_path, archive_name, top):
    root = tmp_path / "src"
    make_folder(root)
    (root / "README.txt").write_text("not part of the dataset")
    direct = load_dataset(root, workers=1, cache=False)
    ds = load_dataset(_pack(root, tmp_path / archive_name, top), workers=1)
    assert ds.name == "pets" and ds.classes == direct.classes
    assert torch.equal(ds.train.images, direct.train.images) and torch.equal(ds.test.labels, direct.test.labels)


def test_jpeg_pixels_match_pillow_and_cifar_classes_are_named_cifar10_jpeg(tmp_path):
    root = tmp_path / "copy"
    y, x = np.mgrid[0:32, 0:32]
    smooth = np.stack([x * 8, y * 8, (x + y) * 4], -1).astype(np.uint8)
    for split in ("train", "test"):
        for k, c in enumerate(CIFAR10_CLASSES):
            (root / split / c).mkdir(parents=True)
            Image.fromarray(np.roll(smooth, k, axis=1)).save(root / split / c / "0.jpg", quality=75)
    ds = load_dataset(root, workers=1)
    assert ds.name == "CIFAR-10-JPEG"
    for k, c in enumerate(CIFAR10_CLASSES):
        pillow = np.asarray(Image.open(root / "train" / c / "0.jpg").convert("RGB"))
        ours = ds.train.images[k].permute(1, 2, 0).numpy()
        assert np.abs(ours.astype(int) - pillow.astype(int)).max() <= 2
    png_root = tmp_path / "png-copy"
    make_folder(png_root, CIFAR10_CLASSES, n_train=1, n_test=1)
    assert load_dataset(png_root, workers=1).name == "png-copy"


def _with_bad_files(root, n_train=55, n_test=50):
    """A folder with 210 images and 2 bad files (< 1%): a truncated JPEG and a text file."""
    written = make_folder(root, n_train=n_train, n_test=n_test, fmt="JPEG", size=(8, 8))
    good = (root / "train/cat/000.jpg").read_bytes()
    (root / "train/cat/999.jpg").write_bytes(good[: len(good) // 2])
    (root / "test/dog/notes.jpg").write_text("a text file with an image name")
    return written


def test_bad_files_are_skipped_counted_named_and_logged(tmp_path, caplog):
    root = tmp_path / "pets"
    written = _with_bad_files(root)
    with caplog.at_level(logging.WARNING, logger="hasten.data"):
        ds = load_dataset(root, workers=1)
    assert sorted(n for n, _ in ds.skipped) == ["test/dog/notes.jpg", "train/cat/999.jpg"]
    assert all(reason for _, reason in ds.skipped)
    assert len(ds.train) == 2 * 55 and len(ds.test) == 2 * 50  # every good image kept
    assert ds.train.labels.bincount().tolist() == [55, 55]
    assert "skipped 2 unreadable file(s)" in caplog.text and "notes.jpg" in caplog.text
    assert len(written) == len(ds.train) + len(ds.test)


def test_too_many_bad_files_stop_with_one_error_naming_them(tmp_path):
    root = tmp_path / "pets"
    _with_bad_files(root, n_train=3, n_test=2)  # 2 bad of 12 files
    with pytest.raises(DataError, match=r"2 of 12 files.*max_bad_fraction=0.01: .*train/cat/999\.jpg") as err:
        load_dataset(root, workers=1)
    assert "test/dog/notes.jpg" in str(err.value)
    assert len(load_dataset(root, workers=1, max_bad_fraction=0.2).skipped) == 2


def test_cached_result_still_applies_the_threshold(tmp_path):
    root = tmp_path / "pets"
    _with_bad_files(root, n_train=3, n_test=2)
    load_dataset(root, workers=1, max_bad_fraction=0.5)
    with pytest.raises(DataError, match="max_bad_fraction"):
        load_dataset(root, workers=1)


def test_empty_class_folder_is_an_error(tmp_path):
    root = tmp_path / "pets"
    make_folder(root)
    (root / "train" / "bird").mkdir()
    (root / "test" / "bird").mkdir()
    with pytest.raises(DataError, match="empty class folder.*train/bird"):
        load_dataset(root, workers=1)


def test_empty_class_folder_inside_an_archive_is_an_error(tmp_path):
    root = tmp_path / "src"
    make_folder(root)
    for split in ("train", "test"):
        (root / split / "bird").mkdir()
    with pytest.raises(DataError, match="empty class folder.*bird"):
        load_dataset(_pack(root, tmp_path / "pets.tar.gz"), workers=1)


def test_train_test_class_mismatch_is_an_error(tmp_path):
    root = tmp_path / "pets"
    make_folder(root)
    shutil.rmtree(root / "test" / "dog")
    (root / "test" / "fox").mkdir()
    Image.new("RGB", (8, 8)).save(root / "test" / "fox" / "0.png")
    with pytest.raises(DataError, match=r"different classes: only in train: \['dog'\]; only in test: \['fox'\]"):
        load_dataset(root, workers=1)


def test_missing_split_is_an_error(tmp_path):
    root = tmp_path / "pets"
    make_folder(root)
    shutil.rmtree(root / "test")
    with pytest.raises(DataError, match="expected folders train/<class>/ and test/<class>/"):
        load_dataset(root, workers=1)


def test_mixed_sizes_name_the_odd_file_unless_image_size_is_given(tmp_path):
    root = tmp_path / "pets"
    make_folder(root, size=(8, 8))
    Image.new("RGB", (12, 10), (255, 0, 0)).save(root / "train" / "dog" / "odd.png")
    with pytest.raises(DataError, match=r"most are 8x8, but train/dog/odd\.png is 10x12"):
        load_dataset(root, workers=1)
    ds = load_dataset(root, workers=1, image_size=6)
    assert ds.train.images.shape == (7, 3, 6, 6) and ds.test.images.shape[2:] == (6, 6)
    red = ds.train.images[-1]  # odd.png sorts last in the last class
    assert (red[0] == 255).all() and (red[1:] == 0).all()


def test_cache_hit_returns_identical_tensors_without_decoding(tmp_path, monkeypatch):
    root = tmp_path / "pets"
    make_folder(root, fmt="JPEG")
    first = load_dataset(root, workers=1)

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again despite a cache entry")

    with monkeypatch.context() as m:
        m.setattr(image_folder, "decode_image", no_decoding)
        second = load_dataset(root, workers=1)
    assert second.cached and not first.cached
    for split in ("train", "test"):
        assert torch.equal(getattr(first, split).images, getattr(second, split).images)
        assert torch.equal(getattr(first, split).labels, getattr(second, split).labels)
    assert second.name == first.name and second.classes == first.classes
    entries = list((tmp_path / "cache" / "image_folder").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".")

    # A changed file or different options must not hit the old entry.
    calls = []
    real = image_folder.decode_image
    monkeypatch.setattr(image_folder, "decode_image", lambda *a, **k: calls.append(1) or real(*a, **k))
    Image.new("RGB", (8, 8), (1, 2, 3)).save(root / "train" / "cat" / "000.jpg")
    os.utime(root / "train" / "cat" / "000.jpg", ns=(1, 1))
    changed = load_dataset(root, workers=1)
    assert calls and not changed.cached
    assert not torch.equal(changed.train.images, first.train.images)
    calls.clear()
    load_dataset(root, workers=1, image_size=4)
    assert calls


def test_cache_directory_default_and_override(tmp_path, monkeypatch):
    from hasten.data.cache import cache_dir

    assert cache_dir() == tmp_path / "cache"  # HASTEN_CACHE, set by conftest
    monkeypatch.delenv("HASTEN_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "hasten" and cache_dir().is_dir()


def test_damaged_cache_entry_is_rebuilt(tmp_path):
    root = tmp_path / "pets"
    make_folder(root)
    first = load_dataset(root, workers=1)
    (entry,) = (tmp_path / "cache" / "image_folder").iterdir()
    npy = entry / "train_images.npy"
    npy.write_bytes(npy.read_bytes()[:100])
    rebuilt = load_dataset(root, workers=1)
    assert not rebuilt.cached and torch.equal(rebuilt.train.images, first.train.images)
    assert load_dataset(root, workers=1).cached


def test_archive_cache_key_follows_content(tmp_path, monkeypatch):
    src = tmp_path / "src"
    make_folder(src)
    archive = _pack(src, tmp_path / "pets.tar")
    load_dataset(archive, workers=1)
    copy = tmp_path / "elsewhere" / "pets.tar"
    copy.parent.mkdir()
    shutil.copy(archive, copy)
    monkeypatch.setattr(image_folder, "decode_image", None)  # any decode would fail
    assert load_dataset(copy, workers=1).cached


def test_worker_processes_give_the_same_result(tmp_path, monkeypatch):
    root = tmp_path / "pets"
    make_folder(root, n_train=5, n_test=4, fmt="JPEG")
    (root / "train/dog/bad.jpg").write_bytes(b"\xff\xd8\xff broken")
    serial = load_dataset(root, workers=1, cache=False, max_bad_fraction=0.1)
    monkeypatch.setattr(image_folder, "CHUNK", 3)  # several chunks, so the pool really is used
    parallel = load_dataset(root, workers=2, cache=False, max_bad_fraction=0.1)
    assert torch.equal(serial.train.images, parallel.train.images)
    assert torch.equal(serial.test.labels, parallel.test.labels)
    assert serial.skipped == parallel.skipped == [("train/dog/bad.jpg", serial.skipped[0][1])]


def _die(chunk, image_size):
    os._exit(1)  # what an out-of-memory kill or a decoder segfault looks like to the pool


def test_a_dying_worker_is_one_data_error(tmp_path, monkeypatch):
    root = tmp_path / "pets"
    make_folder(root)
    monkeypatch.setattr(image_folder, "_decode_chunk", _die)
    with pytest.raises(DataError, match="worker process died"):
        load_dataset(root, workers=2, cache=False)


def test_bad_options_are_refused(tmp_path):
    root = tmp_path / "pets"
    make_folder(root)
    for kwargs in ({"image_size": 0}, {"max_bad_fraction": 1.5}, {"workers": 0}):
        with pytest.raises(DataError, match=next(iter(kwargs))):
            load_dataset(root, **kwargs)
    with pytest.raises(DataError, match="not a directory or a supported archive"):
        (tmp_path / "x.rar").write_bytes(b"x")
        load_dataset(tmp_path / "x.rar")


def test_summary_and_properties(tmp_path):
    root = tmp_path / "pets"
    make_folder(root)
    ds = load_dataset(root, workers=1)
    assert ds.train.labels.dtype == torch.int64 and ds.image_size == (8, 8)
    assert "pets: 6 train / 4 test images, 2 classes, 8x8" in ds.summary()
