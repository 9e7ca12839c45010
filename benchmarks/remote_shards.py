"""Remote shards over emulated links against the same shards read locally: images per second and per CPU-second.

The ImageNet-like shards of ``benchmarks/imagenet_pipeline.py`` (made once, cached)
are served by RangeHTTPServer (``rangehttpserver``) in one network namespace and
read by ``ShardLoader`` over ``open_shards(URL)`` in another, the two joined by a link
of ``--rates`` Gbit/s (``hasten.harness.netns``: veth pairs, a bridge, tc htb on both
ends); the same loader reads the same shards from the local directory as the
reference. Each reading is a fresh process (``--read`` mode of this script) that
reads ``--epochs`` epochs with an empty shard cache: epoch 1 crosses the link,
epoch 2 comes from the cache. Per epoch: wall seconds, CPU seconds of the reader and
its decode workers (``getrusage``: the server's are the store's, not counted), images
per second and per CPU-second, MB/s from the store and its fraction of the link.
Configurations run in a fresh shuffled order each repeat (``hasten.timing.interleaved``).

What this does not do yet (issue 33, item 5): a 20 ms round trip and packet loss need
``sch_netem``, which this kernel lacks (the links have a rate, no added latency; the
JSON says so); WebDataset and LitData side by side; memory over epochs.

    python benchmarks/remote_shards.py [--images 4000] [--rates 0.1,1,10] [--workers 2] [--repeats 2] [--smoke]

Needs root, iproute2 and ``pip install -e '.[remote,test]'``. Writes
``benchmarks/results/remote_shards.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hasten.rundir import write_json
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, hardware_label, mean_ci, plus_minus

PREFIX = "hrb"  # namespaces of this benchmark (the tests use others)
PORT = 8000


def cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def read(source: str, cache: str, epochs: int, workers: int, image_size: int, batch: int) -> None:
    """The reader (``--read``): ``epochs`` epochs of ``source``; one JSON line per epoch on stdout."""
    import torch

    from hasten.stream.remote_store import open_remote_shards
    from hasten.stream.shard_loader import ShardLoader
    from hasten.stream.shard_store import open_shards

    torch.set_num_threads(1)
    remote = "://" in source
    store = open_remote_shards(source, cache_dir=cache) if remote else open_shards(source)
    loader = ShardLoader(store, batch_size=batch, image_size=image_size, workers=workers)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        before = store.store.bytes_read if remote else 0
        t0, c0 = time.perf_counter(), cpu_s()
        images = sum(len(y) for _, y in loader)
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
        fetched = store.store.bytes_read - before if remote else 0
        print(json.dumps({"epoch": epoch, "images": images, "wall_s": wall, "cpu_s": cpu,
                          "bytes_from_store": fetched}), flush=True)


def reader_argv(source: str, cache: Path, args) -> list[str]:
    return [sys.executable, __file__, "--read", source, "--cache", str(cache), "--epochs", str(args.epochs),
            "--workers", str(args.workers), "--image-size", str(args.image_size), "--batch", str(args.batch)]


def run_reader(argv: list[str]) -> list[dict]:
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          timeout=3600)
    if done.returncode:
        raise SystemExit(f"the reader failed: {done.stderr.strip().splitlines()[-1:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def over_link(shard_dir: Path, rate: float, args, tmp: Path) -> list[dict]:
    from hasten.harness.netns import EmulatedCluster

    with EmulatedCluster(2, rate_gbit=rate, prefix=PREFIX) as cluster:
        store_ns, reader_ns = cluster.placement[0].netns, cluster.placement[1].netns
        host = cluster.address(0)
        server = subprocess.Popen(["ip", "netns", "exec", store_ns, sys.executable, "-m", "RangeHTTPServer",
                                   str(PORT), "-b", host], cwd=shard_dir.parent, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            wait = ("import socket, sys, time\nfor _ in range(1200):\n    try:\n"
                    "        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close(); break\n"
                    "    except OSError: time.sleep(0.05)\n")
            subprocess.run(["ip", "netns", "exec", reader_ns, sys.executable, "-c", wait, host, str(PORT)], check=True)
            url = f"http://{host}:{PORT}/{shard_dir.name}/"
            return run_reader(["ip", "netns", "exec", reader_ns, *reader_argv(url, tmp / f"cache-{rate}", args)])
        finally:
            server.kill()
            server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=4000, help="training JPEGs of the ImageNet-like set")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--rates", default="0.1,1,10", help="link rates, Gbit/s, comma-separated")
    ap.add_argument("--workers", type=int, default=2, help="decode processes of the reader")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2, help="epoch 1 over the link, then from the cache")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="96 images, 0.1 and 1 Gbit/s, one repeat: checks it runs")
    ap.add_argument("--out", type=Path, default=None, help=f"default {RESULTS / 'remote_shards.json'}")
    ap.add_argument("--read", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.read:
        read(args.read, args.cache, args.epochs, args.workers, args.image_size, args.batch)
        return
    from hasten.harness.netns import probe

    reason = probe(PREFIX)
    if reason is not None:
        raise SystemExit(f"cannot emulate links here: {reason}")
    if args.smoke:
        args.images, args.classes, args.rates, args.repeats, args.workers = 96, 4, "0.1,1", 1, 1
    sys.path.insert(0, str(Path(__file__).parent))
    from imagenet_pipeline import make_dataset

    cache = Path(os.environ.get("HASTEN_CACHE") or Path.home() / ".cache" / "hasten").expanduser()
    _, shard_dir = make_dataset(cache, args.images, args.classes, 2, args.seed, procs=max(1, min(2, os.cpu_count())))
    rates = [float(r) for r in args.rates.split(",")]
    configs = ["local", *[f"{r:g} Gbit/s" for r in rates]]
    runs: dict[str, list[list[dict]]] = {c: [] for c in configs}
    with MeasuredConditions("cpu", seconds=0.2 if args.smoke else 1.0) as cond, \
            tempfile.TemporaryDirectory() as tmp:
        for repeat, config in interleaved(configs, args.repeats, seed=args.seed):
            work = Path(tmp) / f"{repeat}-{config.replace(' ', '').replace('/', '')}"
            work.mkdir()
            if config == "local":
                runs[config].append(run_reader(reader_argv(str(shard_dir), work / "cache", args)))
            else:
                runs[config].append(over_link(shard_dir, float(config.split()[0]), args, work))
    summary = {}
    local_rate = mean_ci([r[0]["images"] / r[0]["wall_s"] for r in runs["local"]])["mean"]
    for config, reps in runs.items():
        row = {}
        for epoch in range(args.epochs):
            per = [r[epoch] for r in reps]
            row[f"epoch{epoch + 1}"] = {
                "images_per_s": mean_ci([p["images"] / p["wall_s"] for p in per]),
                "images_per_cpu_s": mean_ci([p["images"] / p["cpu_s"] for p in per]),
                "store_mb_per_s": mean_ci([p["bytes_from_store"] / 1e6 / p["wall_s"] for p in per]),
            }
        if config != "local":
            rate = float(config.split()[0])
            row["link_fraction"] = row["epoch1"]["store_mb_per_s"]["mean"] * 8 / (rate * 1e3)
        row["vs_local"] = row["epoch1"]["images_per_s"]["mean"] / local_rate
        summary[config] = row
    print(f"{args.images} images, {args.workers} decode worker(s), {args.repeats} repeat(s), "
          f"{hardware_label(cond.as_dict()['environment'])}; links: rate only (no sch_netem: no latency, no loss)")
    print(f"{'source':<12} {'epoch 1 img/s':>15} {'img/CPU-s':>11} {'MB/s':>8} {'of link':>8} {'epoch 2 img/s':>15}")
    for config, row in summary.items():
        e1, e2 = row["epoch1"], row.get("epoch2", row["epoch1"])
        print(f"{config:<12} {plus_minus(e1['images_per_s']['mean'], e1['images_per_s']['ci95'], '.0f'):>15} "
              f"{e1['images_per_cpu_s']['mean']:>11.0f} {e1['store_mb_per_s']['mean']:>8.0f} "
              f"{row.get('link_fraction', float('nan')):>8.2f} "
              f"{plus_minus(e2['images_per_s']['mean'], e2['images_per_s']['ci95'], '.0f'):>15}")
    print(cond.summary())
    out = args.out or (cache / "remote_shards_smoke.json" if args.smoke else RESULTS / "remote_shards.json")
    write_json(out, {"command": " ".join(sys.argv), "images": args.images, "workers": args.workers,
                     "image_size": args.image_size, "batch": args.batch, "rates_gbit": rates,
                     "link": "tc htb rate on veth + bridge; no added latency or loss (no sch_netem)",
                     "summary": summary, "runs": runs, "conditions": cond.as_dict()})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
