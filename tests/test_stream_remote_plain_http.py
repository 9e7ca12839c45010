"""Shards from the web server most people start first, ``python -m http.server``, which
ignores Range headers (200 and the whole file to every GET): each shard read whole, once,
into the cache, its faults retried, the same examples as local shards; and the cache of a
set whose index gives its shards' SHA-256s found again when the server moves to a new
port, but never for a changed set."""

import json
import shutil

import pytest
from store_servers import FaultProxy, plain_http, range_http

from hasten.stream.pack import pack
from hasten.stream.remote_cache import open_remote_shards, remote_cache_dir
from hasten.stream.remote_store import RemoteShards
from hasten.stream.retry import RetryPolicy
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.shard_store import open_shards

FAST = RetryPolicy(retries=4, first_s=0.01, max_s=0.05)


@pytest.fixture(scope="module")
def packed(photo_folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("plain-http")
    pack(photo_folder, root / "set", shard_bytes=40_000)  # 54 training images in about a dozen shards
    # The same set without checksums in its index (as packed before hasten wrote them), and a
    # changed set: the same images in another order, so other bytes under the same names.
    shutil.copytree(root / "set", root / "unchecked")
    index = json.loads((root / "set" / "index.json").read_text())
    for split in index["splits"].values():
        for shard in split["shards"]:
            del shard["sha256"]
    (root / "unchecked" / "index.json").write_text(json.dumps(index))
    pack(photo_folder, root / "changed", shard_bytes=40_000, seed=1)
    return root


@pytest.fixture(scope="module")
def server(packed, tmp_path_factory):
    s = plain_http(packed, tmp_path_factory.mktemp("plain-http-logs"))
    yield s
    s.kill()


@pytest.fixture
def proxy(server):
    p = FaultProxy(server.port)
    yield p
    p.close()


def shard_gets(proxy, match=".tar") -> int:
    return proxy.count(match=match)


def test_the_server_ignores_range_and_each_shard_is_one_whole_get(proxy, packed):
    local = open_shards(packed / "set", "train")
    store = RemoteShards(f"{proxy.url}/set/", "train", retry=FAST, part_bytes=16_384)
    assert not store.ranges  # python -m http.server answered the probe with the whole index
    assert len(store) == len(local) >= 8
    for i in range(len(store)):
        assert store[i] == local[i]
    assert shard_gets(proxy) == len(store)  # 16 KiB parts would be several GETs per shard
    assert store.requests == len(store) + 2 and store.retries == 0  # + the index and the probe
    assert store.bytes_read == sum(store.sizes)


def test_a_server_with_range_support_is_read_in_parts(packed, tmp_path):
    web = range_http(packed, tmp_path)
    try:
        store = RemoteShards(f"{web.url}/set/", "train", retry=FAST, part_bytes=16_384)
        assert store.ranges
        assert store[0] == open_shards(packed / "set", "train")[0]
        assert store.requests == 2 + -(-store.sizes[0] // 16_384)
    finally:
        web.kill()


@pytest.mark.parametrize("fault", ["reset", "503", "truncate"])
def test_a_whole_get_that_fails_is_retried_from_the_start(proxy, packed, fault, tmp_path):
    local = open_shards(packed / "set", "train")
    store = RemoteShards(f"{proxy.url}/set/", "train", retry=FAST)
    proxy.inject(fault, store.names[1], times=2)
    assert store[1] == local[1]
    with open(tmp_path / "shard", "wb+") as f:  # the cache's path: written into a file, rewritten on a retry
        proxy.inject(fault, store.names[2], times=2)
        store.write_to(2, f.fileno())
    assert (tmp_path / "shard").read_bytes() == local[2]
    assert proxy.count(fault) == 4 and store.retries == 4


@pytest.mark.parametrize("cap", [None, 100_000])
def test_two_epochs_give_the_examples_of_local_shards_each_shard_one_get_per_read(proxy, packed, tmp_path, cap):
    """The whole split cached (cap None): each shard written into its cache file as it arrives,
    read from the server once in two epochs. A cap below the split: each shard read whole into
    memory (``store[i]``), one GET each time the cache does not hold it."""
    shards = open_remote_shards(f"{proxy.url}/set/", "train", retry=FAST, cache_dir=tmp_path / "cache",
                                cache_bytes=cap)
    assert shards.keeps_everything() == (cap is None)
    local = ShardLoader(open_shards(packed / "set", "train"), batch_size=8, image_size=16, workers=0, seed=3)
    remote = ShardLoader(shards, batch_size=8, image_size=16, workers=0, seed=3)
    for epoch in range(2):
        local.set_epoch(epoch)
        remote.set_epoch(epoch)
        got = [(x.tolist(), y.tolist()) for x, y in remote]
        assert got == [(x.tolist(), y.tolist()) for x, y in local]
    assert shard_gets(proxy) == shards.misses
    if cap is None:
        assert all(proxy.count("forwarded", name) == 1 for name in shards.names)
        assert shards.misses == len(shards) and shards.hits == len(shards)


def test_a_checksummed_set_keeps_its_cache_at_a_new_port_and_a_changed_set_does_not(server, packed, tmp_path,
                                                                                    monkeypatch):
    """The docs' program run twice: the server on a new port is a new URL, the same data."""
    monkeypatch.setenv("HASTEN_CACHE", str(tmp_path / "cache"))
    first, second = FaultProxy(server.port), FaultProxy(server.port)  # two ports, one server
    try:
        assert first.port != second.port
        a = open_remote_shards(f"{first.url}/set/", "train", retry=FAST)
        for i in range(len(a)):
            assert a.shard_file(i) is not None
        b = open_remote_shards(f"{second.url}/set/", "train", retry=FAST)
        assert b.directory == a.directory
        for i in range(len(b)):
            assert b.shard_file(i).read_bytes() == open_shards(packed / "set", "train")[i]
        assert shard_gets(second) == 0 and b.misses == 0  # nothing read from the server again
        changed = open_remote_shards(f"{second.url}/changed/", "train", retry=FAST)
        assert changed.names == a.names and changed.directory != a.directory
        assert changed[0] == open_shards(packed / "changed", "train")[0] != a[0]
        # Without checksums the index alone cannot name the data: its URL is part of the key.
        u1, u2 = (RemoteShards(f"{p.url}/unchecked/", "train", retry=FAST) for p in (first, second))
        assert remote_cache_dir(u1) != remote_cache_dir(u2) != a.directory
    finally:
        first.close()
        second.close()


def test_retries_are_said_while_they_happen_and_the_end_of_the_outage(proxy, packed, monkeypatch, capsys):
    """A store outage is not silent: a line when requests start failing, one when it answers."""
    monkeypatch.setenv("HASTEN_PROGRESS", "lines")
    monkeypatch.setenv("HASTEN_PROGRESS_INTERVAL", "0")
    store = RemoteShards(f"{proxy.url}/set/", "train", retry=FAST)
    capsys.readouterr()
    proxy.inject("reset", store.names[0], times=3)
    assert store[0] == open_shards(packed / "set", "train")[0]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4, lines  # the first failure, two more retries, the end of the outage
    assert lines[0].startswith(f"store {proxy.url}/set/: {store.names[0]}: connection reset; retrying, up to 4 ")
    assert "still retrying" in lines[1] and "3 retries in" in lines[2]
    assert "answers again after" in lines[3] and "(3 retries)" in lines[3]
    store[1]  # all is well: nothing more said
    assert capsys.readouterr().err == ""
