"""Canonical CIFAR-10: binary parser, md5-verified atomic download, offline failure.

Everything runs offline against a small archive in the real binary format that
the tests build themselves.
"""

import hashlib
import io
import tarfile
import time
import urllib.error

import numpy as np
import pytest
import torch

from hasten.data import cifar10, download, load_dataset
from hasten.data.cifar10 import CLASSES, RECORD_BYTES, parse_batch
from hasten.errors import DataError

N_PER_FILE = 6


def make_cifar_binary(root, n=N_PER_FILE, classes=CLASSES, seed=0):
    """Write cifar-10-batches-bin/ with n records per batch file under ``root``
    plus its .tar.gz; return (batch dir, archive, expected train/test arrays)."""
    rng = np.random.default_rng(seed)
    batch_dir = root / "cifar-10-batches-bin"
    batch_dir.mkdir(parents=True)
    expected = {}
    for name in cifar10.TRAIN_FILES + cifar10.TEST_FILES:
        labels = rng.integers(0, len(classes), n, dtype=np.uint8)
        images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        records = np.concatenate([labels[:, None], images.reshape(n, -1)], axis=1)
        (batch_dir / name).write_bytes(records.tobytes())
        expected[name] = (images, labels.astype(np.int64))
    (batch_dir / "batches.meta.txt").write_text("\n".join(classes) + "\n\n")
    archive = root / "cifar-10-binary.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(batch_dir, arcname="cifar-10-batches-bin")

    def cat(names):
        return (np.concatenate([expected[n][0] for n in names]), np.concatenate([expected[n][1] for n in names]))

    return batch_dir, archive, cat(cifar10.TRAIN_FILES), cat(cifar10.TEST_FILES)


def test_parse_batch_reads_label_then_red_green_blue_planes():
    pixels = np.arange(3072, dtype=np.int64) % 251
    record = bytes([7]) + bytes(pixels.astype(np.uint8))
    images, labels = parse_batch(record * 2, "x.bin")
    assert images.shape == (2, 3, 32, 32) and images.dtype == np.uint8
    assert labels.tolist() == [7, 7] and labels.dtype == np.int64
    # Byte 1 + c*1024 + y*32 + x is channel c, row y, column x.
    assert images[0, 0, 0, 1] == pixels[1]
    assert images[0, 1, 0, 0] == pixels[1024]
    assert images[0, 2, 3, 5] == pixels[2048 + 3 * 32 + 5]


@pytest.mark.parametrize("size", [0, RECORD_BYTES - 1, 2 * RECORD_BYTES + 5])
def test_parse_batch_refuses_partial_records(size):
    with pytest.raises(DataError, match=r"data_batch_3\.bin.*whole number"):
        parse_batch(b"\x01" * size, "data_batch_3.bin")


def test_parse_batch_refuses_labels_out_of_range():
    record = bytes([10]) + bytes(3072)
    with pytest.raises(DataError, match="label 10"):
        parse_batch(record, "test_batch.bin")


def test_directory_and_archive_give_the_same_dataset(tmp_path):
    reversed_classes = CLASSES[::-1]  # proves the names come from batches.meta.txt
    batch_dir, archive, (xtr, ytr), (xte, yte) = make_cifar_binary(tmp_path, classes=reversed_classes)
    for source in (batch_dir, tmp_path, archive):
        ds = load_dataset(source)
        assert ds.name == "CIFAR-10"
        assert ds.classes == reversed_classes
        assert torch.equal(ds.train.images, torch.from_numpy(xtr))
        assert torch.equal(ds.train.labels, torch.from_numpy(ytr))
        assert torch.equal(ds.test.images, torch.from_numpy(xte))
        assert torch.equal(ds.test.labels, torch.from_numpy(yte))
        assert len(ds.train) == 5 * N_PER_FILE and len(ds.test) == N_PER_FILE


def test_missing_batch_is_named(tmp_path):
    batch_dir, _, _, _ = make_cifar_binary(tmp_path)
    (batch_dir / "test_batch.bin").unlink()
    with pytest.raises(DataError, match="missing: test_batch.bin"):
        load_dataset(batch_dir)


def _serve(monkeypatch, archive):
    """Point the canonical download at a local file:// URL with the right md5."""
    data = archive.read_bytes()
    monkeypatch.setattr(cifar10, "URL", archive.as_uri())
    monkeypatch.setattr(cifar10, "MD5", hashlib.md5(data).hexdigest())
    monkeypatch.delenv("HASTEN_DATA", raising=False)


def test_download_verify_extract_parse_then_reuse(tmp_path, monkeypatch):
    _, archive, (xtr, _), (xte, _) = make_cifar_binary(tmp_path / "server")
    _serve(monkeypatch, archive)
    ds = load_dataset()
    cache = tmp_path / "cache"
    assert (cache / "cifar-10-binary.tar.gz").read_bytes() == archive.read_bytes()
    assert torch.equal(ds.train.images, torch.from_numpy(xtr))
    assert torch.equal(ds.test.images, torch.from_numpy(xte))
    assert not [p for p in cache.iterdir() if p.name.startswith(".")], "staging files left behind"

    def no_network(*args, **kwargs):
        raise AssertionError("downloaded again although the extracted copy is in the cache")

    monkeypatch.setattr(download, "urlopen", no_network)
    again = load_dataset()
    assert torch.equal(again.train.images, ds.train.images)

    # A batch deleted by hand: re-extracted from the verified archive, still no download.
    (cache / "cifar-10-batches-bin" / "data_batch_2.bin").unlink()
    assert torch.equal(load_dataset().train.images, ds.train.images)


def test_md5_mismatch_is_refused_and_leaves_nothing(tmp_path):
    _, archive, _, _ = make_cifar_binary(tmp_path / "server")
    dest = tmp_path / "dl" / "cifar-10-binary.tar.gz"
    with pytest.raises(DataError, match="md5"):
        download.download(archive.as_uri(), dest, md5="0" * 32)
    assert list(dest.parent.iterdir()) == []


def test_interrupted_download_leaves_no_complete_looking_file(tmp_path, monkeypatch):
    class Dropped(io.BytesIO):
        def read(self, n=-1):
            if self.tell() > 0:
                raise ConnectionResetError("connection reset by peer")
            return super().read(10)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(download, "urlopen", lambda url, timeout: Dropped(b"x" * 100))
    dest = tmp_path / "dl" / "cifar-10-binary.tar.gz"
    with pytest.raises(DataError, match="could not download"):
        download.download("https://example.invalid/cifar-10-binary.tar.gz", dest, md5="0" * 32)
    assert list(dest.parent.iterdir()) == []


def test_existing_file_with_wrong_md5_is_downloaded_again(tmp_path, monkeypatch):
    _, archive, _, _ = make_cifar_binary(tmp_path / "server")
    dest = tmp_path / "dl" / "cifar-10-binary.tar.gz"
    dest.parent.mkdir()
    dest.write_bytes(b"half a download")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    download.download(archive.as_uri(), dest, md5=md5)
    assert dest.read_bytes() == archive.read_bytes()


def test_offline_fails_fast_and_says_how_to_use_a_local_copy(monkeypatch):
    monkeypatch.delenv("HASTEN_DATA", raising=False)
    # A port nothing listens on: the connection is refused at once, as offline.
    monkeypatch.setattr(cifar10, "URL", "http://127.0.0.1:9/cifar-10-binary.tar.gz")
    start = time.perf_counter()
    with pytest.raises(DataError) as err:
        load_dataset()
    assert time.perf_counter() - start < 5
    assert "--data PATH" in str(err.value) and "HASTEN_DATA" in str(err.value)


def test_dns_failure_is_a_data_error(monkeypatch, tmp_path):
    def unreachable(url, timeout):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(download, "urlopen", unreachable)
    with pytest.raises(DataError, match="no network.*HASTEN_DATA"):
        download.download(cifar10.URL, tmp_path / "x.tar.gz", cifar10.MD5)


def test_hasten_data_variable_is_used_before_downloading(tmp_path, monkeypatch):
    batch_dir, _, (xtr, _), _ = make_cifar_binary(tmp_path)
    monkeypatch.setenv("HASTEN_DATA", str(batch_dir))
    monkeypatch.setattr(download, "urlopen", None)
    assert torch.equal(load_dataset().train.images, torch.from_numpy(xtr))


def test_pickled_python_version_is_refused_with_a_pointer_to_the_binary_one(tmp_path):
    batches = tmp_path / "cifar-10-batches-py"
    batches.mkdir()
    for name in ("data_batch_1", "test_batch", "batches.meta"):
        (batches / name).write_bytes(b"\x80\x04 a pickle")
    with pytest.raises(DataError, match="never unpickled.*cifar-10-binary.tar.gz"):
        load_dataset(tmp_path)


def test_missing_path_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_dataset(tmp_path / "nope.tar.gz")
