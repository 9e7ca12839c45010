"""open_records: one pass over a folder or archive, then random access; labelled as load_dataset labels."""

import io
import shutil
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

from hasten.data.sources import load_dataset
from hasten.errors import DataError
from hasten.stream.records import open_records

CLASSES = ("cat", "dog", "emu")


def png_bytes(rng, size=8):
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def folder(tmp_path):
    """train/<class>/NNN.png (20 per class) and test/<class>/ (2 per class), classes written unsorted."""
    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 20), ("test", 2)):
        for c in reversed(CLASSES):
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                (root / split / c / f"{i:03d}.png").write_bytes(png_bytes(rng))
    return root


def test_records_from_folder_and_archive_agree(folder, tmp_path):
    tar = tmp_path / "images.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        tf.add(folder, arcname="images")
    a, b = open_records(folder), open_records(tar)
    assert len(a) == len(b) == 60 and a.classes == b.classes == list(CLASSES)
    assert a[5][1] == b[5][1] and a[5][2] == b[5][2]
    assert len(open_records(folder, "test")) == 6
    with pytest.raises(ValueError, match="train, test"):
        open_records(folder, "validation")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.jpg").write_bytes(b"x")
    with pytest.raises(DataError, match="train/<class>"):
        open_records(tmp_path / "flat")



def test_records_and_load_dataset_label_the_same_files_alike(folder):
    (folder / "train" / "dog" / "deeper").mkdir()
    (folder / "train" / "dog" / "deeper" / "x.png").write_bytes((folder / "train" / "cat" / "000.png").read_bytes())
    (folder / "train" / ".DS_Store").write_bytes(b"not an image")
    ds = load_dataset(folder, workers=1, cache=False)
    for split in ("train", "test"):
        records = open_records(folder, split)
        assert records.classes == ds.classes == sorted(CLASSES)
        assert torch.equal(torch.from_numpy(records.labels), getattr(ds, split).labels)
        # Record i holds the bytes that became image i of the decoded split.
        decoded = getattr(ds, split).images
        for i in (0, len(records) // 2, len(records) - 1):
            image = np.array(Image.open(io.BytesIO(records[i][1])).convert("RGB"))
            assert torch.equal(torch.from_numpy(image).permute(2, 0, 1), decoded[i])


def test_records_refuse_a_split_missing_a_class(folder):
    shutil.rmtree(folder / "test" / "emu")
    with pytest.raises(DataError, match=r"different classes: only in train: \['emu'\]"):
        open_records(folder)


def test_records_refuse_canonical_cifar10_binary(tmp_path):
    batches = tmp_path / "cifar-10-batches-bin"
    batches.mkdir()
    (batches / "data_batch_1.bin").write_bytes(bytes(3073))
    with pytest.raises(DataError, match="binary format.*load_dataset"):
        open_records(tmp_path)


def test_record_cache_is_reused_and_a_damaged_one_rebuilt(folder, tmp_path):
    first = open_records(folder, cache=tmp_path / "c")
    expected, n = first[7][1], len(first)
    (entry,) = (tmp_path / "c" / "records").iterdir()
    assert entry.name.startswith("images-")
    assert first.blob.filename == entry / "train_blob.npy"  # mapped from the cache, not read
    del first  # no reads from the mapping past the damage below
    blob = entry / "train_blob.npy"
    blob.write_bytes(blob.read_bytes()[:100])
    again = open_records(folder, cache=tmp_path / "c")
    assert again[7][1] == expected and len(again) == n
