"""Streaming at scale: 100k+ images in ~1,000 shards, two nodes of 2 ranks, caches smaller than the data, a node lost.

Issue 46's scale check. What it measures is correctness, memory and the cache, not speed:

- the data: ``--images`` synthetic 32x32 JPEGs of varied content (gradient, a shape, noise,
  quality 60-95; deterministic in ``--seed``), ``--classes`` classes, packed by hasten's own
  packer (``hasten.stream.pack``) into about ``--shards`` tar shards with their index;
- the store: RangeHTTPServer (``pip install rangehttpserver``: Python's threaded static file
  server with Range support) serving the packed directory from its own network namespace;
- two emulated nodes: one network namespace each (``hasten.harness.netns``: veth pairs into a
  bridge, tc htb at ``--rate-gbit``), each running ``torchrun --nnodes 2 --nproc-per-node 2``
  (gloo, static rendezvous on node A); every rank reads the store through
  ``open_remote_shards`` with a ``ShardLoader`` (its share of each epoch, ``pad-crop`` crops
  of 32 px) and all-reduces a reduction of each batch, the collective a training step makes;
  the two ranks of a node share one cache directory capped at ``--cache-fraction`` of the split
  (shards are then read whole and the least recently used evicted);
- a node lost: in epoch ``--kill-epoch``, past ``--kill-at`` of it, node B's torchrun and its
  ranks get SIGKILL; node A's ranks stop at their next collective; both nodes are launched
  again and every rank resumes from the newest checkpoint (each rank's ``ShardLoader``
  position, written by rank 0 every ``--checkpoint-every`` batches and at each epoch's end).

Every rank writes, per batch, the example numbers it delivered with its epoch, position,
resident set, cache counters (hits, misses, evictions, bytes fetched) and, on each node's first
rank, the bytes in the node's cache directory. From these: per epoch, every example counted
across the 4 ranks (duplicates and missing ones; in the epoch of the kill, batches after the
checkpoint resumed from are delivered again, counted as repeats: at-least-once delivery,
exactly once up to the checkpoint, which is what a resumed training run trains on), each
node's hit rate, evictions and bytes fetched, the cache directory's largest size against its
cap, and each rank's resident set over the batches (flat: the slope over a run's later half).

    python benchmarks/stream_scale.py [--images 102400] [--shards 1000] [--cache-fraction 0.4]
        [--epochs 3] [--kill-epoch 2] [--workers 0] [--smoke] [--loopback] [--summarize]

``--loopback`` runs the nodes without namespaces (all on 127.0.0.1; no root needed: the smoke
test). Needs root and iproute2 otherwise. The data and the run's state are kept in
``$HASTEN_CACHE/stream_scale/``: a stopped run started again with the same command resumes
(from its newest checkpoint, as the killed node does); ``--summarize`` writes the results of the
records so far without running anything. Writes ``benchmarks/results/stream_scale.json``
and its raw per-batch records ``stream_scale.runs.jsonl.gz`` (``--out``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

from _common import RESULTS, MeasuredConditions, hardware_label, load_results, write_results

PREFIX = "hss"  # this benchmark's namespaces (the tests and other benchmarks use others)
HTTP_PORT = 8000
# One record per batch, before its example numbers (int64 each).
RECORD = np.dtype([("epoch", "<i8"), ("position", "<i8"), ("n", "<i8"), ("rss", "<i8"), ("hits", "<i8"),
                   ("misses", "<i8"), ("evictions", "<i8"), ("bytes_read", "<i8"), ("cache_dir_bytes", "<i8"),
                   ("time_ns", "<i8")])
COUNTERS = ("hits", "misses", "evictions", "bytes_read")


# --- the data ------------------------------------------------------------------------------------

def synthetic_jpeg(rng: np.random.Generator, label: int, classes: int, side: int = 32) -> bytes:
    """A varied small JPEG: a two-colour gradient at a random angle, a rectangle whose colour
    follows the class, noise of a random strength, a random quality."""
    from PIL import Image

    yy, xx = np.mgrid[0:side, 0:side] / (side - 1)
    angle = rng.uniform(0, 2 * np.pi)
    t = (np.cos(angle) * xx + np.sin(angle) * yy)[..., None]
    a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    image = (1 - t) * a + t * b
    x0, y0 = rng.integers(0, side - 8, 2)
    w, h = rng.integers(6, side // 2, 2)
    hue = np.array([np.sin(2 * np.pi * (label / classes + k / 3)) for k in range(3)]) * 110 + 128
    image[y0:y0 + h, x0:x0 + w] = hue
    image += rng.normal(0, rng.uniform(0, 20), image.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=int(rng.integers(60, 96)))
    return out.getvalue()


def member_bytes(n: int) -> int:
    """Bytes a file of ``n`` bytes takes in a tar: a header block and its data rounded up to blocks."""
    return 512 + -(-n // 512) * 512


def make_data(root: Path, images: int, classes: int, shards: int, seed: int) -> Path:
    """The packed directory (made once, kept under ``root``): ``images`` training JPEGs (and
    one test image per class: the packer wants both splits) in about ``shards`` shards."""
    from hasten.stream.pack import pack

    packed = root / f"synthetic-{images}-{classes}-{shards}-{seed}" / "shards"
    if (packed / "index.json").exists():
        return packed
    # The JPEGs only live until they are packed: in memory where there is a tmpfs (a disk mounted
    # with discard took 15 min to delete 100k small files).
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="stream-scale-images-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                   else root))
    shutil.rmtree(packed, ignore_errors=True)
    used = 0
    try:
        for split, count in (("train", images), ("test", classes)):
            for c in range(classes):
                (folder / split / f"c{c:03d}").mkdir(parents=True)
            for i in range(count):
                label = i % classes
                data = synthetic_jpeg(np.random.default_rng([seed, split == "test", i]), label, classes)
                (folder / split / f"c{label:03d}" / f"{i:07d}.jpg").write_bytes(data)
                if split == "train":
                    used += member_bytes(len(data)) + member_bytes(len(str(label)))
            print(f"made {count} {split} images", file=sys.stderr, flush=True)
        pack(folder, packed, shard_bytes=used // shards + 1024, seed=seed)  # +1024: the tar's end blocks
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return packed


# --- one rank (run by torchrun) ------------------------------------------------------------------

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


# --- what the records say ------------------------------------------------------------------------

def read_batches(path: Path) -> list[tuple[dict, np.ndarray]]:
    """(record, example numbers) of each batch in a rank's file; a last batch cut short by a
    kill is left out."""
    raw, out, at = path.read_bytes(), [], 0
    while at + RECORD.itemsize <= len(raw):
        head = np.frombuffer(raw, RECORD, 1, at)[0]
        end = at + RECORD.itemsize + 8 * int(head["n"])
        if end > len(raw):
            break
        out.append(({k: int(head[k]) for k in RECORD.names}, np.frombuffer(raw, "<i8", int(head["n"]),
                                                                           at + RECORD.itemsize)))
        at = end
    return out


def kept(record: dict, rank: int, cut: dict | None) -> bool:
    """Whether a batch counts for its epoch: delivered at or before the checkpoint the next
    attempt resumed from (``cut``; None: the attempt was not followed by a resume)."""
    if cut is None:
        return True
    return record["epoch"] < cut["epoch"] or (record["epoch"] == cut["epoch"]
                                              and record["position"] <= cut["positions"][rank])


def tally(examples: int, runs: list[dict], cuts: dict[int, dict]) -> dict[int, dict]:
    """Per epoch: examples delivered, kept (``kept``), delivered again after a resume (repeats),
    and among the kept ones the duplicates and the missing. ``runs``: {"attempt", "rank",
    "batches": read_batches(...)}; ``cuts``: attempt -> the checkpoint the next one resumed from."""
    by_epoch: dict[int, dict] = {}
    for run in runs:
        cut = cuts.get(run["attempt"])
        for record, keys in run["batches"]:
            e = by_epoch.setdefault(record["epoch"], {"kept": [], "delivered": 0, "repeats": 0})
            e["delivered"] += len(keys)
            if kept(record, run["rank"], cut):
                e["kept"].append(keys)
            else:
                e["repeats"] += len(keys)
    out = {}
    for epoch, e in sorted(by_epoch.items()):
        keys = np.concatenate(e["kept"]) if e["kept"] else np.zeros(0, np.int64)
        if len(keys) and (keys.min() < 0 or keys.max() >= examples):
            raise ValueError(f"epoch {epoch}: example numbers outside 0..{examples - 1}")
        counts = np.bincount(keys, minlength=examples)
        out[epoch] = {"delivered": e["delivered"], "kept": int(len(keys)), "repeats": e["repeats"],
                      "duplicates": int(np.maximum(counts - 1, 0).sum()), "missing": int((counts == 0).sum())}
    return out


def node_cache(runs: list[dict], nodes: dict[int, int]) -> dict[int, dict]:
    """Per epoch and node: the cache's hits, misses, evictions and bytes fetched (each run's
    counters start at 0 with its process; a batch's change is charged to its epoch), the hit
    rate, and the largest size of the node's cache directory seen."""
    out: dict[int, dict] = {}
    for run in runs:
        node, before = f"node{nodes[run['rank']]}", dict.fromkeys(COUNTERS, 0)
        for record, _ in run["batches"]:
            row = out.setdefault(record["epoch"], {}).setdefault(
                node, {**dict.fromkeys(COUNTERS, 0), "cache_dir_peak_bytes": 0})
            for k in COUNTERS:
                row[k] += record[k] - before[k]
            before = record
            row["cache_dir_peak_bytes"] = max(row["cache_dir_peak_bytes"], record["cache_dir_bytes"])
    for epoch in out.values():
        for row in epoch.values():
            reads = row["hits"] + row["misses"]
            row["hit_rate"] = row["hits"] / reads if reads else None
    return out


def memory(runs: list[dict]) -> list[dict]:
    """Per run (an attempt's rank): the resident set's peak in each epoch, and the slope of a
    straight line through it after the run's first epoch (its warm-up; the later half of the
    run when that leaves fewer than 10 batches), in MB per 100 batches: flat is about 0."""
    out = []
    for run in runs:
        rows = [r for r, _ in run["batches"]]
        if len(rows) < 4:
            continue
        rss = np.array([r["rss"] for r in rows], float) / 1e6
        later = np.array([r["epoch"] > rows[0]["epoch"] for r in rows])
        half = rss[later] if later.sum() >= 10 else rss[len(rss) // 2:]
        slope = float(np.polyfit(np.arange(len(half)), half, 1)[0]) * 100
        peaks = {}
        for r in rows:
            peaks[r["epoch"]] = max(peaks.get(r["epoch"], 0.0), r["rss"] / 1e6)
        out.append({"attempt": run["attempt"], "rank": run["rank"], "batches": len(rows),
                    "peak_mb_by_epoch": {str(k): v for k, v in sorted(peaks.items())},
                    "first_mb": float(rss[0]), "last_mb": float(rss[-1]), "slope_mb_per_100_batches": slope})
    return out


def lru_model(sizes: list[int], counts: list[int], *, epochs: int, seed: int, cap: int, world: int = 4,
              per_node: int = 2) -> dict[int, dict]:
    """Per epoch and node, the hit rate of a least-recently-used cache of ``cap`` bytes per node
    whose ranks read their shards in the plan's order (``hasten.stream.epoch_plan``), in step with
    each other: what the measured rates should be near. Left out: the shuffle buffer's reordering,
    reads ahead, and the kill (the restarted node rereads the shards of its checkpoint's position)."""
    from collections import OrderedDict

    from hasten.stream.epoch_plan import epoch_plan

    nodes = world // per_node
    caches, held, out = [OrderedDict() for _ in range(nodes)], [0] * nodes, {}
    for epoch in range(epochs):
        for node in range(nodes):
            reads = []
            for rank in range(node * per_node, (node + 1) * per_node):
                plan = epoch_plan(counts, epoch=epoch, seed=seed, rank=rank, world_size=world)
                for s in plan.shard_order.tolist():
                    first, last = int(plan.shard_start[s]), int(plan.shard_start[s]) + counts[s]
                    if first < plan.stop and last > plan.start:  # holds some of this rank's examples
                        reads.append(((max(first, plan.start) - plan.start) / len(plan), rank, s))
            hits = 0
            cache = caches[node]
            for _, _, s in sorted(reads):  # the ranks in step: by the fraction of their range done
                if s in cache:
                    hits += 1
                    cache.move_to_end(s)
                    continue
                cache[s] = sizes[s]
                held[node] += sizes[s]
                while held[node] > cap:
                    held[node] -= cache.popitem(last=False)[1]
            out.setdefault(epoch, {})[f"node{node}"] = hits / len(reads)
    return out


FLAT = 1.1  # memory flat, as benchmarks/remote_shards.py says it: the last epoch's peak at most 10% above epoch 2's


def flat(m: dict) -> bool | None:
    """Whether a run's resident set stayed flat: its last epoch's peak against its second's (its
    first warms up: the allocator, torch, the client); None (not judged) for a run of fewer than
    3 epochs, where the second is the last."""
    peaks = list(m["peak_mb_by_epoch"].values())
    if len(peaks) < 3:
        return None
    return peaks[-1] <= FLAT * peaks[1]


# --- the nodes -----------------------------------------------------------------------------------

class Nodes:
    """The store's server and the two nodes' torchrun launches, in namespaces or on loopback."""

    def __init__(self, args, packed: Path, logs: Path):
        self.args, self.logs = args, logs
        self.cluster = None
        if args.loopback:
            from hasten.harness.launch import free_port

            self.store_addr = self.master = "127.0.0.1"
            port = free_port()
            self.ns = [None, None, None]
            self.ifname = ["lo", "lo"]
        else:
            from hasten.harness.netns import EmulatedCluster

            self.cluster = EmulatedCluster(3, rate_gbit=args.rate_gbit, prefix=args.netns_prefix).__enter__()
            self.store_addr, self.master = self.cluster.address(0), self.cluster.address(1)
            port = HTTP_PORT
            self.ns = [p.netns for p in self.cluster.placement]
            self.ifname = [p.ifname for p in self.cluster.placement[1:]]
        self.server = subprocess.Popen(self.in_ns(0, sys.executable, "-m", "RangeHTTPServer", str(port),
                                                  "-b", self.store_addr),
                                       cwd=packed.parent, stdout=open(logs / "server.log", "w"),
                                       stderr=subprocess.STDOUT, start_new_session=True)
        keep_low([self.server.pid])
        self.url = f"http://{self.store_addr}:{port}/{packed.name}/"
        deadline = time.monotonic() + 60
        while subprocess.run(self.in_ns(1, sys.executable, "-c", "import socket, sys; socket.create_connection("
                                        f"({self.store_addr!r}, {port}), timeout=1)"),
                             capture_output=True).returncode:
            if time.monotonic() > deadline or self.server.poll() is not None:
                raise SystemExit(f"the store did not start: {(logs / 'server.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def in_ns(self, k: int, *argv: str) -> list[str]:
        return list(argv) if self.ns[k] is None else ["ip", "netns", "exec", self.ns[k], *argv]

    def rx_bytes(self, k: int) -> int | None:
        """Bytes received by node k's namespace (None on loopback, where the nodes share one)."""
        if self.ns[k] is None:
            return None
        text = subprocess.run(self.in_ns(k, "cat", "/proc/net/dev"), capture_output=True, text=True).stdout
        return sum(int(line.split(":")[1].split()[0]) for line in text.splitlines()[2:]
                   if ":" in line and line.split(":")[0].strip() != "lo")

    def launch(self, node: int, attempt: int, work: Path, cache_bytes: int) -> subprocess.Popen:
        a = self.args
        port = a.master_port
        cmd = self.in_ns(node + 1, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
                         str(node), "--nproc-per-node", "2", "--master-addr", self.master, "--master-port", str(port),
                         "--max-restarts", "0", __file__, "--worker", "--url", self.url, "--work", str(work),
                         "--attempt", str(attempt), "--cache-bytes", str(cache_bytes), "--epochs", str(a.epochs),
                         "--batch", str(a.batch), "--seed", str(a.seed), "--workers", str(a.workers),
                         "--checkpoint-every", str(a.checkpoint_every), "--timeout", str(a.timeout))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": self.ifname[node],
               "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).resolve().parent.parent),
                                                         os.environ.get("PYTHONPATH")) if p)}
        log = open(self.logs / f"a{attempt}-node{node}.log", "w")
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def close(self) -> None:
        if self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        if self.cluster is not None:
            self.cluster.__exit__(None, None, None)


def autogroup_nice(pid: int | str = "self") -> int | None:
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None  # not Linux, or no autogroup scheduling


def keep_low(pids: list[int]) -> None:
    """The scheduling share of this process given to ``pids``: the server and torchrun start
    sessions of their own, and each session is an autogroup with nice 0 whatever its processes'
    nice, so a benchmark started at low priority (``setsid nice -n 19``, autogroup nice 19)
    would otherwise run its ranks at normal priority."""
    mine = autogroup_nice()
    if not mine:
        return
    for pid in pids:
        if autogroup_nice(pid) not in (None, mine):
            try:
                Path(f"/proc/{pid}/autogroup").write_text(str(mine))
            except OSError:
                pass  # ended meanwhile


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL to a launch and everything it started: torchrun starts its ranks in sessions of
    their own, so killing its process group alone would leave them running."""
    from hasten.cpu_time import descendants

    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run_attempt(nodes: Nodes, attempt: int, work: Path, args, cache_bytes: int, kill: bool, started: float,
                total_batches: int, done_batches: int) -> dict:
    """Both nodes launched once; node B killed mid-epoch when ``kill``; waits for both to end."""
    args.master_port = random.randint(20000, 60000)
    rx = [nodes.rx_bytes(k) for k in (1, 2)]
    procs = [nodes.launch(n, attempt, work, cache_bytes) for n in (0, 1)]
    record = {"attempt": attempt, "killed": None}
    t0, said = time.monotonic(), time.monotonic()
    progress = work / "progress.json"
    from hasten.cpu_time import descendants

    lowered = 0.0
    while any(p.poll() is None for p in procs):
        time.sleep(0.05)
        if time.monotonic() - lowered > 2:  # (the ranks start within seconds; once in 2 s is enough)
            lowered = time.monotonic()
            keep_low([q for p in procs for q in (p.pid, *descendants(p.pid))])
        try:
            where = json.loads(progress.read_text())
        except (OSError, ValueError):
            continue
        batch = where["epoch"] * where["per_rank"] // args.batch + where["position"] // args.batch
        if time.monotonic() - said > args.progress_s:
            said = time.monotonic()
            rate = (batch - done_batches) / max(time.monotonic() - started, 1e-9)
            left = (total_batches - batch) / rate / 60 if rate > 0 else float("nan")
            print(f"attempt {attempt}: epoch {where['epoch'] + 1}/{args.epochs}, batch {batch}/{total_batches} of "
                  f"rank 0, {rate * args.batch * 4:.0f} images/s (indicative), about {left:.0f} min left",
                  file=sys.stderr, flush=True)
        if kill and record["killed"] is None and where["epoch"] == args.kill_epoch - 1 \
                and where["position"] >= args.kill_at * where["per_rank"]:
            checkpoint = json.loads((work / "checkpoint.json").read_text())
            if checkpoint["epoch"] == where["epoch"] and min(checkpoint["positions"]) > 0:
                kill_tree(procs[1])
                record["killed"] = {"node": 1, "epoch": where["epoch"], "rank0_position": where["position"],
                                    "newest_checkpoint": checkpoint, "s_into_attempt": time.monotonic() - t0}
                print(f"attempt {attempt}: node B killed in epoch {where['epoch'] + 1} at rank 0's example "
                      f"{where['position']}/{where['per_rank']}", file=sys.stderr, flush=True)
        if record["killed"] is not None and procs[0].poll() is None \
                and time.monotonic() - t0 - record["killed"]["s_into_attempt"] > args.timeout + 60:
            kill_tree(procs[0])  # its ranks should have stopped at their next collective
            record["node_a_killed_too"] = True
    for p in procs:
        p.wait()
    record["exit_codes"] = [p.returncode for p in procs]
    record["s"] = time.monotonic() - t0
    if record["killed"] is not None:
        record["s_kill_to_node_a_stop"] = record["s"] - record["killed"]["s_into_attempt"]
    after = [nodes.rx_bytes(k) for k in (1, 2)]
    record["node_rx_bytes"] = [None if b is None else a - b for a, b in zip(after, rx)]
    return record


# --- the whole run -------------------------------------------------------------------------------

def load_runs(work: Path) -> list[dict]:
    runs = []
    for path in sorted(work.glob("batches-a*-r*.bin")):
        attempt, rank = (int(x) for x in path.stem.removeprefix("batches-a").split("-r"))
        runs.append({"attempt": attempt, "rank": rank, "batches": read_batches(path)})
    return runs


def summarize(work: Path, state: dict, examples: int, cap: int, split_bytes: int, model: dict | None = None) -> dict:
    runs = load_runs(work)
    cuts = {a["attempt"]: b["resumed_from"] for a, b in zip(state["attempts"], state["attempts"][1:])}
    counted = tally(examples, runs, cuts)
    caches = node_cache(runs, {0: 0, 1: 0, 2: 1, 3: 1})
    epochs = []
    for epoch, c in counted.items():
        row = {"epoch": epoch + 1, **c, "complete": c["kept"] == examples and not c["duplicates"]}
        row["nodes"] = caches.get(epoch, {})
        for name, n in row["nodes"].items():
            n["cache_dir_peak_over_cap"] = n["cache_dir_peak_bytes"] / cap if n["cache_dir_peak_bytes"] >= 0 else None
            if model is not None and epoch in model:
                n["lru_model_hit_rate"] = model[epoch][name]
        epochs.append(row)
    mem = memory(runs)
    judged = [f for f in map(flat, mem) if f is not None]
    raw = [{"attempt": r["attempt"], "rank": r["rank"], **rec} for r in runs for rec, _ in r["batches"]]
    return {"epochs": epochs, "memory": mem, "raw": raw,
            "memory_flat": None if not judged else all(judged),
            "cache_cap_bytes": cap, "split_bytes": split_bytes}


def print_table(summary: dict) -> None:
    print(f"{'epoch':>5} {'examples':>9} {'dup':>4} {'miss':>5} {'repeats':>8}  "
          f"{'node A hit':>10} {'evict':>6} {'MB got':>7} {'dir/cap':>7}  {'node B hit':>10} {'evict':>6} "
          f"{'MB got':>7} {'dir/cap':>7}")
    for e in summary["epochs"]:
        cells = []
        for node in ("node0", "node1"):
            n = e["nodes"].get(node)
            model = f" ({n['lru_model_hit_rate']:.2f})" if n is not None and "lru_model_hit_rate" in n else ""
            cells.append("" if n is None else f"{n['hit_rate'] or 0:>10.2f}{model} {n['evictions']:>6} "
                                              f"{n['bytes_read'] / 1e6:>7.1f} {n['cache_dir_peak_over_cap'] or 0:>7.2f}")
        print(f"{e['epoch']:>5} {e['kept']:>9} {e['duplicates']:>4} {e['missing']:>5} {e['repeats']:>8}  "
              f"{cells[0]}  {cells[1]}")
    for m in summary["memory"]:
        peaks = ", ".join(f"{v:.0f}" for v in m["peak_mb_by_epoch"].values())
        print(f"attempt {m['attempt']} rank {m['rank']}: RSS peak by epoch {peaks} MB; "
              f"slope {m['slope_mb_per_100_batches']:+.2f} MB per 100 batches after its first epoch")


def settings_key(args) -> str:
    fields = [args.images, args.classes, args.shards, args.seed, args.cache_fraction, args.epochs, args.batch,
              args.kill_epoch, args.kill_at, args.workers, args.checkpoint_every, args.loopback]
    return hashlib.sha256(repr(fields).encode()).hexdigest()[:10]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=102_400, help="training images (a multiple of 4 x --batch)")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--shards", type=int, default=1000, help="about this many shards")
    ap.add_argument("--cache-fraction", type=float, default=0.4, help="each node's cache cap, of the split's bytes")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--kill-epoch", type=int, default=2, help="the epoch (from 1) in which node B is killed; 0: none")
    ap.add_argument("--kill-at", type=float, default=0.5, help="fraction of that epoch before the kill")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=0, help="decode processes per rank")
    ap.add_argument("--checkpoint-every", type=int, default=20, help="batches between checkpoints")
    ap.add_argument("--rate-gbit", type=float, default=1.0, help="each namespace's link")
    ap.add_argument("--timeout", type=int, default=60, help="the process group's timeout, s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="2,048 images in 32 shards, 2 epochs: checks it runs")
    ap.add_argument("--loopback", action="store_true", help="no namespaces: both nodes on 127.0.0.1 (no root)")
    ap.add_argument("--netns-prefix", default=PREFIX)
    ap.add_argument("--progress-s", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=None, help=f"default {RESULTS / 'stream_scale.json'}")
    ap.add_argument("--summarize", action="store_true",
                    help="write the results of the records so far (of the same command, running or stopped) and stop")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--attempt", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cache-bytes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.smoke:
        args.images, args.classes, args.shards, args.batch, args.epochs = 2048, 8, 32, 32, 2
        args.checkpoint_every, args.progress_s = 4, 5.0
    if args.images % (4 * args.batch):
        raise SystemExit(f"--images must be a multiple of 4 x --batch ({4 * args.batch}): every rank then has the "
                         "same number of batches, as the collective of each step needs")
    if not 0 < args.cache_fraction < 1:
        raise SystemExit("--cache-fraction must be in (0, 1): a cache smaller than the data")
    if not args.loopback and not args.summarize:
        from hasten.harness.netns import probe

        reason = probe(args.netns_prefix)
        if reason is not None:
            raise SystemExit(f"cannot emulate nodes here: {reason} (--loopback runs them without namespaces)")
    root = Path(os.environ.get("HASTEN_CACHE") or Path.home() / ".cache" / "hasten").expanduser() / "stream_scale"
    packed = make_data(root, args.images, args.classes, args.shards, args.seed)
    index = json.loads((packed / "index.json").read_text())
    shards = index["splits"]["train"]["shards"]
    split_bytes = sum(s["bytes"] for s in shards)
    cap = int(args.cache_fraction * split_bytes)
    out = args.out or (root / "stream_scale_smoke.json" if args.smoke else RESULTS / "stream_scale.json")
    work = root / f"run-{settings_key(args)}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    state_path = work / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"attempts": [], "killed": False}
    if state["attempts"]:
        print(f"resuming: {len(state['attempts'])} attempt(s) kept in {work}", file=sys.stderr)
    for a in state["attempts"]:
        a.setdefault("status", "interrupted")  # the benchmark itself stopped during it

    def finished() -> bool:
        c = work / "checkpoint.json"
        return c.exists() and json.loads(c.read_text())["epoch"] >= args.epochs

    total_batches = args.epochs * args.images // 4 // args.batch

    model = lru_model([s["bytes"] for s in shards], [s["examples"] for s in shards], epochs=args.epochs,
                      seed=args.seed, cap=cap)

    def results(cond) -> dict:
        s = summarize(work, state, args.images, cap, split_bytes, model)
        return {"command": " ".join(["python", "benchmarks/stream_scale.py", *(a for a in sys.argv[1:]
                                                                              if a != "--summarize")]),
                "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "url", "work", "attempt",
                                                                              "cache_bytes", "out", "master_port",
                                                                              "summarize")},
                "data": {"images": args.images, "shards": len(shards), "split_bytes": split_bytes,
                         "mean_shard_bytes": split_bytes / len(shards), "max_shard_bytes": max(s["bytes"] for s in shards),
                         "cache_cap_bytes_per_node": cap},
                "store": "RangeHTTPServer (threaded http.server with Range support), "
                         + ("own namespace" if not args.loopback else "loopback"),
                "nodes": ("2 network namespaces, tc htb at %g Gbit/s each, torchrun 2 ranks each (gloo)"
                          % args.rate_gbit) if not args.loopback else "2 torchrun launches on loopback, 2 ranks each",
                "attempts": state["attempts"], "epochs": s["epochs"], "memory": s["memory"],
                "memory_flat": s["memory_flat"], "complete": len(s["epochs"]) == args.epochs
                and all(e["complete"] for e in s["epochs"]),
                "conditions": cond.as_dict() if cond is not None else None, "runs": s["raw"]}

    logs = work / "logs"
    if args.summarize:  # the conditions of the run, when it wrote them, else none
        before = load_results(out) or {}
        write_results(out, {**results(None), "conditions": before.get("conditions")})
        print_table(summarize(work, state, args.images, cap, split_bytes, model))
        print(f"wrote {out} from the records in {work}")
        return
    with MeasuredConditions("cpu", seconds=0.2 if args.smoke else 1.0) as cond:
        nodes = Nodes(args, packed, logs)
        started = time.monotonic()
        try:
            done_batches = 0
            while not finished():
                if len(state["attempts"]) >= 4:
                    raise SystemExit(f"4 attempts and the epochs are not done; logs in {logs}")
                attempt = len(state["attempts"]) + 1
                checkpoint = work / "checkpoint.json"
                resumed = json.loads(checkpoint.read_text()) if checkpoint.exists() else None
                if resumed:
                    done_batches = resumed["epoch"] * args.images // 4 // args.batch + min(resumed["positions"]) // args.batch
                state["attempts"].append({"attempt": attempt, "resumed_from": resumed, "status": "running"})
                write_atomic(state_path, state)
                kill = args.kill_epoch > 0 and not state["killed"]
                record = run_attempt(nodes, attempt, work, args, cap, kill, started, total_batches, done_batches)
                record.update(resumed_from=resumed, status="killed" if record["killed"] else "ended")
                state["attempts"][-1] = record
                state["killed"] = state["killed"] or record["killed"] is not None
                write_atomic(state_path, state)
                if record["killed"] is None and not finished():
                    tail = "".join((logs / f"a{attempt}-node{n}.log").read_text()[-1500:] for n in (0, 1))
                    raise SystemExit(f"attempt {attempt} ended (exit codes {record['exit_codes']}) before the last "
                                     f"epoch:\n{tail}")
                write_results(out, results(None))  # each attempt's records as it ends
        finally:
            nodes.close()
    result = results(cond)
    write_results(out, result)
    d = result["data"]
    print(f"{d['images']} images in {d['shards']} shards ({d['split_bytes'] / 1e6:.0f} MB), each node's cache "
          f"{cap / 1e6:.0f} MB ({args.cache_fraction:.0%}); {result['nodes']}; "
          f"{hardware_label(result['conditions']['environment'])}")
    print_table(summarize(work, state, args.images, cap, split_bytes, model))
    verdict = {True: "yes", False: "NO", None: "not judged (no run of 3 epochs or more)"}[result["memory_flat"]]
    print(f"every example exactly once per epoch (up to the checkpoint resumed from): "
          f"{'yes' if result['complete'] else 'NO'}; memory flat (last epoch's peak <= {FLAT} x epoch 2's): {verdict}")
    print(cond.summary())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
