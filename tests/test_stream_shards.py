import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hasten.errors import DataError
from hasten.stream.pack import pack
from hasten.stream.epoch_plan import epoch_plan, plan_records
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.shard_store import ShardFiles, open_shards
from hasten.stream.tar_members import read_member, read_shard, scan_shard


@pytest.fixture(scope="module")
def packed(photo_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "set"
    pack(photo_folder, out, shard_bytes=40_000)  # ~54 train images in about a dozen shards of 2..8
    return out


def file_order_labels(shards):
    """Label of every global example number, read shard by shard (the reference)."""
    return [r.label for i in range(len(shards)) for r in read_shard(shards[i], shards.names[i])]


def keys_of(loader):
    out = []
    for x, y, k in loader:
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, loader.image_size, loader.image_size)
        out.append((k.numpy(), y.numpy(), x.numpy()))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_plan_gives_every_example_to_exactly_one_rank_every_epoch(world):
    counts = [7, 3, 9, 1, 12, 5, 8]
    n = sum(counts)
    orders = []
    for epoch in range(3):
        owned = []
        for rank in range(world):
            plan = epoch_plan(counts, epoch=epoch, seed=4, rank=rank, world_size=world, buffer=6)
            assert sorted(plan.order.tolist()) == list(range(len(plan)))  # the buffer permutes, no loss
            owned.append(np.arange(plan.start, plan.stop))
        sizes = [len(o) for o in owned]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n
        assert sorted(np.concatenate(owned).tolist()) == list(range(n))
        orders.append(epoch_plan(counts, epoch=epoch, seed=4).shard_order.tolist())
    assert orders[0] != orders[1] or orders[1] != orders[2]  # shards are reshuffled per epoch


@pytest.mark.parametrize("world", [1, 2, 3])
def test_loader_delivers_each_example_once_per_epoch_across_ranks(packed, world):
    shards = open_shards(packed, "train")
    labels = file_order_labels(shards)
    per_epoch = []
    for epoch in range(2):
        seen = []
        for rank in range(world):
            loader = ShardLoader(shards, batch_size=5, image_size=24, rank=rank, world_size=world, seed=1,
                                 shuffle_buffer=8, with_keys=True)
            loader.set_epoch(epoch)
            got = keys_of(loader)
            keys = np.concatenate([k for k, _, _ in got])
            assert len(keys) == loader.examples_per_rank()
            # Labels travel with their images: each key's label is its label in the shard files.
            assert [labels[k] for k in keys] == np.concatenate([y for _, y, _ in got]).tolist()
            seen += keys.tolist()
        assert sorted(seen) == list(range(shards.total))
        per_epoch.append(seen)
    assert per_epoch[0] != per_epoch[1]


def test_order_within_shards_and_buffer_is_shuffled_but_reproducible(packed):
    shards = open_shards(packed, "train")

    def run(seed):
        loader = ShardLoader(shards, batch_size=54, image_size=16, seed=seed, with_keys=True)
        return [k.tolist() for _, _, k in loader]

    assert run(3) == run(3) and run(3) != run(4)
    keys = run(3)[0]
    assert keys != sorted(keys)
    # Without the buffer, shards still come in a new order and each one's examples in a new order.
    unbuffered = ShardLoader(shards, batch_size=54, image_size=16, seed=3, with_keys=True, shuffle_buffer=0)
    keys = next(iter(unbuffered))[2].tolist()
    adjacent = sum(b == a + 1 for a, b in zip(keys, keys[1:]))
    assert keys != sorted(keys) and adjacent < len(keys) // 3


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_yields_exactly_the_remaining_examples(packed, workers):
    shards = open_shards(packed, "train")
    kw = dict(batch_size=4, image_size=24, rank=1, world_size=2, seed=2, shuffle_buffer=10, with_keys=True,
              workers=workers)
    whole = ShardLoader(shards, **kw)
    whole.set_epoch(3)
    full = keys_of(whole)

    first = ShardLoader(shards, **kw)
    first.set_epoch(3)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    assert state == {"epoch": 3, "position": 12}
    del it

    resumed = ShardLoader(shards, **kw)
    resumed.load_state_dict(state)
    resumed.set_epoch(3)  # the training loop's call keeps the loaded position
    rest = keys_of(resumed)
    assert len(rest) == len(full) - 3
    for (k1, y1, x1), (k2, y2, x2) in zip(full[3:], rest):
        assert np.array_equal(k1, k2) and np.array_equal(y1, y2) and np.array_equal(x1, x2)  # same crops too
    assert resumed.state_dict() == {"epoch": 4, "position": 0}


def test_resume_reads_only_shards_that_still_hold_due_examples(packed):
    shards = open_shards(packed, "train")
    reads = []

    class Counting:
        names, examples, sizes = shards.names, shards.examples, shards.sizes

        def __getitem__(self, i):
            reads.append(i)
            return shards[i]

    plan = epoch_plan(shards.examples, epoch=0, seed=0, buffer=0)
    list(plan_records(Counting(), plan, 0))
    assert sorted(reads) == list(range(len(shards)))
    reads.clear()
    late = len(plan) - shards.examples[int(plan.shard_order[-1])]  # the last shard's examples remain
    rest = list(plan_records(Counting(), plan, late))
    assert reads == [int(plan.shard_order[-1])]
    assert [t for t, _ in rest] == list(range(late, len(plan)))


def test_local_shards_are_read_into_reused_buffers_with_the_same_records(packed, monkeypatch):
    shards = open_shards(packed, "train")
    calls = []
    real = ShardFiles.read_into

    def spy(self, i, buffer=None):
        got, view = real(self, i, buffer)
        calls.append((buffer is not None, len(got)))
        return got, view

    monkeypatch.setattr(ShardFiles, "read_into", spy)

    class Bytes:  # the same shards through the plain store interface: new bytes per read
        names, examples, sizes = shards.names, shards.examples, shards.sizes

        def __getitem__(self, i):
            return shards[i]

    plan = epoch_plan(shards.examples, epoch=0, seed=3, buffer=16)
    ours = [(t, r.key, r.name, r.data, r.label) for t, r in plan_records(shards, plan, 0, prefetch=2)]
    theirs = [(t, r.key, r.name, r.data, r.label) for t, r in plan_records(Bytes(), plan, 0, prefetch=2)]
    assert ours == theirs and len(calls) == len(shards)
    # After the first prefetch + 1 reads, every read is handed a buffer to reuse (grown when a
    # shard is larger than it).
    assert sum(reused for reused, _ in calls) >= len(shards) - 3
    # A buffer too small for the shard is replaced by one that fits.
    small = bytearray(10)
    got, view = real(shards, 0, small)
    assert got is not small and bytes(view) == shards[0]
    same, _ = real(shards, 0, got)
    assert same is got


def test_scanned_shards_give_the_same_records_and_the_workers_read_the_same_bytes(packed):
    shards = open_shards(packed, "train")
    plan = epoch_plan(shards.examples, epoch=1, seed=5, buffer=16)
    eager = list(plan_records(shards, plan, 0, prefetch=2))
    lazy = list(plan_records(shards, plan, 0, prefetch=2, lazy=True))
    assert [(t, r.key, r.name, r.label, r.reason) for t, r in lazy] == \
        [(t, r.key, r.name, r.label, r.reason) for t, r in eager]
    assert all(r.data is None and r.where is not None for _, r in lazy)  # no image bytes in this process
    assert all(read_member(a.where) == b.data for (_, a), (_, b) in zip(lazy, eager))
    # Scanning checks what reading checks: the index's example count and size.
    with pytest.raises(DataError, match="index says"):
        scan_shard(shards.paths[0], shards.names[0], expected=shards.examples[0] + 1)
    with pytest.raises(DataError, match="index says"):
        scan_shard(shards.paths[0], shards.names[0], size=shards.sizes[0] + 512)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_changed_after_it_was_scanned_costs_its_examples_not_the_run(tmp_path, photo_jpeg, workers,
                                                                             monkeypatch):
    """The file is cut (or copied over) between the scan and the workers' reads: its
    examples are skipped and counted by name, never decoded from other bytes."""
    import hasten.stream.epoch_plan as ep

    rng = np.random.default_rng(1)
    _write_shard(tmp_path / "shard-000000.tar", [m for i in range(6) for m in
                                                 ((f"{i}.jpg", photo_jpeg(rng, 40, 50)), (f"{i}.cls", b"1"))])
    path = tmp_path / "shard-000000.tar"
    real_scan = ep.scan_shard

    def scan_then_cut(*a, **kw):
        records = real_scan(*a, **kw)
        with open(path, "r+b") as f:
            f.truncate(records[3].where[1])  # from the fourth image on, the bytes are gone
        os.utime(path, ns=(1, 1))  # (a clock too coarse to see the change must not matter)
        return records

    monkeypatch.setattr(ep, "scan_shard", scan_then_cut)
    loader = ShardLoader(open_shards(tmp_path), batch_size=8, image_size=16, train=False, max_bad_fraction=1.0,
                         workers=workers)
    assert list(loader) == []
    assert {name for name, _ in loader.skipped} == {f"shard-000000.tar:{i}.jpg" for i in range(6)}
    assert all("changed after it was scanned" in why for _, why in loader.skipped)
    # Bytes that come short of the scanned size are an error too.
    _write_shard(path, [("0.jpg", photo_jpeg(rng, 40, 50)), ("0.cls", b"1")])
    where = real_scan(path, "s")[0].where
    with pytest.raises(OSError, match="shorter"):
        read_member((where[0], where[1], 10**9, where[3]))


def test_position_is_checked_against_the_epoch(packed):
    loader = ShardLoader(open_shards(packed, "train"), batch_size=4)
    with pytest.raises(ValueError, match="outside"):
        loader.load_state_dict({"epoch": 0, "position": 10_000})
    loader.load_state_dict({"epoch": 2, "position": 8})
    loader.set_epoch(5)  # another epoch starts from its beginning
    assert loader.state_dict() == {"epoch": 5, "position": 0}


def test_eval_loader_reads_in_file_order_with_centre_crops(packed):
    shards = open_shards(packed, "test")
    a = keys_of(ShardLoader(shards, batch_size=7, image_size=20, train=False, with_keys=True))
    b = keys_of(ShardLoader(shards, batch_size=7, image_size=20, train=False, with_keys=True, seed=9))
    assert np.concatenate([k for k, _, _ in a]).tolist() == list(range(shards.total))
    assert all(np.array_equal(x1, x2) for (_, _, x1), (_, _, x2) in zip(a, b))


def _write_shard(path: Path, members):
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("workers", [0, 2])  # 2: records as views, packed into shared memory
def test_bad_members_are_skipped_and_counted_by_name(tmp_path, photo_jpeg, workers):
    rng = np.random.default_rng(0)
    good = [photo_jpeg(rng, 40, 50) for _ in range(4)]
    cut = photo_jpeg(rng, 40, 50)
    _write_shard(tmp_path / "shard-000000.tar", [
        ("a.jpg", good[0]), ("a.cls", b"1"),
        ("b.jpg", b"\xff\xd8\xff not really a jpeg"), ("b.cls", b"0"),  # damaged image
        ("c.jpg", good[1]),  # no label
        ("d.jpg", good[2]), ("d.cls", b"seven"),  # unreadable label
        ("e.jpg", good[3]), ("e.json", json.dumps({"label": 2}).encode()),
        ("f.cls", b"1"),  # no image
        ("g.jpg", cut[:len(cut) // 2]), ("g.cls", b"3"),  # a JPEG cut in half: a header, half the data
    ])
    shards = open_shards(tmp_path)
    assert shards.examples == [7]
    loader = ShardLoader(shards, batch_size=8, image_size=16, train=False, max_bad_fraction=1.0, workers=workers)
    (x, y), = list(loader)
    assert y.tolist() == [1, 2] and x.shape == (2, 3, 16, 16)
    skipped = dict(loader.skipped)
    assert set(skipped) == {"shard-000000.tar:b.jpg", "shard-000000.tar:c.jpg", "shard-000000.tar:d.jpg",
                            "shard-000000.tar:f", "shard-000000.tar:g.jpg"}
    assert "label" in skipped["shard-000000.tar:c.jpg"] and "image" in skipped["shard-000000.tar:f"]
    # Past max_bad_fraction the read stops with one error naming them.
    with pytest.raises(DataError, match=r"not readable images.*shard-000000\.tar:b\.jpg"):
        list(ShardLoader(shards, batch_size=8, image_size=16, train=False, max_bad_fraction=0.0))


@pytest.mark.parametrize("cut", ["middle", "member-boundary", "index-size", "damaged-header"])
def test_truncated_shard_gives_one_error_naming_it(packed, tmp_path, cut):
    import shutil

    copy = tmp_path / "set"
    shutil.copytree(packed, copy)
    shards = open_shards(copy, "train")
    victim = shards.paths[2]
    data = victim.read_bytes()
    with tarfile.open(victim) as tf:
        members = tf.getmembers()
    if cut == "middle":
        data = data[: len(data) // 2]
    elif cut == "member-boundary":  # a tar cut cleanly between members still parses; it must not pass
        data = data[: members[2].offset]
    elif cut == "index-size":
        data = data[:-10240]  # only the final padding record lost: the index's size catches it
    else:  # one flipped byte in a member's header: its checksum no longer matches
        data = bytearray(data)
        data[members[2].offset + 140] ^= 0xFF  # in its mtime field: only the checksum tells
        data = bytes(data)
    victim.write_bytes(data)
    loader = ShardLoader(open_shards(copy, "train"), batch_size=4, image_size=16, shuffle=False)
    with pytest.raises(DataError, match=r"shard train/shard-000002\.tar is truncated") as e:
        list(loader)
    assert "\n" not in str(e.value)
    if cut != "index-size":
        # Without an index, the tar's own end blocks tell.
        with pytest.raises(DataError, match=r"shard-000002\.tar"):
            list(ShardLoader(open_shards([victim]), batch_size=4, image_size=16))


def test_shards_without_an_index_are_counted_from_their_headers(packed, tmp_path):
    indexed = open_shards(packed, "train")
    plain = open_shards(packed / "train")  # a folder of shard-*.tar, no index.json in it
    assert plain.examples == indexed.examples and plain.classes == []
    listed = open_shards([str(p) for p in indexed.paths[:2]])
    assert listed.examples == indexed.examples[:2]
    with pytest.raises(DataError, match="no index.json and no shard"):
        open_shards(tmp_path)


@pytest.mark.parametrize("kwargs, match", [({"batch_size": 0}, "batch_size"), ({"prefetch": 0}, "prefetch"),
                                           ({"rank": 2, "world_size": 2}, "rank"),
                                           ({"max_bad_fraction": 2}, "max_bad_fraction")])
def test_rejects_bad_parameters(packed, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShardLoader(open_shards(packed, "train"), **{"batch_size": 4, **kwargs})


def test_memory_stays_within_a_few_shards_not_the_whole_set(photo_folder, tmp_path):
    """The records in flight are bounded by (prefetch + 1) shards plus the buffer, whatever the set size."""
    import tracemalloc

    pack(photo_folder, tmp_path / "small", shard_bytes=16_384)  # ~2 images per shard
    shards = open_shards(tmp_path / "small", "train")
    total = sum(shards.sizes)
    biggest_image = max(len(r.data) for i in range(len(shards)) for r in read_shard(shards[i], shards.names[i]))
    # prefetch 2 shards + 1 being parsed, buffer 4 images plus one shard's examples waiting, bookkeeping
    bound = 3 * max(shards.sizes) + (4 + 4) * biggest_image + 32_000
    assert bound < total / 3  # the set is much larger than the bound, or the test says nothing
    plan = epoch_plan(shards.examples, epoch=0, buffer=4)
    tracemalloc.start()
    try:
        n = sum(1 for _ in plan_records(shards, plan, prefetch=2))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == shards.total and peak < bound, (peak, bound, total)


def test_pax_and_long_names_are_read_by_the_standard_library(tmp_path, photo_jpeg):
    long_key = "k" * 120  # longer than a ustar name field: needs a pax header
    data = photo_jpeg(np.random.default_rng(0), 40, 40)
    with tarfile.open(tmp_path / "shard-000000.tar", "w", format=tarfile.PAX_FORMAT) as tf:
        for name, content in ((f"{long_key}.jpg", data), (f"{long_key}.cls", b"2")):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tf.addfile(info, io.BytesIO(content))
    shards = open_shards(tmp_path)
    (record,) = read_shard(shards[0], shards.names[0], expected=1)
    assert record.data == data and record.label == 2 and record.name.endswith(f"{long_key}.jpg")
    assert scan_shard(shards.paths[0], shards.names[0]) is None  # left to tarfile: the loader reads it whole
    (x, y), = list(ShardLoader(shards, batch_size=4, image_size=16, train=False, workers=1))
    assert y.tolist() == [2]


def _batch_pools(monkeypatch):
    import hasten.stream.shard_loader as sl

    made = []

    class Spy(sl.BatchPool):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(sl, "BatchPool", Spy)
    return made


@pytest.mark.parametrize("keep", ["batches", "views", "numpy"])
def test_batches_the_consumer_keeps_are_never_written_over(packed, monkeypatch, keep):
    """Workers write into reused buffers only once no batch, view or array of them is
    alive; here everything is kept, so every batch must still hold what it held."""
    made = _batch_pools(monkeypatch)
    loader = ShardLoader(open_shards(packed, "train"), batch_size=4, image_size=16, workers=2, seed=1)
    kept, copies = [], []
    for x, _ in loader:
        kept.append(x if keep == "batches" else x[:, :, 2:] if keep == "views" else x.numpy())
        copies.append(x.clone())
    assert len(kept) > made[0].cap  # more batches than the pool has buffers
    for a, b in zip(kept, copies):
        assert np.array_equal(np.asarray(a), np.asarray(b[:, :, 2:] if keep == "views" else b))
    assert made[0].unpooled > 0 and made[0].created == made[0].cap


def test_batches_the_consumer_lets_go_of_are_reused_with_the_same_pixels(packed, monkeypatch):
    made = _batch_pools(monkeypatch)
    reference = [x.clone() for x, _ in ShardLoader(open_shards(packed, "train"), batch_size=4, image_size=16, seed=1)]
    got = [x.clone() for x, _ in ShardLoader(open_shards(packed, "train"), batch_size=4, image_size=16, workers=2,
                                              seed=1)]
    assert all(torch.equal(a, b) for a, b in zip(reference, got)) and len(got) == len(reference)
    pool = made[-1]
    assert pool.reused > 0 and pool.unpooled == 0 and pool.created < len(got)


def test_a_buffer_handed_out_is_not_taken_again_until_its_views_are_gone():
    from hasten.stream.shared_buffers import BatchPool

    pool = BatchPool((4, 8, 8, 3), cap=1)
    first = pool.take()
    assert first is not None and pool.take() is None  # in flight: not free; the cap: no second one
    view = pool.arrived(3)  # the first chunk's; made while the buffer is still marked busy
    assert pool.arrived(0) is None  # (the second chunk had no buffer)
    assert view.shape == (3, 8, 8, 3) and pool.take() is None  # the consumer's view holds it
    del view
    assert pool.take() is first and pool.reused == 1 and pool.unpooled == 2


def test_a_shard_rewritten_in_place_after_its_first_read_is_not_read_at_stale_offsets(tmp_path, photo_jpeg):
    rng = np.random.default_rng(2)
    path = tmp_path / "shard-000000.tar"
    _write_shard(path, [m for i in range(2) for m in ((f"{i}.jpg", photo_jpeg(rng, 40, 50)), (f"{i}.cls", b"1"))])
    records = scan_shard(path, "s")
    assert read_member(records[0].where)  # now open, in the descriptor cache
    with open(path, "r+b") as f:  # same inode, same size, other bytes
        f.seek(records[1].where[1])
        f.write(b"\0" * 16)
    os.utime(path, ns=(10**18, 10**18))
    with pytest.raises(OSError, match="changed after it was scanned"):
        read_member(records[1].where)
