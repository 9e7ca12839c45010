"""Remote shards over an emulated network: the store in one network namespace, the reader
in another, joined by rate-limited links (``hasten.harness.netns``: veth, a bridge, tc htb).
Every example arrives once in each of two epochs, the second from the reader's cache.

This kernel has no sch_netem, so the links have a rate but no added latency or loss;
faults are the proxy's business (tests/test_stream_remote_store.py, on loopback, always run).
Needs root and iproute2; skipped with the reason elsewhere."""

import json
import os
import subprocess
import sys

import pytest
from store_servers import REGION

from hasten.harness.netns import EmulatedCluster, probe
from hasten.stream.pack import pack

PREFIX = "hsr"  # not the harness tests' prefix: xdist may run both files at once


@pytest.fixture(scope="module")
def namespaces():
    # Probed here, not at import: every xdist worker imports this file, and probes made side by
    # side with one prefix would remove each other's namespaces.
    reason = probe(PREFIX)
    if reason is not None:
        pytest.skip(f"no network namespaces: {reason}")

READER = """
import json, socket, sys, time
from hasten.stream.remote_cache import open_remote_shards
from hasten.stream.retry import RetryPolicy
from hasten.stream.shard_loader import ShardLoader

url, cache, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
for _ in range(1200):  # the server in the other namespace may still be starting
    try:
        socket.create_connection((host, port), timeout=1).close()
        break
    except OSError:
        time.sleep(0.05)
store = open_remote_shards(url, retry=RetryPolicy(retries=20, first_s=0.05, max_s=0.5), cache_dir=cache)
loader = ShardLoader(store, batch_size=8, image_size=16, with_keys=True)
epochs = [[int(k) for _, _, keys in loader for k in keys] for _ in range(2)]
print(json.dumps({"epochs": epochs, "misses": store.misses, "hits": store.hits, "shards": len(store)}))
"""


@pytest.fixture(scope="module")
def packed(photo_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("netns") / "set"
    pack(photo_folder, out, shard_bytes=40_000)
    return out


def _in(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_every_example_once_per_epoch_across_a_shaped_link(kind, namespaces, packed, tmp_path):
    with EmulatedCluster(2, rate_gbit=0.05, prefix=PREFIX) as cluster:
        store_ns, reader_ns = cluster.placement[0].netns, cluster.placement[1].netns
        host, port = cluster.address(0), 8000
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": REGION,
               "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        if kind == "http":
            server = [sys.executable, "-m", "RangeHTTPServer", str(port), "-b", host]
            url = f"http://{host}:{port}/set/"
        else:
            server = [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)]
            url = "s3://shards/set/"
        proc = subprocess.Popen(_in(store_ns, server), cwd=packed.parent, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            if kind == "s3":  # filled from the store's side of the link, as a user uploads
                upload = ("import sys, time; sys.path.insert(0, sys.argv[1]); from store_servers import upload\n"
                          "for _ in range(600):\n"
                          "    try: upload(sys.argv[2], 'shards', 'set/', __import__('pathlib').Path(sys.argv[3]))"
                          "; break\n"
                          "    except Exception: time.sleep(0.1)\n")
                subprocess.run(_in(store_ns, [sys.executable, "-c", upload, os.path.dirname(__file__),
                                              f"http://{host}:{port}", str(packed)]), env=env, check=True,
                               timeout=120)
            reader = [sys.executable, "-c", READER, url, str(tmp_path / "cache"), host, str(port)]
            done = subprocess.run(_in(reader_ns, reader),
                                  env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
        finally:
            proc.kill()
            proc.wait()
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    for keys in out["epochs"]:
        assert sorted(keys) == list(range(54))
    assert out["epochs"][0] != out["epochs"][1]
    assert out["misses"] == out["shards"] == out["hits"]  # epoch 1 over the link, epoch 2 from the cache
