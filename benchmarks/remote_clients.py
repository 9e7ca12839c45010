"""Which client reads remote shards: obstore against fsspec (s3fs, and its HTTP filesystem on aiohttp).

The same objects (``--objects`` of ``--mib`` MiB of random bytes each, shard-sized),
served by the same local servers, started here as child processes from pip packages:
the moto S3 server (``moto[server]``) and RangeHTTPServer (``rangehttpserver``). Each
route reads every object once per repeat, in this process, and is measured in
wall seconds and CPU seconds of this process (``time.process_time``: every thread,
the clients' own runtimes included; the servers are other processes), as MB/s and
CPU seconds per GB. Routes:

- ``obstore whole``: one GET per object (``obstore.get``), one object at a time (S3 and HTTP);
- ``obstore ranged xC``: hasten's reader (``hasten.stream.remote_store.RemoteShards``):
  8 MiB ranged GETs, C at once;
- ``s3fs whole``: ``S3FileSystem.cat_file`` per object; ``s3fs ranged xC``: ``cat_ranges`` of
  the same 8 MiB ranges, C objects' ranges in one call (its event loop runs them at once);
- the same over HTTP (RangeHTTPServer): ``obstore`` (its HTTP store, through
  ``RemoteShards``) and ``fsspec http`` (``HTTPFileSystem`` on aiohttp).

Every byte read is compared with the object (a route that returns wrong bytes fails
the run). Routes run in a fresh shuffled order each repeat (``hasten.timing.interleaved``).
The servers are Python processes: on one machine they, not the clients, bound the
MB/s of every route, so CPU seconds per GB is the column that separates the clients.

    python benchmarks/remote_clients.py [--objects 8] [--mib 32] [--repeats 3] [--smoke]

Needs ``pip install -e '.[remote-bench]'``. Writes ``benchmarks/results/remote_clients.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hasten.rundir import write_json
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, hardware_label, mean_ci, paired_ratios, plus_minus

PACKAGES = ("obstore", "s3fs", "fsspec", "aiohttp", "aiobotocore", "moto", "rangehttpserver")
PART = 8 << 20
KEY, SECRET, REGION = "bench-key", "bench-secret", "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(argv: list[str], port: int, cwd: Path):
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server {' '.join(argv)} did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def ranges(size: int) -> list[tuple[int, int]]:
    return [(s, min(s + PART, size)) for s in range(0, size, PART)]


def routes(s3_url: str, http_url: str, size: int, concurrency: list[int]) -> dict:
    """name -> (read(name) -> bytes) for every route whose package is installed."""
    import obstore
    from obstore.store import from_url

    from hasten.stream.remote_store import RemoteShards

    out = {}
    store = from_url("s3://bench/data", client_options={"allow_http": True})
    out["s3 obstore whole"] = lambda n: bytes(obstore.get(store, n).bytes())
    plain = from_url(f"{http_url}/data", client_options={"allow_http": True})
    out["http obstore whole"] = lambda n: bytes(obstore.get(plain, n).bytes())

    for c in concurrency:
        for kind, url in (("s3", "s3://bench/data/"), ("http", f"{http_url}/data/")):
            reader = RemoteShards(url, "train", connections=c)
            index = {n: i for i, n in enumerate(reader.names)}
            out[f"{kind} obstore ranged x{c}"] = lambda n, r=reader, ix=index: r[ix[n]]
    try:
        import s3fs
    except ImportError:
        return out
    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=s3_url, client_kwargs={"region_name": REGION},
                           default_cache_type="none")
    out["s3 s3fs whole"] = lambda n: fs.cat_file(f"bench/data/{n}")
    for c in concurrency:
        out[f"s3 s3fs ranged x{c}"] = lambda n, c=c: b"".join(fs.cat_ranges(
            [f"bench/data/{n}"] * len(ranges(size)), *zip(*ranges(size)), batch_size=c))
    from fsspec.implementations.http import HTTPFileSystem

    web = HTTPFileSystem()
    out["http fsspec whole"] = lambda n: web.cat_file(f"{http_url}/data/{n}")
    for c in concurrency:
        out[f"http fsspec ranged x{c}"] = lambda n, c=c: b"".join(web.cat_ranges(
            [f"{http_url}/data/{n}"] * len(ranges(size)), *zip(*ranges(size)), batch_size=c))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=8, help="objects read per route and repeat")
    ap.add_argument("--mib", type=float, default=32.0, help="MiB per object (a shard)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", default="1,8", help="ranged GETs in flight, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="2 objects of 4 MiB, 1 repeat: checks the script runs")
    ap.add_argument("--out", type=Path, default=RESULTS / "remote_clients.json")
    args = ap.parse_args()
    if args.smoke:
        args.objects, args.mib, args.repeats = 2, 4.0, 1
    concurrency = [int(c) for c in args.concurrency.split(",")]
    size = int(args.mib * (1 << 20))
    rng = np.random.default_rng(args.seed)
    blobs = {f"shard-{i:06d}.tar": rng.integers(0, 256, size, dtype=np.uint8).tobytes() for i in range(args.objects)}
    names = sorted(blobs)
    os.environ.update({"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": REGION})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        index = {"format": 1, "classes": [], "splits": {"train": {"shards": [
            {"name": n, "examples": 1, "bytes": size} for n in names]}}}
        (root / "data").mkdir()
        for n in names:
            (root / "data" / n).write_bytes(blobs[n])
        (root / "data" / "index.json").write_text(json.dumps(index))
        s3_port, http_port = free_port(), free_port()
        moto = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)]
        ranged = [sys.executable, "-m", "RangeHTTPServer", str(http_port), "-b", "127.0.0.1"]
        with server(moto, s3_port, root) as s3, server(ranged, http_port, root) as web:
            os.environ["AWS_ENDPOINT_URL"] = s3
            import boto3

            client = boto3.client("s3", endpoint_url=s3, region_name=REGION)
            client.create_bucket(Bucket="bench")
            for p in sorted((root / "data").iterdir()):
                client.put_object(Bucket="bench", Key=f"data/{p.name}", Body=p.read_bytes())
            table = routes(s3, web, size, concurrency)
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in table}
            with MeasuredConditions("cpu", seconds=0.2 if args.smoke else 1.0) as cond:
                for read in table.values():  # warm-up: connections, imports, the servers' first answers
                    read(names[0])
                for repeat, name in interleaved(list(table), args.repeats, seed=args.seed):
                    read = table[name]
                    cpu0, t0 = time.process_time(), time.perf_counter()
                    for n in names:
                        if read(n) != blobs[n]:
                            raise SystemExit(f"{name}: wrong bytes for {n}")
                    samples[name].append((time.perf_counter() - t0, time.process_time() - cpu0))
    gb = args.objects * size / 1e9
    results = {}
    for name, runs in samples.items():
        results[name] = {"mb_per_s": mean_ci([gb * 1e3 / wall for wall, _ in runs]),
                         "cpu_s_per_gb": mean_ci([cpu / gb for _, cpu in runs])}
    # obstore's CPU per GB over the other client's, per repeat (both ran in the same repeat).
    pairs = {f"{kind} {how}": (f"{kind} obstore {how}", f"{kind} {other} {how}")
             for kind, other in (("s3", "s3fs"), ("http", "fsspec")) for how in ["whole"] +
             [f"ranged x{c}" for c in concurrency]}
    ratios = {name: mean_ci(paired_ratios(results[a]["cpu_s_per_gb"]["values"], results[b]["cpu_s_per_gb"]["values"]))
              for name, (a, b) in pairs.items() if a in results and b in results}
    versions = {}
    for p in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[p] = importlib.metadata.version(p)
    label = hardware_label(cond.as_dict()["environment"])
    print(f"{args.objects} objects of {args.mib:g} MiB, {args.repeats} repeat(s), {label}")
    print(f"{'route':<26} {'MB/s':>16} {'CPU s per GB':>16}")
    for name, r in sorted(results.items()):
        print(f"{name:<26} {plus_minus(r['mb_per_s']['mean'], r['mb_per_s']['ci95'], '.0f'):>16} "
              f"{plus_minus(r['cpu_s_per_gb']['mean'], r['cpu_s_per_gb']['ci95'], '.2f'):>16}")
    for name, r in ratios.items():
        print(f"CPU per GB, obstore / the other client, {name}: {plus_minus(r['mean'], r['ci95'], '.2f')}")
    print(cond.summary())
    write_json(args.out, {"command": " ".join(sys.argv), "objects": args.objects, "mib": args.mib,
                          "part_bytes": PART, "repeats": args.repeats, "concurrency": concurrency,
                          "results": results, "obstore_cpu_ratio": ratios, "versions": versions,
                          "conditions": cond.as_dict()})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
