import hashlib
import os
import tarfile

import numpy as np
import pytest

from hasten.errors import DataError
from hasten.stream.chunk_decode import default_image_size
from hasten.stream.epoch_plan import epoch_plan, plan_records
from hasten.stream.pack import pack
from hasten.stream.records import open_records
from hasten.stream.shard_cache import ShardCache
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.shard_store import ShardFiles
from hasten.stream.slow_storage import SlowStorage
from hasten.stream.sources import open_source
from hasten.stream.tar_members import read_member
from hasten.stream.virtual_shards import FolderShards, RecordShards


@pytest.fixture(scope="module")
def archive(photo_folder, tmp_path_factory):
    path = tmp_path_factory.mktemp("archive") / "photos.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        tf.add(photo_folder, arcname="photos")
    return path


def layout_labels(root, split):
    """{file path under the split: label}, from the class folder names (the reference)."""
    classes = sorted(os.listdir(root / split))
    return {f"{split}/{c}/{f}": classes.index(c) for c in classes for f in os.listdir(root / split / c)}


def eval_crops(store):
    """Sorted (label, digest of the centre crop) of every example: what any order delivers."""
    out = []
    for x, y in ShardLoader(store, batch_size=7, image_size=20, train=False):
        out += [(int(label), hashlib.sha1(img.numpy().tobytes()).hexdigest()) for img, label in zip(x, y)]
    return sorted(out)


def test_folder_shards_hold_every_file_once_with_its_class_label(photo_folder):
    store = FolderShards(photo_folder, "train", per_shard=5, seed=1)
    labels = layout_labels(photo_folder, "train")
    assert store.total == len(labels) == 54 and max(store.examples) == 5 and len(store) == 11
    assert store.classes == ["ant", "bee", "cat"]
    seen = {}
    for i in range(len(store)):
        for r in store.shard_records(i):
            seen[r.name.partition(":")[2]] = r.label
    assert seen == labels
    # Classes are mixed across shards (a seeded permutation), not one class per shard.
    first = {r.label for r in store.shard_records(0)}
    assert len(first) > 1
    assert FolderShards(photo_folder, "train", per_shard=5, seed=2).shard_records(0) != store.shard_records(0)


@pytest.mark.parametrize("world", [1, 3])
def test_loader_over_a_folder_delivers_each_example_once_per_epoch(photo_folder, world):
    store = FolderShards(photo_folder, "train", per_shard=4)
    for epoch in range(2):
        keys = []
        for rank in range(world):
            loader = ShardLoader(store, batch_size=5, image_size=16, rank=rank, world_size=world, seed=3,
                                 shuffle_buffer=6, with_keys=True, workers=1)
            loader.set_epoch(epoch)
            keys += [k for _, _, batch in loader for k in batch.tolist()]
        assert sorted(keys) == list(range(store.total))


def test_a_folder_an_archive_and_packed_shards_give_the_same_examples(photo_folder, archive, tmp_path):
    pack(photo_folder, tmp_path / "packed", shard_bytes=40_000)
    packed = open_source(tmp_path / "packed", "test")
    folder = open_source(photo_folder, "test")
    blob = open_source(archive, "test")
    assert isinstance(packed, ShardFiles) and isinstance(folder, FolderShards) and isinstance(blob, RecordShards)
    assert packed.classes == folder.classes == blob.classes
    reference = eval_crops(packed)
    assert len(reference) == 18
    assert eval_crops(folder) == reference and eval_crops(blob) == reference


@pytest.mark.parametrize("source", ["folder", "archive"])
def test_images_are_left_where_they_are_for_the_worker_to_read(photo_folder, archive, source):
    store = FolderShards(photo_folder, per_shard=8) if source == "folder" else \
        RecordShards(open_records(archive), per_shard=8)
    plan = epoch_plan(store.examples, epoch=0, seed=4, buffer=8)
    eager = list(plan_records(store, plan))
    lazy = list(plan_records(store, plan, lazy=True))
    assert [(t, r.key, r.name, r.label) for t, r in lazy] == [(t, r.key, r.name, r.label) for t, r in eager]
    assert all(r.data is None and r.where is not None for _, r in lazy)
    assert all(read_member(a.where) == b.data and b.data for (_, a), (_, b) in zip(lazy, eager))


def test_wrapped_in_slow_storage_and_a_cache_a_folder_reads_as_tar_bytes_with_the_same_records(photo_folder,
                                                                                                 tmp_path):
    store = FolderShards(photo_folder, "train", per_shard=6)
    wrapped = ShardCache(SlowStorage(store, latency_s=0.0), tmp_path / "cache", max_bytes=1 << 30)
    plan = epoch_plan(store.examples, epoch=1, seed=2, buffer=5)
    direct = [(t, r.key, r.name, r.label, r.data) for t, r in plan_records(store, plan)]
    through = [(t, r.key, r.name, r.label, r.data) for t, r in plan_records(wrapped, plan)]
    assert through == direct and wrapped.misses == len(store)  # every shard went through the wrapper
    assert len(list(plan_records(wrapped, plan))) == store.total and wrapped.hits == len(store)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_over_a_folder_yields_exactly_the_rest(photo_folder, workers):
    store = FolderShards(photo_folder, "train", per_shard=5)
    kw = dict(batch_size=4, image_size=16, seed=5, shuffle_buffer=6, with_keys=True, workers=workers)
    full = [(k.tolist(), x.clone()) for x, _, k in ShardLoader(store, **kw)]
    first = ShardLoader(store, **kw)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    del it
    resumed = ShardLoader(store, **kw)
    resumed.load_state_dict(state)
    rest = [(k.tolist(), x.clone()) for x, _, k in resumed]
    assert len(rest) == len(full) - 4
    assert all(a[0] == b[0] and (a[1] == b[1]).all() for a, b in zip(full[4:], rest))


@pytest.mark.parametrize("workers", [0, 2])
def test_bad_and_vanished_files_in_a_folder_are_skipped_and_counted_by_name(photo_folder, tmp_path, workers):
    import shutil

    root = tmp_path / "photos"
    shutil.copytree(photo_folder, root)
    (root / "train" / "bee" / "bee03.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    store = FolderShards(root, "train", per_shard=6)
    (root / "train" / "cat" / "cat05.jpg").unlink()  # listed, then gone before it is read
    loader = ShardLoader(store, batch_size=8, image_size=16, train=False, max_bad_fraction=1.0, workers=workers)
    assert sum(len(y) for _, y in loader) == store.total - 2
    skipped = dict(loader.skipped)
    assert {name.partition(":")[2] for name in skipped} == {"train/bee/bee03.jpg", "train/cat/cat05.jpg"}
    assert any("cannot read" in why for why in skipped.values())
    with pytest.raises(DataError, match=r"not readable images.*bee03"):
        list(ShardLoader(store, batch_size=8, image_size=16, train=False, max_bad_fraction=0.0))


def test_a_file_name_with_dots_keeps_one_key(tmp_path, photo_jpeg):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c, name in (("a", "x.v2.JPEG"), ("b", "y.jpg")):
            (tmp_path / split / c).mkdir(parents=True)
            (tmp_path / split / c / name).write_bytes(photo_jpeg(rng, 30, 30))
    store = FolderShards(tmp_path, "train", per_shard=4)
    names = sorted(r.name.partition(":")[2] for r in store.shard_records(0))
    assert names == ["train/a/x_v2.jpeg", "train/b/y.jpg"]
    plan = epoch_plan(store.examples, epoch=0)
    as_tar = [(r.name, r.label, r.data) for _, r in plan_records(SlowStorage(store, latency_s=0.0), plan)]
    assert as_tar == [(r.name, r.label, r.data) for _, r in plan_records(store, plan)]


@pytest.mark.parametrize("given, match", [("missing", "does not exist"), ("cifar", "binary format"),
                                          ("url", "unknown URL scheme ftp://")])
def test_open_source_refuses_what_it_cannot_stream_in_one_line(tmp_path, given, match):
    path = "ftp://host/shards" if given == "url" else tmp_path / "nothing"  # (a URL goes to open_shards)
    if given == "cifar":
        path.mkdir()
        for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
            (path / name).write_bytes(bytes(3073))
    with pytest.raises(DataError, match=match) as e:
        open_source(path)
    assert "\n" not in str(e.value)


def test_default_image_size_of_a_folder_reads_its_first_virtual_shard(photo_folder, tmp_path, photo_jpeg):
    from PIL import Image

    store = FolderShards(photo_folder, per_shard=8, seed=3)
    sides = [min(Image.open(photo_folder / r.name.partition(":")[2]).size) for r in store.shard_records(0)]
    assert default_image_size(store) == max(sides) < 224  # the photos are 90 to 200 px
    assert default_image_size(store, largest=64) == 64
