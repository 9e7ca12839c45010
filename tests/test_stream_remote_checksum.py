"""Each shard read from a store is checked against the SHA-256 that index.json gives: a copy
damaged on the store is read twice and then stops in one line; a body damaged on the way
once is read again and used; an index without checksums (an older pack) is read unchecked.
Real servers: RangeHTTPServer (ranged GETs, several parts per shard) and Python's
``http.server`` (one whole GET per shard), behind the fault proxy of ``store_servers``."""

import json
import shutil

import pytest
from store_servers import FaultProxy, plain_http, range_http

from hasten.errors import StoreError
from hasten.stream.pack import pack
from hasten.stream.remote_cache import open_remote_shards
from hasten.stream.remote_store import RemoteShards
from hasten.stream.retry import RetryPolicy
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.shard_store import open_shards

FAST = RetryPolicy(retries=2, first_s=0.01, max_s=0.02)
PART = 16_384  # several parts per shard, the last one short: the in-order hash crosses them
DAMAGED = 1  # the shard whose copy on the store differs from the packed one


@pytest.fixture(scope="module")
def root(photo_folder, tmp_path_factory):
    """set/ as packed; bad/ the same with one byte of shard DAMAGED changed; bare/ the same
    damage under an index without checksums (packed by an older hasten)."""
    root = tmp_path_factory.mktemp("checksum")
    pack(photo_folder, root / "set", shard_bytes=40_000)
    for copy in ("bad", "bare"):
        shutil.copytree(root / "set", root / copy)
        index = json.loads((root / copy / "index.json").read_text())
        path = root / copy / index["splits"]["train"]["shards"][DAMAGED]["name"]
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    index = json.loads((root / "bare" / "index.json").read_text())
    for shard in index["splits"]["train"]["shards"]:
        del shard["sha256"]
    (root / "bare" / "index.json").write_text(json.dumps(index))
    return root


@pytest.fixture(scope="module", params=["range", "plain"])
def server(request, root, tmp_path_factory):
    make = range_http if request.param == "range" else plain_http
    server = make(root, tmp_path_factory.mktemp("logs"))
    yield server
    server.kill()


@pytest.fixture
def proxy(server):
    proxy = FaultProxy(server.port)
    yield proxy
    proxy.close()


def test_a_copy_damaged_on_the_store_is_read_twice_then_stops_in_one_line(proxy, root):
    store = RemoteShards(f"{proxy.url}/bad/", retry=FAST, part_bytes=PART)
    local = open_shards(root / "set", "train")
    name = store.names[DAMAGED]
    with pytest.raises(StoreError) as e:
        store[DAMAGED]
    text = str(e.value)
    assert "\n" not in text and name in text and "SHA-256" in text and proxy.url in text
    assert store.checksum_mismatches == 2 and store.retries == 0
    gets = -(-store.sizes[DAMAGED] // PART) if store.ranges else 1
    assert proxy.count("forwarded", match=name) == 2 * gets
    for i in range(len(store)):  # every other shard reads, and is the packed one
        if i != DAMAGED:
            assert store[i] == local[i]
    assert store.checksum_mismatches == 2


def test_through_the_cache_the_damaged_shard_stops_the_loader_and_leaves_no_file(proxy, tmp_path):
    cache = open_remote_shards(f"{proxy.url}/bad/", retry=FAST, cache_dir=tmp_path, part_bytes=PART)
    assert cache.keeps_everything()  # the shard is streamed into its cache file (write_to)
    with pytest.raises(StoreError, match="SHA-256"):
        cache.shard_file(DAMAGED)
    assert not list(tmp_path.glob("*.tar")) and not list(tmp_path.glob(".*.tmp"))
    loader = ShardLoader(cache, batch_size=8, image_size=32, train=False)
    with pytest.raises(StoreError, match=cache.names[DAMAGED]):
        sum(len(y) for _, y in loader)


@pytest.mark.parametrize("whole", [True, False], ids=["read-whole", "into-the-cache-file"])
def test_a_body_damaged_on_the_way_once_is_read_again_and_used(proxy, root, tmp_path, whole):
    local = open_shards(root / "set", "train")
    cache = open_remote_shards(f"{proxy.url}/set/", retry=FAST, cache_dir=tmp_path, part_bytes=PART,
                               cache_bytes=0 if whole else None)
    name = cache.names[DAMAGED]
    proxy.inject("corrupt", name, times=1)
    if whole:
        assert cache[DAMAGED] == local[DAMAGED]
    else:
        assert cache.shard_file(DAMAGED).read_bytes() == local[DAMAGED]
    assert proxy.count("corrupt") == 1 and cache.store.checksum_mismatches == 1


def test_an_index_without_checksums_is_read_unchecked(proxy, root):
    store = RemoteShards(f"{proxy.url}/bare/", retry=FAST, part_bytes=PART)
    assert store.checksums[DAMAGED] is None
    assert store[DAMAGED] == (root / "bare" / store.names[DAMAGED]).read_bytes()
    assert store.checksum_mismatches == 0
