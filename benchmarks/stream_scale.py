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

This file is the command; its parts beside it: ``_stream_scale_data.py`` (the data),
``_stream_scale_nodes.py`` (the store, the nodes, an attempt and the kill),
``_stream_scale_rank.py`` (one rank: what torchrun runs, ``--worker``) and
``_stream_scale_records.py`` (what the ranks' records say: the counts, the caches, the memory,
the summary and its table).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from _common import RESULTS, MeasuredConditions, hardware_label, load_results, write_results
from _stream_scale_data import make_data
from _stream_scale_nodes import Nodes, run_attempt
from _stream_scale_rank import worker, write_atomic
from _stream_scale_records import FLAT, lru_model, print_table, summarize

PREFIX = "hss"  # this benchmark's namespaces (the tests and other benchmarks use others)


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
