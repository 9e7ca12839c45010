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


def test_rejects_a_bad_cap(tmp_path):
    with pytest.raises(ValueError, match="max_bytes"):
        ShardCache([], tmp_path, max_bytes=-1)
