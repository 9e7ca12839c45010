"""One rank of benchmarks/stream_scale.py, run by torchrun (``stream_scale.py --worker``): it reads
the store through ``open_remote_shards`` with a ``ShardLoader``, all-reduces a reduction of each
batch (the collective a training step makes), checkpoints the loader's position, and writes a
``RECORD`` per batch followed by the batch's example numbers."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

# One record per batch, before its example numbers (int64 each).
RECORD = np.dtype([("epoch", "<i8"), ("position", "<i8"), ("n", "<i8"), ("rss", "<i8"), ("hits", "<i8"),
                   ("misses", "<i8"), ("evictions", "<i8"), ("bytes_read", "<i8"), ("cache_dir_bytes", "<i8"),
                   ("time_ns", "<i8")])


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def dir_bytes(path: Path) -> int:
    total = 0
    for entry in os.scandir(path):
        if entry.name.endswith(".tar"):
            try:
                total += entry.stat().st_size
            except OSError:
                pass  # evicted meanwhile
    return total


def write_atomic(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from hasten.stream.remote_cache import open_remote_shards
    from hasten.stream.shard_loader import ShardLoader

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    node, local = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"])
    work = Path(args.work)
    cache = open_remote_shards(args.url, cache_dir=work / f"cache-node{node}", cache_bytes=args.cache_bytes)
    loader = ShardLoader(cache, batch_size=args.batch, image_size=32, rank=rank, world_size=world, seed=args.seed,
                         crop="pad-crop", workers=args.workers, with_keys=True)
    lengths = [None] * world
    dist.all_gather_object(lengths, len(loader))
    if len(set(lengths)) != 1:
        raise SystemExit(f"ranks have {lengths} batches per epoch: the collective of each step needs the same number "
                         f"(choose --images a multiple of {world} x --batch)")
    checkpoint, first = work / "checkpoint.json", 0
    if checkpoint.exists():
        state = json.loads(checkpoint.read_text())
        loader.load_state_dict({"epoch": state["epoch"], "position": state["positions"][rank]})
        first = state["epoch"]

    def save() -> None:
        states = [None] * world
        dist.all_gather_object(states, loader.state_dict())
        if rank == 0:
            write_atomic(checkpoint, {"epoch": states[0]["epoch"], "positions": [s["position"] for s in states],
                                      "time": time.time()})
        dist.barrier()

    out = os.open(work / f"batches-a{args.attempt}-r{rank}.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    batches = 0
    for epoch in range(first, args.epochs):
        loader.set_epoch(epoch)
        for images, labels, keys in loader:
            step = torch.tensor([images.float().mean().item(), float(len(labels))])
            dist.all_reduce(step)  # what a data-parallel step synchronises on
            store = cache.store
            head = np.array([(epoch, loader.position, len(keys), rss_bytes(), cache.hits, cache.misses,
                              cache.evictions, store.bytes_read,
                              dir_bytes(cache.directory) if local == 0 else -1, time.time_ns())], RECORD)
            os.write(out, head.tobytes() + keys.numpy().astype("<i8").tobytes())
            batches += 1
            if batches % args.checkpoint_every == 0:
                save()
            if rank == 0:  # (each batch: the kill is timed from it)
                write_atomic(work / "progress.json", {"epoch": epoch, "position": loader.position,
                                                      "per_rank": loader.examples_per_rank(), "time": time.time()})
        save()  # at the epoch's end: (next epoch, position 0)
    os.close(out)
    dist.destroy_process_group()
