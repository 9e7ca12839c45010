"""The whole-epoch measurements of benchmarks/imagenet_pipeline.py: ``ShardLoader``'s resident
memory over epochs (in a fresh interpreter), and the local shard cache behind ``SlowStorage``
(epoch 1 from slow storage against epoch 2 from the cache)."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import threading
import time

import numpy as np

from hasten.cpu_time import descendants
from hasten.progress import progress
from hasten.stream.shard_cache import ShardCache
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.shard_store import ShardFiles
from hasten.stream.slow_storage import SlowStorage

from _common import memory_bytes


def _memory_mb(pid: int) -> tuple[float, float]:
    """(RSS of pid, PSS of pid and its descendants: the decode workers), MB."""
    return memory_bytes([pid])[1] / 2**20, memory_bytes([pid, *descendants(pid)])[0] / 2**20


def rss_over_epochs(shards: ShardFiles, workers: int, epochs: int, size: int) -> list[dict]:
    """Peak and mean memory per epoch while streaming whole epochs with ``ShardLoader``."""
    loader = ShardLoader(shards, batch_size=256, image_size=size, workers=workers, seed=1)
    out = []
    for epoch in range(epochs):
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                samples.append(_memory_mb(os.getpid()))
                stop.wait(0.25)

        thread = threading.Thread(target=sample, daemon=True)
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        thread.start()
        n = 0
        for x, _ in progress(loader, desc=f"memory, epoch {epoch + 1}", unit="batch"):
            n += len(x)
        stop.set()
        thread.join()
        rss, pss = np.array([s[0] for s in samples]), np.array([s[1] for s in samples])
        out.append({"epoch": epoch + 1, "images": n, "wall_s": round(time.perf_counter() - t0, 2),
                    "rss_mb_peak": round(float(rss.max()), 1), "rss_mb_mean": round(float(rss.mean()), 1),
                    "pss_mb_with_workers_peak": round(float(pss.max()), 1), "samples": len(samples)})
    return out


def _child(results, fn, args) -> None:
    results.put(fn(*args))


def in_fresh_process(fn, *args):
    """``fn(*args)`` in a new interpreter (spawn): its resident memory is a training
    process's (torch, hasten), not this one's, which has loaded every peer (DALI, OpenCV)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_child, args=(results, fn, args))  # not daemonic: it starts workers
    child.start()
    try:
        return results.get()
    finally:
        child.join()


def cache_epochs(shards: ShardFiles, n_shards: int, workers: int, size: int, latency_s: float,
                 bandwidth: float) -> dict:
    """Wall time of two epochs over the first ``n_shards`` shards behind SlowStorage + ShardCache."""
    subset = ShardFiles(shards.paths[:n_shards], shards.names[:n_shards], shards.examples[:n_shards],
                        shards.sizes[:n_shards], shards.classes)
    with tempfile.TemporaryDirectory(prefix="hasten-shard-cache-") as tmp:
        slow = SlowStorage(subset, latency_s=latency_s, bandwidth_bytes_per_s=bandwidth)
        cache = ShardCache(slow, tmp, max_bytes=sum(subset.sizes) + 1)
        loader = ShardLoader(cache, batch_size=256, image_size=size, workers=workers, seed=2)
        times = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            t0 = time.perf_counter()
            n = sum(len(x) for x, _ in loader)
            times.append(time.perf_counter() - t0)
        return {"shards": n_shards, "images_per_epoch": n, "bytes": sum(subset.sizes),
                "slow_storage": {"latency_s": latency_s, "bandwidth_bytes_per_s": bandwidth},
                "epoch_s": [round(t, 2) for t in times], "slow_reads": slow.reads, "cache_hits": cache.hits,
                "cache_epoch2_speedup": times[0] / times[1]}
