"""Shards read from a real S3-API server (moto) and a real web server with Range support
(RangeHTTPServer), through a proxy that injects faults: the same bytes as the local
shards, every fault retried, a shard that never succeeds named in one line, each
example once per epoch through faults, a resume and a restart of the store."""

import os
import time

import pytest
from store_servers import FaultProxy, moto_s3, range_http, s3_env, upload

from hasten.errors import StoreError
from hasten.stream.pack import pack
from hasten.stream.epoch_plan import epoch_plan, plan_records
from hasten.stream.remote_cache import open_remote_shards
from hasten.stream.remote_store import RemoteShards
from hasten.stream.retry import RetryPolicy
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.shard_store import open_shards
from hasten.stream.tar_members import read_member

FAST = RetryPolicy(retries=4, first_s=0.01, max_s=0.05)
KINDS = ("s3", "http")


@pytest.fixture(scope="module")
def packed(photo_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("remote") / "set"
    pack(photo_folder, out, shard_bytes=40_000)  # 54 training images in about a dozen shards
    return out


@pytest.fixture(scope="module")
def servers(packed, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    moto = moto_s3(logs)
    upload(moto.url, "shards", "set/", packed)
    web = range_http(packed.parent, logs)  # serves the folder holding set/
    yield {"s3": moto, "http": web}
    moto.kill()
    web.kill()


@pytest.fixture(params=KINDS)
def remote(request, servers, monkeypatch):
    """(URL, proxy, server) of the packed set behind a fault proxy, S3 or HTTP."""
    server = servers[request.param]
    proxy = FaultProxy(server.port)
    for name, value in s3_env(proxy.url).items():
        monkeypatch.setenv(name, value)
    url = "s3://shards/set/" if request.param == "s3" else f"{proxy.url}/set/"
    yield url, proxy, server
    proxy.close()


def shard_gets(proxy) -> int:
    return proxy.count(match=".tar")


def test_the_index_and_every_shard_are_the_local_ones(remote, packed):
    url, proxy, _ = remote
    local = open_shards(packed, "train")
    store = RemoteShards(url, "train", retry=FAST, part_bytes=16_384, connections=3)
    assert (store.names, store.examples, store.sizes, store.classes) == (
        local.names, local.examples, local.sizes, local.classes)
    assert len(store) == len(local) >= 8 and store.total == 54
    for i in range(len(store)):
        assert store[i] == local[i]
    parts = sum(-(-size // 16_384) for size in store.sizes)
    # One GET per part; one for the index, and for a web server one byte of it (does it answer Range?).
    assert shard_gets(proxy) == parts == store.requests - (1 if url.startswith("s3") else 2)
    assert store.ranges and store.retries == 0


@pytest.mark.parametrize("fault", ["reset", "500", "503", "429", "truncate", "stall"])
def test_each_fault_is_retried_and_the_bytes_are_right(remote, packed, fault):
    url, proxy, _ = remote
    local = open_shards(packed, "train")
    # A stall costs one timeout per try; every other fault is answered at once.
    store = RemoteShards(url, "train", retry=FAST, timeout_s=1.0 if fault == "stall" else 30.0)
    times = 1 if fault == "stall" else 2
    proxy.inject(fault, store.names[1], times=times)
    assert store[1] == local[1]
    assert proxy.count(fault) == times and store.retries >= times
    assert all(name == store.names[1] for name, _ in store.retried)


def test_a_shard_that_never_succeeds_is_one_line_naming_it_the_store_and_the_error(remote):
    url, proxy, _ = remote
    store = RemoteShards(url, "train", retry=RetryPolicy(retries=2, first_s=0.01, max_s=0.01))
    proxy.inject("503", store.names[2], times=10**6)
    with pytest.raises(StoreError) as e:
        store[2]
    text = str(e.value)
    assert "\n" not in text and store.names[2] in text and url in text and "503" in text
    assert "3 tries failed" in text and proxy.count("503") == 3


def test_mistakes_at_open_are_one_line_each(servers, monkeypatch, tmp_path):
    from store_servers import free_port

    moto = servers["s3"]
    for name, value in s3_env(moto.url).items():
        monkeypatch.setenv(name, value)

    def refused(url):
        with pytest.raises(StoreError) as e:
            RemoteShards(url, retry=FAST)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "the bucket 'missing-bucket' does not exist" in refused("s3://missing-bucket/set/")
    assert "no index.json at s3://shards/elsewhere/" in refused("s3://shards/elsewhere/")
    assert "no index.json at" in refused(f"{servers['http'].url}/elsewhere/")
    closed = f"http://127.0.0.1:{free_port()}"
    assert "3 tries failed (connection refused)" in refused(f"{closed}/set/")  # the index: 2 retries at most
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    assert "connection refused" in refused("s3://shards/set/")
    # No credentials anywhere: not in the environment, no ~/.aws, no metadata service.
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", closed)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    text = refused("s3://shards/set/")
    assert "no credentials" in text and "AWS_ACCESS_KEY_ID" in text


def test_credentials_from_a_profile_in_the_aws_files(servers, monkeypatch, tmp_path):
    """No key in the environment: boto3's chain finds the profile file, as the AWS tools do."""
    moto = servers["s3"]
    for name, value in s3_env(moto.url).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / "credentials").write_text("[training]\naws_access_key_id = profile-key\n"
                                          "aws_secret_access_key = profile-secret\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "training")
    assert RemoteShards("s3://shards/set/", retry=FAST).total == 54


def test_without_the_client_library_one_line_names_what_to_install(monkeypatch):
    """hasten is installed from its source folder, not the package index: the line names
    the client's own packages and the extra as docs/remote.md installs it."""
    import sys

    from hasten.errors import DataError

    monkeypatch.setitem(sys.modules, "obstore", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "obstore.store", None)
    with pytest.raises(DataError) as e:
        RemoteShards("s3://shards/set/")
    text = str(e.value)
    assert "\n" not in text and "pip install obstore boto3" in text and "pip install -e '.[remote]'" in text
    # The checkout's install first: hasten is not on the package index (issue 46).
    assert text.index("pip install -e '.[remote]'") < text.index("pip install obstore boto3")
    assert "hasten[remote]" not in text


# --- the loader over remote shards ---------------------------------------------------------------

def epoch_keys(loader) -> list[int]:
    return [int(k) for _, _, keys in loader for k in keys]


@pytest.mark.parametrize("workers", [0, 1])
def test_each_example_once_per_epoch_through_faults_and_epoch_two_from_the_cache(remote, tmp_path, workers):
    url, proxy, _ = remote
    cache = open_remote_shards(url, "train", retry=FAST, cache_dir=tmp_path / "cache", timeout_s=1.0)
    store = cache.store
    for fault, shard in zip(["reset", "503", "truncate", "500", "429", "stall"], store.names[::2]):
        proxy.inject(fault, shard)
    loader = ShardLoader(cache, batch_size=8, image_size=16, workers=workers, with_keys=True, prefetch=2)
    first = epoch_keys(loader)
    assert sorted(first) == list(range(54))  # each example exactly once, whatever was retried
    assert store.retries >= 6 and cache.misses == len(store)
    gets = shard_gets(proxy)
    second = epoch_keys(loader)
    assert sorted(second) == list(range(54)) and second != first  # a new order ...
    assert shard_gets(proxy) == gets and cache.hits == len(store)  # ... from the cache: no request
    # Memory: reads in progress never held more than the shards read ahead.
    assert 0 < store.peak_bytes <= loader.prefetch * max(store.sizes)
    assert store.bytes_read >= sum(store.sizes)  # every shard came whole (more where a body was cut)


def test_a_shard_is_streamed_into_its_cache_file_and_read_where_it_lies(remote, tmp_path):
    """With the whole split under the cap, every shard (epoch 1 too) reaches the loader as a
    scanned cache file: records carry where their image is in that file, not its bytes, and
    no more than the parts in flight were ever in memory (less than one shard)."""
    url, proxy, _ = remote
    cache = open_remote_shards(url, "train", retry=FAST, cache_dir=tmp_path / "cache", part_bytes=8192,
                               connections=2)
    store = cache.store
    proxy.inject("truncate", store.names[0], times=1)
    proxy.inject("reset", store.names[1], times=1)
    plan = epoch_plan(store.examples, epoch=0, seed=1)
    records = [r for _, r in plan_records(cache, plan, prefetch=2, lazy=True)]
    assert sorted(r.key for r in records) == list(range(54))
    files = {str(p) for p in (tmp_path / "cache").glob("*.tar")}
    assert len(files) == len(store) and not list((tmp_path / "cache").glob(".*"))  # no temporary left
    good = [r for r in records if r.reason is None]
    assert good and all(r.data is None and r.where[0] in files for r in good)
    assert all(read_member(r.where)[:2] == b"\xff\xd8" for r in good)  # JPEG bytes where they were said to be
    assert 0 < store.peak_bytes <= 2 * 8192 < max(store.sizes)
    assert cache.misses == len(store) and store.retries >= 2


def test_a_part_reaches_its_cache_file_in_chunks_never_whole_in_memory(remote, packed, tmp_path, monkeypatch):
    """Each part is written chunk by chunk as it arrives: with one part per shard and chunks
    far smaller, the bytes held at once stay under a shard, and a body cut short is retried."""
    import hasten.stream.remote_store as remote_store

    url, proxy, _ = remote
    monkeypatch.setattr(remote_store, "CHUNK_BYTES", 1024)
    store = RemoteShards(url, "train", retry=FAST, part_bytes=1 << 20, connections=1)
    local = open_shards(packed, "train")
    proxy.inject("truncate", store.names[0], times=1)
    for i in range(len(store)):
        with open(tmp_path / f"{i}.tar", "wb+") as f:
            store.write_to(i, f.fileno())
        assert (tmp_path / f"{i}.tar").read_bytes() == local[i]
    assert 0 < store.peak_bytes < min(store.sizes)
    assert store.requests - (1 if url.startswith("s3") else 2) == len(store) + 1 and store.retries == 1


def test_with_a_cap_below_the_split_shards_are_read_whole_and_still_once(remote, tmp_path):
    """A cache that may evict could remove a file whose images wait to be decoded: shards
    are then read whole (records carry their bytes), each example still once per epoch."""
    url, _, _ = remote
    cache = open_remote_shards(url, "train", retry=FAST, cache_dir=tmp_path / "small", cache_bytes=100_000)
    assert not cache.keeps_everything() and cache.shard_file(0) is None
    loader = ShardLoader(cache, batch_size=8, image_size=16, with_keys=True)
    for _ in range(2):
        assert sorted(epoch_keys(loader)) == list(range(54))
    assert cache.evictions > 0 and cache.nbytes <= 100_000
    records = [r for _, r in plan_records(cache, epoch_plan(cache.examples, epoch=0), lazy=True)]
    assert all(r.where is None for r in records) and any(r.data for r in records)


def test_a_shard_that_never_succeeds_through_the_cache_leaves_no_file(remote, tmp_path):
    url, proxy, _ = remote
    cache = open_remote_shards(url, "train", retry=RetryPolicy(retries=1, first_s=0.01, max_s=0.01),
                               cache_dir=tmp_path / "cache", part_bytes=8192)
    proxy.inject("503", cache.store.names[2], times=10**6)
    open_fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(StoreError, match=cache.store.names[2]):
        cache.shard_file(2)
    assert list((tmp_path / "cache").iterdir()) == []  # neither the shard nor a temporary
    # Parts still retrying when the first failed close their descriptors when they give up.
    for _ in range(200):
        if len(os.listdir("/proc/self/fd")) <= open_fds:
            break
        time.sleep(0.05)
    assert len(os.listdir("/proc/self/fd")) <= open_fds


def test_two_ranks_sharing_one_cache_split_each_epoch_exactly(remote, tmp_path):
    """Two ranks of one host, one cache directory: each example goes to one rank once per
    epoch; in epoch 2 the cache (filled by either rank) serves every shard."""
    url, proxy, _ = remote
    stores = [open_remote_shards(url, retry=FAST, cache_dir=tmp_path / "host-cache") for _ in range(2)]
    loaders = [ShardLoader(s, batch_size=5, image_size=16, with_keys=True, rank=r, world_size=2)
               for r, s in enumerate(stores)]
    for epoch in range(2):
        keys = [epoch_keys(loader) for loader in loaders]
        assert sorted(keys[0] + keys[1]) == list(range(54)) and not set(keys[0]) & set(keys[1])
        if epoch == 0:
            gets = shard_gets(proxy)
    assert shard_gets(proxy) == gets


def test_resume_mid_epoch_over_the_store_delivers_exactly_the_rest(remote, tmp_path):
    url, proxy, _ = remote
    a = ShardLoader(open_remote_shards(url, retry=FAST, cache_dir=tmp_path / "a"), batch_size=6, image_size=16,
                    with_keys=True, seed=3)
    a.set_epoch(1)
    batches = iter(a)
    done = [int(k) for _ in range(4) for k in next(batches)[2]]
    state = a.state_dict()
    assert state == {"epoch": 1, "position": 24}
    # Another process (a fresh cache: every shard from the store) with faults on the way.
    b = ShardLoader(open_remote_shards(url, retry=FAST, cache_dir=tmp_path / "b"), batch_size=6, image_size=16,
                    with_keys=True, seed=3)
    proxy.inject("reset", ".tar", times=3)
    proxy.inject("truncate", ".tar", times=2)
    b.load_state_dict(state)
    rest = epoch_keys(b)
    assert sorted(done + rest) == list(range(54)) and not set(done) & set(rest)
    assert proxy.count("reset") == 3 and proxy.count("truncate") == 2


def test_the_store_killed_and_restarted_mid_epoch_costs_nothing(remote, packed, tmp_path):
    """The server process is SIGKILLed after the first batch and started again once the
    reader has seen it fail: the reader waits, retries and delivers every example once.
    (S3: moto keeps its objects in memory, so the new process is filled and the proxy
    sent to it, as a load balancer does; the web server reads the same files again.)"""
    url, proxy, server = remote
    patient = RetryPolicy(retries=200, first_s=0.01, max_s=0.1)  # 10 s at least: ample for a restart
    store = RemoteShards(url, retry=patient)
    loader = ShardLoader(store, batch_size=6, image_size=16, with_keys=True, shuffle_buffer=6, prefetch=1)
    batches = iter(loader)
    keys = [int(k) for k in next(batches)[2]]
    assert len(store.retried) == 0
    gets = shard_gets(proxy)
    server.kill()
    import threading

    def restart():
        proxy.wait_for(lambda log: any(e.done == "down" for e in log))  # the reader hit the dead store
        if "s3" in url:
            from store_servers import moto_s3

            fresh = moto_s3(server.log.parent)
            upload(fresh.url, "shards", "set/", packed)
            server.proc, server.port = fresh.proc, fresh.port
            proxy.upstream_port = fresh.port
        else:
            server.start()

    restarter = threading.Thread(target=restart)
    restarter.start()
    try:
        keys += [int(k) for _, _, batch in batches for k in batch]
    finally:
        restarter.join()
    assert sorted(keys) == list(range(54))
    assert proxy.count("down") >= 1 and store.retries >= proxy.count("down")
    assert shard_gets(proxy) > gets  # shards were read after the restart
    assert all(reason in ("connection reset", "body cut short", "connection error")
               for _, reason in store.retried), store.retried
