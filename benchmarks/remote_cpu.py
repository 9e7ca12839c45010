"""Where the remote reader's CPU goes per GB, and what fraction of a link two cores can feed.

The link is not the limit here: ``--objects`` shard-sized objects of random bytes are
served over loopback by RangeHTTPServer (a child process, started here from its pip
package), and hasten's reader (``hasten.stream.remote_store.RemoteShards``: 8 MiB ranged
GETs, 8 in flight) reads each of them once per route and repeat. CPU seconds, never wall
seconds (robust to other jobs on the machine), per GB of shard bytes, of:

- the reader: this process, every thread (obstore's Rust runtime too), user and system
  apart (``os.times``);
- the store: the server process (``hasten.cpu_time.pid_cpu_s``);
- the kernel's own threads (parent 2: writeback, ``ksoftirqd``, ...), machine-wide: other
  jobs' share is in it too, so it is an upper bound (a thread that ends within a reading is
  missed). Softirq time spent on a process's own time slice is in that process's system time.

Routes, each the whole set once:

- ``receive, get_range``: the parts into memory as ``obstore.get_range`` returns them (one
  buffer per 8 MiB part), nothing else: the client and the kernel's receive;
- ``receive, streamed``: the same bodies as a stream of 1 MiB chunks, nothing else;
- ``cache write, get_range + pwrite``: each part whole in memory, then written into the
  shard's cache file (hasten's path before the streamed one);
- ``cache write, write_to``: ``RemoteShards.write_to``, each chunk written at its offset as
  it arrives (the path ``ShardCache.shard_file`` takes when the cache holds the split);
- ``sha256, second pass``: the written file read back (page cache, a reused buffer) and
  hashed: what a verification after the write costs;
- ``worker reads``: the file read as decode workers read it, one ``pread`` per image of
  ``--image-kb``: the same in epoch 1 and from the cache, so part of the local decode's CPU.

The bound: with ``--decode-cpu-s-per-gb`` (default: hasten's local epoch in
``results/remote_shards.json``, CPU seconds per GB of JPEGs read, decoded, cropped and
batched) plus the reader's remote share (``cache write, write_to``) and the store's, the
bytes per second ``--cores`` cores sustain, as a fraction of ``--link-gbit``.

    python benchmarks/remote_cpu.py [--objects 8] [--mib 64] [--repeats 3] [--smoke]

Needs ``pip install -e '.[remote-bench]'``. Writes ``benchmarks/results/remote_cpu.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from concurrent.futures import wait
from pathlib import Path

import numpy as np

from hasten.cpu_time import PPID, descendants, pid_cpu_s, pid_stat
from hasten.rundir import write_json
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, hardware_label, mean_ci, plus_minus
from remote_clients import free_port, server

CHUNK = 1 << 20


def kernel_threads_cpu_s() -> dict[int, float]:
    """User + system seconds of each of the kernel's threads (children of kthreadd, pid 2)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := pid_stat(int(name))) is not None and fields[PPID] == b"2":
            out[int(name)] = pid_cpu_s(int(name)) or 0.0
    return out


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two readings of ``kernel_threads_cpu_s``: of the threads alive at the
    second (workers come and go; one that ended between them is missed)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def routes(reader, work: Path, image_bytes: int) -> dict:
    """name -> read(i): one pass of shard i."""
    import obstore

    def parts(i):
        size = reader.sizes[i]
        return [(s, min(s + reader.part_bytes, size)) for s in range(0, size, reader.part_bytes)]

    def fresh(i) -> int:
        path = work / f"{i}.tar"
        path.unlink(missing_ok=True)  # a new file each time, as a cold cache makes
        return os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)

    def get_range(i):
        wait([reader._pool.submit(reader._part, reader.names[i], s, e) for s, e in parts(i)])

    def streamed(i):
        def one(s, e):
            for _ in obstore.get(reader._client, reader.names[i], options={"range": (s, e)}).stream(
                    min_chunk_size=CHUNK):
                pass
        for f in [reader._pool.submit(one, s, e) for s, e in parts(i)]:
            f.result()

    def get_range_pwrite(i):
        fd = fresh(i)

        def one(s, e):
            view, done = memoryview(reader._part(reader.names[i], s, e)), 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], s + done)
        try:
            for f in [reader._pool.submit(one, s, e) for s, e in parts(i)]:
                f.result()
        finally:
            os.close(fd)

    def write_to(i):
        fd = fresh(i)
        try:
            reader.write_to(i, fd)
        finally:
            os.close(fd)

    buffer = bytearray(CHUNK)

    def sha256(i):
        digest, view = hashlib.sha256(), memoryview(buffer)
        with open(work / f"{i}.tar", "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                digest.update(view[:n])

    image = bytearray(image_bytes)

    def worker_reads(i):
        fd, size = os.open(work / f"{i}.tar", os.O_RDONLY), reader.sizes[i]
        try:
            for at in range(0, size, image_bytes):
                os.preadv(fd, [image], at)
        finally:
            os.close(fd)

    return {"receive, get_range": get_range, "receive, streamed": streamed,
            "cache write, get_range + pwrite": get_range_pwrite, "cache write, write_to": write_to,
            "sha256, second pass": sha256, "worker reads": worker_reads}


# Routes that read the cache file the previous write left (run right after a write).
AFTER_WRITE = ("sha256, second pass", "worker reads")


def local_decode_cpu_s_per_gb() -> float | None:
    """hasten's local epochs in results/remote_shards.json: reader CPU seconds per GB of shards."""
    try:
        runs = json.loads((RESULTS / "remote_shards.json").read_text())["runs"]
        set_bytes = max(e["link_bytes"] for rep in runs["hasten @ 1 Gbit/s"] for e in rep)
        cpu = [e["cpu_s"] for rep in runs["hasten local"] for e in rep]
    except (OSError, KeyError, ValueError):
        return None
    return float(np.mean(cpu)) / (set_bytes / 1e9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=8, help="objects (shards) read per route and repeat")
    ap.add_argument("--mib", type=float, default=64.0, help="MiB per object (hasten data pack's shard size)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--image-kb", type=float, default=96.5, help="bytes per image for the worker reads "
                    "(the ImageNet-like set's mean)")
    ap.add_argument("--decode-cpu-s-per-gb", type=float, default=None,
                    help="the reader's local CPU per GB (default: from results/remote_shards.json)")
    ap.add_argument("--cores", type=float, default=2.0)
    ap.add_argument("--link-gbit", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="2 objects of 4 MiB, 1 repeat: checks the script runs")
    ap.add_argument("--out", type=Path, default=RESULTS / "remote_cpu.json")
    args = ap.parse_args()
    if args.smoke:
        args.objects, args.mib, args.repeats = 2, 4.0, 1
    from hasten.stream.remote_store import RemoteShards

    size = int(args.mib * (1 << 20))
    rng = np.random.default_rng(args.seed)
    samples: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root, work = Path(tmp) / "data", Path(tmp) / "cache"
        root.mkdir()
        work.mkdir()
        names = [f"shard-{i:06d}.tar" for i in range(args.objects)]
        for n in names:
            (root / n).write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        (root / "index.json").write_text(json.dumps({"format": 1, "classes": [], "splits": {"train": {
            "shards": [{"name": n, "examples": 1, "bytes": size} for n in names]}}}))
        port = free_port()
        argv = [sys.executable, "-m", "RangeHTTPServer", str(port), "-b", "127.0.0.1"]
        with server(argv, port, root) as url, MeasuredConditions("cpu", seconds=0.2 if args.smoke else 1.0) as cond:
            (pid,) = descendants(os.getpid())  # the server
            reader = RemoteShards(f"{url}/", "train")
            table = routes(reader, work, int(args.image_kb * 1000))
            samples = {name: [] for name in table}
            for name in ("cache write, write_to", *table):  # warm-up: connections, the server's first answers
                table[name](0)
            if (work / "0.tar").read_bytes() != (root / names[0]).read_bytes():
                raise SystemExit("write_to: the cache file differs from the object")
            order = [name for name in table if name not in AFTER_WRITE]
            for _, name in interleaved(order, args.repeats, seed=args.seed):
                for step in (name, *AFTER_WRITE) if name == "cache write, write_to" else (name,):
                    t0, s0, k0 = os.times(), pid_cpu_s(pid), kernel_threads_cpu_s()
                    for i in range(args.objects):
                        table[step](i)
                    t1, s1, k1 = os.times(), pid_cpu_s(pid), kernel_threads_cpu_s()
                    samples[step].append({"user_s": t1.user - t0.user, "system_s": t1.system - t0.system,
                                          "store_s": s1 - s0, "kernel_threads_s": spent(k0, k1)})
            reader.close()
    gb = args.objects * size / 1e9
    results = {name: {key: mean_ci([r[key] / gb for r in runs]) for key in runs[0]} for name, runs in samples.items()}
    for r in results.values():
        r["reader_s"] = mean_ci([u + s for u, s in zip(r["user_s"]["values"], r["system_s"]["values"])])
    decode = args.decode_cpu_s_per_gb or local_decode_cpu_s_per_gb()
    link_gb_s = args.link_gbit / 8
    bound = None
    if decode is not None:
        remote = results["cache write, write_to"]
        per_gb = decode + remote["reader_s"]["mean"] + remote["store_s"]["mean"]
        bound = {"decode_cpu_s_per_gb": decode, "remote_reader_cpu_s_per_gb": remote["reader_s"]["mean"],
                 "store_cpu_s_per_gb": remote["store_s"]["mean"], "total_cpu_s_per_gb": per_gb,
                 "sustained_gb_per_s": args.cores / per_gb, "of_link": args.cores / per_gb / link_gb_s,
                 "cores": args.cores, "link_gbit": args.link_gbit}
    label = hardware_label(cond.as_dict()["environment"])
    print(f"{args.objects} objects of {args.mib:g} MiB over loopback (RangeHTTPServer), {args.repeats} repeat(s), {label}")
    print(f"{'route':<34} {'reader user':>12} {'reader sys':>12} {'store':>10} {'kernel thr.':>12}   CPU s per GB")
    for name, r in results.items():
        print(f"{name:<34} " + " ".join(f"{plus_minus(r[k]['mean'], r[k]['ci95'], '.2f'):>12}"
                                        for k in ("user_s", "system_s", "store_s", "kernel_threads_s")))
    if bound is not None:
        print(f"bound: decode {decode:.2f} + reader's remote share {bound['remote_reader_cpu_s_per_gb']:.2f} + "
              f"store {bound['store_cpu_s_per_gb']:.2f} = {bound['total_cpu_s_per_gb']:.2f} CPU s per GB: "
              f"{args.cores:g} cores sustain {bound['sustained_gb_per_s'] * 8:.2f} Gbit/s, "
              f"{bound['of_link']:.2f} of {args.link_gbit:g} Gbit/s (the kernel's network stack not counted)")
    print(cond.summary())
    write_json(args.out, {"command": " ".join(sys.argv), "objects": args.objects, "mib": args.mib,
                          "part_bytes": reader.part_bytes, "connections": reader.connections, "chunk": CHUNK,
                          "repeats": args.repeats, "results": results, "bound": bound, "conditions": cond.as_dict()})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
