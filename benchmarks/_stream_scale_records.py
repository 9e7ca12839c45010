"""What the ranks' records of benchmarks/stream_scale.py say: every example counted per epoch
(duplicates, missing, repeats after a resume), each node's cache figures, each rank's resident
set and whether it stayed flat, a least-recently-used model of the hit rates, and the summary
and table the benchmark writes and prints from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from _stream_scale_rank import RECORD

COUNTERS = ("hits", "misses", "evictions", "bytes_read")


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
