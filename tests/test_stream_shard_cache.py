import time

import numpy as np
import pytest

from hasten.stream.pack import pack
from hasten.stream.shard_cache import ShardCache
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.shard_store import open_shards
from hasten.stream.slow_storage import SlowStorage


@pytest.fixture(scope="module")
def packed(photo_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "set"
    pack(photo_folder, out, shard_bytes=40_000)
    return out


class Counting:
    """A store that counts its reads (the slow source)."""

    def __init__(self, store):
        self.store, self.reads = store, []
        self.names, self.examples, self.sizes = store.names, store.examples, store.sizes

    def __len__(self):
        return len(self.store)

    def __getitem__(self, i):
        self.reads.append(i)
        return self.store[i]


def test_second_pass_reads_nothing_from_the_source(packed, tmp_path):
    shards = open_shards(packed, "train")
    source = Counting(shards)
    cache = ShardCache(source, tmp_path / "c", max_bytes=10**9)
    first = [cache[i] for i in range(len(cache))]
    second = [cache[i] for i in range(len(cache))]
    assert source.reads == list(range(len(shards)))  # each shard fetched once
    assert first == second == [shards[i] for i in range(len(shards))]
    assert (cache.hits, cache.misses) == (len(shards), len(shards))
    # A new cache over the same directory (the next run, another rank) finds them too.
    again = ShardCache(Counting(shards), tmp_path / "c", max_bytes=10**9)
    assert again[0] == shards[0] and again.store.reads == []


def test_a_shard_another_rank_cached_after_this_cache_started_is_not_fetched_again(packed, tmp_path):
    shards = open_shards(packed, "train")
    rank0, rank1 = (ShardCache(Counting(shards), tmp_path / "host", max_bytes=10**9) for _ in range(2))
    assert rank0[3] == shards[3] and rank0.store.reads == [3]
    assert rank1[3] == shards[3] and rank1.store.reads == []  # written by rank 0 after rank 1 listed the folder
    assert rank1.nbytes == shards.sizes[3]  # and counted against rank 1's cap from then on


def test_size_cap_evicts_the_least_recently_used(packed, tmp_path):
    shards = open_shards(packed, "train")
    sizes = [len(shards[i]) for i in range(3)]
    source = Counting(shards)
    cache = ShardCache(source, tmp_path / "c", max_bytes=sizes[0] + sizes[1] + sizes[2] - 1)
    cache[0], cache[1]
    cache[0]  # 0 is now more recent than 1
    cache[2]  # does not fit with both: 1 goes
    assert cache.evictions == 1 and cache.nbytes == sizes[0] + sizes[2] <= cache.max_bytes
    source.reads.clear()
    cache[0], cache[2], cache[1]
    assert source.reads == [1]
    assert len(list((tmp_path / "c").glob("*.tar"))) == 2


def test_ranks_sharing_a_directory_keep_it_under_one_cap_least_recently_used_by_any_first(packed, tmp_path):
    shards = open_shards(packed, "train")
    sizes = shards.sizes
    cap = sizes[3] + sizes[4] + sizes[5]
    rank0, rank1 = (ShardCache(Counting(shards), tmp_path / "host", max_bytes=cap) for _ in range(2))
    cache_file = rank0._file

    def held():
        return {p.name for p in (tmp_path / "host").glob("*.tar")}

    rank0[0], rank0[1], rank0[2]
    rank1[0]  # rank 1 uses rank 0's copy of shard 0: now the most recent use of the three
    rank1[3]
    rank1[4]
    assert sum((tmp_path / "host" / f).stat().st_size for f in held()) <= cap
    assert cache_file(0) in held() and cache_file(1) not in held()  # 1 and 2 were used least recently
    rank1[5]
    assert held() == {cache_file(3), cache_file(4), cache_file(5)}


def test_a_shard_larger_than_the_cap_is_passed_through(packed, tmp_path):
    shards = open_shards(packed, "train")
    cache = ShardCache(shards, tmp_path / "c", max_bytes=100)
    assert cache[0] == shards[0] and cache.nbytes == 0 and not list((tmp_path / "c").glob("*.tar"))


def test_a_damaged_cached_copy_is_fetched_again(packed, tmp_path):
    shards = open_shards(packed, "train")
    source = Counting(shards)
    cache = ShardCache(source, tmp_path / "c", max_bytes=10**9)
    cache[0]
    (path,) = (tmp_path / "c").glob("*.tar")
    path.write_bytes(path.read_bytes()[:1000])  # cut short, e.g. by a full disk
    assert cache[0] == shards[0] and source.reads == [0, 0]


def test_loader_behind_slow_storage_and_cache_reads_slowly_once(packed, tmp_path):
    shards = open_shards(packed, "train")
    slow = SlowStorage(shards, latency_s=0.001)
    cache = ShardCache(slow, tmp_path / "c", max_bytes=10**9)
    plain = ShardLoader(shards, batch_size=6, image_size=16, seed=1, with_keys=True)
    cached = ShardLoader(cache, batch_size=6, image_size=16, seed=1, with_keys=True)
    for epoch in range(2):
        plain.set_epoch(epoch)
        cached.set_epoch(epoch)
        for a, b in zip(plain, cached, strict=True):
            assert all(np.array_equal(u.numpy(), v.numpy()) for u, v in zip(a, b))
    assert slow.reads == len(shards)  # epoch 2 came from the local copies
    assert cache.hits == len(shards)


def test_shard_file_fetches_once_and_keeps_a_copy_another_rank_placed(packed, tmp_path):
    shards = open_shards(packed, "train")
    rank0, rank1 = (ShardCache(Counting(shards), tmp_path / "host", max_bytes=sum(shards.sizes)) for _ in range(2))
    path = rank0.shard_file(4)
    assert path.read_bytes() == shards[4] and rank0.store.reads == [4] and rank0.misses == 1
    inode = path.stat().st_ino
    assert rank1.shard_file(4) == path and rank1.store.reads == [] and rank1.hits == 1
    # Both missed at once: the later copy does not replace the one in place (its offsets may be in use).
    late = ShardCache(Counting(shards), tmp_path / "host", max_bytes=sum(shards.sizes))
    late._place(late._file(4), _copy(shards[4], tmp_path / "late.tmp"), shards.sizes[4])
    assert path.stat().st_ino == inode
    # A damaged copy (wrong size) is fetched again and replaced.
    path.write_bytes(shards[4][:1024])
    assert rank1.shard_file(4).read_bytes() == shards[4] and rank1.store.reads == [4]


def _copy(data: bytes, path):
    path.write_bytes(data)
    return path


def test_another_ranks_use_of_a_cached_shard_leaves_this_ranks_scanned_images_readable(packed, tmp_path):
    """A hit marks the file used for the other processes sharing the directory; that must not
    make the shard look rewritten to a rank whose workers still read images from it."""
    from hasten.stream.epoch_plan import epoch_plan, plan_records
    from hasten.stream.tar_members import read_member

    shards = open_shards(packed, "train")
    rank0, rank1 = (ShardCache(shards, tmp_path / "host", max_bytes=sum(shards.sizes)) for _ in range(2))
    records = [r for _, r in plan_records(rank0, epoch_plan(rank0.examples, epoch=0), lazy=True)
               if r.reason is None]
    time.sleep(0.01)  # (a clock that moved on: a new time would differ from the scanned one)
    for i in range(len(shards)):
        assert rank1.shard_file(i) is not None and rank1.hits == i + 1  # each use marks the file
    assert all(read_member(r.where) for r in records)


def test_shard_file_only_when_nothing_can_be_evicted(packed, tmp_path):
    shards = open_shards(packed, "train")
    small = ShardCache(Counting(shards), tmp_path / "a", max_bytes=sum(shards.sizes) - 1)
    assert small.shard_file(0) is None and small.store.reads == []  # cache[i] (whole bytes) then
    unknown = ShardCache(Counting(open_shards(shards.paths)), tmp_path / "b", max_bytes=10**9)
    assert unknown.shard_file(0) is None  # no index: the split's size is not known


def test_loader_over_a_cache_that_keeps_everything_scans_its_files(packed, tmp_path):
    """Behind a cache that holds the split, the loader reads cached shards as local ones
    (the images' places in the cache files) and gives the batches the local shards give."""
    shards = open_shards(packed, "train")
    slow = SlowStorage(shards, latency_s=0.001)
    cache = ShardCache(slow, tmp_path / "c", max_bytes=sum(shards.sizes))
    from hasten.stream.epoch_plan import epoch_plan, plan_records

    records = [r for _, r in plan_records(cache, epoch_plan(cache.examples, epoch=0), lazy=True)]
    assert all(r.data is None and r.where[0].startswith(str(tmp_path / "c")) for r in records if r.reason is None)
    plain = ShardLoader(shards, batch_size=6, image_size=16, seed=2, with_keys=True, workers=1)
    cached = ShardLoader(cache, batch_size=6, image_size=16, seed=2, with_keys=True, workers=1)
    for a, b in zip(plain, cached, strict=True):
        assert all(np.array_equal(u.numpy(), v.numpy()) for u, v in zip(a, b))
    assert slow.reads == len(shards)


def test_rejects_a_bad_cap(tmp_path):
    with pytest.raises(ValueError, match="max_bytes"):
        ShardCache([], tmp_path, max_bytes=-1)
