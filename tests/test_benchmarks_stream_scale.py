"""benchmarks/stream_scale.py: its count of the examples per epoch (duplicates, missing, repeats
after a resume), its per-node cache figures from the ranks' records (both in
_stream_scale_records.py), and its smoke run end to end on loopback (two torchrun launches of 2
ranks, node B killed mid-epoch and resumed; no root)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _stream_scale_records as ss  # noqa: E402
from _stream_scale_rank import RECORD  # noqa: E402


def write_batches(path: Path, batches: list[tuple[dict, list[int]]], cut_last: int = 0) -> None:
    """A rank's file as the benchmark writes it; ``cut_last`` bytes of the end missing (a kill)."""
    raw = b""
    for fields, keys in batches:
        head = np.zeros(1, RECORD)
        for k, v in {**fields, "n": len(keys)}.items():
            head[k] = v
        raw += head.tobytes() + np.asarray(keys, "<i8").tobytes()
    path.write_bytes(raw[:len(raw) - cut_last])


def rec(epoch, position, **counters):
    return {"epoch": epoch, "position": position, **counters}


def test_a_batch_cut_short_by_a_kill_is_left_out(tmp_path):
    path = tmp_path / "batches-a1-r0.bin"
    write_batches(path, [(rec(0, 2), [5, 6]), (rec(0, 4), [7, 8])], cut_last=3)
    got = ss.read_batches(path)
    assert [r["position"] for r, _ in got] == [2] and got[0][1].tolist() == [5, 6]


def run(attempt, rank, *batches):
    return {"attempt": attempt, "rank": rank, "batches": [(r, np.array(k)) for r, k in batches]}


def test_tally_counts_up_to_the_checkpoint_resumed_from_and_the_rest_as_repeats():
    # 8 examples, 2 ranks of 4 per epoch, batches of 2; attempt 1 dies in epoch 0 after position 4 of
    # rank 0 and 2 of rank 1; the checkpoint it resumed from is at position 2 for both.
    runs = [run(1, 0, (rec(0, 2), [0, 1]), (rec(0, 4), [2, 3])), run(1, 1, (rec(0, 2), [4, 5])),
            run(2, 0, (rec(0, 4), [2, 3]), (rec(1, 2), [0, 1]), (rec(1, 4), [2, 3])),
            run(2, 1, (rec(0, 4), [6, 7]), (rec(1, 2), [4, 5]), (rec(1, 4), [6, 7]))]
    cut = {1: {"epoch": 0, "positions": [2, 2]}}
    counted = ss.tally(8, runs, cut)
    assert counted[0] == {"delivered": 10, "kept": 8, "repeats": 2, "duplicates": 0, "missing": 0}
    assert counted[1] == {"delivered": 8, "kept": 8, "repeats": 0, "duplicates": 0, "missing": 0}
    # Without the cut, what attempt 1 delivered after its checkpoint is counted twice.
    assert ss.tally(8, runs, {})[0]["duplicates"] == 2
    # A resume from too late a checkpoint loses examples: they are missing.
    late = [run(1, 0, (rec(0, 2), [0, 1])), run(1, 1, (rec(0, 2), [4, 5])),
            run(2, 0, (rec(0, 4), [2, 3])), run(2, 1, (rec(0, 4), [6, 7]))]
    assert ss.tally(8, late[:3], {1: {"epoch": 0, "positions": [2, 2]}})[0]["missing"] == 2


def test_node_cache_charges_each_batchs_counter_changes_to_its_epoch_and_node():
    zero = dict(hits=0, misses=0, evictions=0, bytes_read=0, cache_dir_bytes=-1)
    runs = [run(1, 0, (rec(0, 2, **{**zero, "misses": 2, "bytes_read": 200, "cache_dir_bytes": 150}), [0, 1]),
                (rec(1, 2, **{**zero, "misses": 3, "hits": 3, "evictions": 1, "bytes_read": 300,
                              "cache_dir_bytes": 120}), [0, 1])),
            run(1, 2, (rec(0, 2, **{**zero, "misses": 1, "bytes_read": 100}), [4, 5]))]
    got = ss.node_cache(runs, {0: 0, 1: 0, 2: 1, 3: 1})
    assert got[0]["node0"]["misses"] == 2 and got[0]["node0"]["hit_rate"] == 0.0
    assert got[1]["node0"] == {"hits": 3, "misses": 1, "evictions": 1, "bytes_read": 100,
                               "cache_dir_peak_bytes": 120, "hit_rate": 0.75}
    assert got[0]["node1"]["bytes_read"] == 100 and got[0]["node1"]["cache_dir_peak_bytes"] == 0


def rss_run(mb_at, epochs=3):
    return run(1, 0, *[(rec(e, p, rss=int(mb_at(e * 10 + p) * 1e6)), [0]) for e in range(epochs) for p in range(10)])


def test_memory_is_flat_when_the_last_epochs_peak_holds_the_seconds_and_the_slope_says_by_how_much():
    warm_then_steady = ss.memory([rss_run(lambda b: 100.0 if b >= 10 else 50.0 + 5 * b)])[0]
    assert ss.flat(warm_then_steady) and abs(warm_then_steady["slope_mb_per_100_batches"]) < 1e-9
    growing = ss.memory([rss_run(lambda b: 100.0 + 3 * b)])[0]  # 3 MB a batch: 30 MB an epoch
    assert ss.flat(growing) is False and growing["slope_mb_per_100_batches"] == pytest.approx(300.0)
    assert ss.flat(ss.memory([rss_run(lambda b: 100.0 + b, epochs=2)])[0]) is None  # too short to judge


@pytest.mark.slow
def test_smoke_run_on_loopback_counts_every_example_once_through_a_lost_node(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "stream_scale.py"), "--smoke", "--loopback",
                           "--out", str(out)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HASTEN_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["complete"] and len(r["epochs"]) == 2 and r["data"]["images"] == 2048
    first, killed = r["attempts"]
    assert first["killed"]["node"] == 1 and first["killed"]["epoch"] == 1 and killed["status"] == "ended"
    assert killed["resumed_from"]["epoch"] == 1  # mid-epoch 2, from at least the checkpoint seen at the kill
    assert min(killed["resumed_from"]["positions"]) >= min(first["killed"]["newest_checkpoint"]["positions"]) > 0
    for e in r["epochs"]:
        assert e["kept"] == 2048 and e["duplicates"] == e["missing"] == 0
        for node in ("node0", "node1"):
            n = e["nodes"][node]
            assert 0 <= n["hit_rate"] <= 1
            # The node's directory holds its cap, and for a moment the shards its 2 ranks are placing.
            assert n["cache_dir_peak_bytes"] <= r["data"]["cache_cap_bytes_per_node"] + 2 * r["data"]["max_shard_bytes"]
    assert r["epochs"][1]["repeats"] >= 0 and r["epochs"][1]["delivered"] == 2048 + r["epochs"][1]["repeats"]
    assert sum(r["epochs"][1]["nodes"][n]["evictions"] for n in ("node0", "node1")) > 0  # the caps were felt
    assert {(m["attempt"], m["rank"]) for m in r["memory"]} == {(a, k) for a in (1, 2) for k in range(4)}


def test_the_lru_model_hits_nothing_without_a_cache_and_more_with_a_larger_one():
    rng = np.random.default_rng(0)
    counts = rng.integers(90, 110, 200).tolist()
    sizes = [c * 2560 for c in counts]
    rates = {cap: ss.lru_model(sizes, counts, epochs=3, seed=0, cap=cap) for cap in (0, sum(sizes) // 3, sum(sizes))}
    assert all(r == 0 for e in rates[0].values() for r in e.values())
    for epoch in (1, 2):
        for node in ("node0", "node1"):
            assert 0 < rates[sum(sizes) // 3][epoch][node] < rates[sum(sizes)][epoch][node] <= 1
