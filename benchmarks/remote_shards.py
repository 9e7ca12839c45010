"""Remote shards over emulated links, hasten beside WebDataset and LitData: images per second and per CPU-second.

The ImageNet-like shards of ``benchmarks/imagenet_pipeline.py`` (made once, cached)
sit in one network namespace, the readers in another, joined by a link of each of
``--rates`` Gbit/s (``hasten.harness.netns``: veth pairs, a bridge, tc htb on both
ends, a burst of 4 ms of the rate; the rate changed in place between readings). Results
written before that burst was set had tc's default burst, 1375 bytes at 1 Gbit/s: less
than one full frame (``benchmarks/remote_link_probe.py`` compares the two). In the store's namespace:
RangeHTTPServer (``rangehttpserver``) serves the tar shards and their index, and the
moto S3 server (``moto[server]``) holds the same shards and LitData's conversion of
the same JPEG bytes (``remote_peers.convert_litdata``: LitData reads ``s3://``, not
plain HTTP). This kernel has no ``sch_netem``, so the round trip ``--rtt-ms`` is added
by ``hasten.harness.delay_relay`` in front of both servers: every byte is held
``rtt/2`` each way, which adds ``rtt`` to every request's round trip but is not a
packet-level delay (TCP's window never has to cover rate x RTT; the JSON and the
table say "request RTT (relay)").

The readers (``--readers``), each with ``--workers`` decode processes, batches of
``--batch``, crops of ``--image-size``:
- ``hasten``: ``ShardLoader`` over ``open_shards(http://...)`` (obstore; the cache holds
  the split, so shards stream into their cache files and are read where they lie);
- ``hasten-s3``: the same over ``s3://`` from moto (LitData's server);
- ``webdataset``: WebDataset 1.0.2 over the same ``http://`` shards, its own decode;
- ``litdata``: LitData 0.2.76 over ``s3://`` from moto, its own format and decode.
Each also reads its data from the local disk (``<reader> local``; ``hasten-s3``'s is
``hasten``'s). Every reading is a fresh process with an empty cache reading
``--epochs`` epochs: epoch 1 crosses the link, epoch 2 comes from each reader's cache.
Per epoch: wall seconds; CPU seconds of the reader and everything it started
(``getrusage``; the servers and the relay are the store's and not counted); bytes
received by the reader's namespace (``/proc/net/dev``, wire bytes), their rate and
fraction of the link; peak memory of the reader's process tree (PSS, summed over the
processes, sampled every 0.05 s from outside; the summed RSS too, which counts pages the
forked workers share once per process); CPU seconds of the store's processes (the
servers and the relay run on the same cores as the reader: on a 2-core machine what they
use is taken from decoding). Configurations run in a fresh shuffled
order each repeat (``hasten.timing.interleaved``).

    python benchmarks/remote_shards.py [--images 4000] [--rates 0.1,1,10] [--rtt-ms 20] [--workers 2] [--shard-mib 64]
        [--repeats 3] [--epochs 3] [--readers hasten,hasten-s3,webdataset,litdata] [--smoke]

Needs root, iproute2, ``pip install -e '.[remote,test]'`` and the peers (pyproject's
``bench-remote`` extra; see there). Writes ``benchmarks/results/remote_shards.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hasten.cores import usable_cores
from hasten.cpu_time import descendants, own_cpu_s, pid_cpu_s
from hasten.rundir import write_json
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, hardware_label, mean_ci, memory_bytes, plus_minus

PREFIX = "hrb"  # namespaces of this benchmark (the tests use others)
HTTP_PORT, S3_PORT = 8000, 9000  # where the reader connects (the relay, or the servers themselves)
BUCKET = "bench"
READERS = ("hasten", "hasten-s3", "webdataset", "litdata")
S3_KEYS = {"AWS_ACCESS_KEY_ID": "bench-key", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_REGION": "us-east-1",
           "AWS_ALLOW_HTTP": "true",  # the endpoint is plain http (LitData's obstore client reads this)
           "AWS_DEFAULT_REGION": "us-east-1"}


# --- the reader (a fresh process per reading) ----------------------------------------------------

def rx_bytes() -> int:
    """Bytes received by this network namespace's interfaces other than loopback."""
    total = 0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, _, fields = line.partition(":")
        if name.strip() != "lo":
            total += int(fields.split()[0])
    return total


def cpu_of(pids: list[int]) -> float:
    """CPU seconds (user + system, all threads) of running processes."""
    return sum(pid_cpu_s(p) or 0.0 for p in pids)


def make_loader(reader: str, source: str, cache: str, names: list[str], args):
    common = dict(batch=args.batch, workers=args.workers, size=args.image_size, seed=args.seed)
    if reader in ("hasten", "hasten-s3"):
        from hasten.stream.remote_cache import open_remote_shards
        from hasten.stream.shard_loader import ShardLoader
        from hasten.stream.shard_store import open_shards

        store = open_remote_shards(source, cache_dir=cache) if "://" in source else open_shards(source)
        return ShardLoader(store, batch_size=args.batch, image_size=args.image_size, workers=args.workers,
                           seed=args.seed)
    from remote_peers import litdata_loader, webdataset_loader

    if reader == "webdataset":
        urls = [f"{source.rstrip('/')}/{n}" for n in names]
        remote = "://" in source
        if remote:
            Path(cache).mkdir(parents=True, exist_ok=True)  # (WebDataset does not make it)
        return webdataset_loader(urls, cache_dir=cache if remote else None, **common)
    return litdata_loader(source, cache_dir=cache, **common)


def read(args) -> None:
    """``--read``: ``--epochs`` epochs of one reader; one JSON line per epoch on stdout."""
    import torch

    torch.set_num_threads(1)
    names = json.loads(Path(args.names).read_text()) if args.names else []
    store_pids = [int(p) for p in args.store_pids.split(",") if p]
    loader = make_loader(args.reader, args.read, args.cache, names, args)
    for epoch in range(args.epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        t0, c0, r0, w0, s0 = time.perf_counter(), own_cpu_s(), rx_bytes(), time.time(), cpu_of(store_pids)
        images = sum(len(y) for _, y in loader)
        wall, cpu = time.perf_counter() - t0, own_cpu_s() - c0
        print(json.dumps({"epoch": epoch, "images": images, "wall_s": wall, "cpu_s": cpu,
                          "link_bytes": rx_bytes() - r0, "store_cpu_s": cpu_of(store_pids) - s0,
                          "start": w0, "end": time.time()}), flush=True)


# --- memory, sampled from outside ------------------------------------------------------------------

def run_reader(argv: list[str], env: dict) -> list[dict]:
    """The reader's epochs, each with its peak PSS and RSS (sampled from here, outside the reader)."""
    samples: list[tuple[float, tuple[int, int]]] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    stop = threading.Event()

    def sample():
        while not stop.wait(0.05):
            samples.append((time.time(), memory_bytes([proc.pid, *descendants(proc.pid)])))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=3600)
    finally:
        stop.set()
        sampler.join()
    if proc.returncode:
        raise SystemExit(f"the reader failed (the readings so far: $HASTEN_CACHE/*.partial.json): "
                         f"{' '.join(argv[-12:])}:\n{err.strip()[-3000:]}")
    epochs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for e in epochs:
        inside = [m for t, m in samples if e["start"] <= t <= e["end"]]
        if not inside and samples:  # an epoch shorter than the sampling interval: the nearest sample
            inside = [min(samples, key=lambda s: min(abs(s[0] - e["start"]), abs(s[0] - e["end"])))[1]]
        e["peak_pss_bytes"] = max(pss for pss, _ in inside) if inside else None
        e["peak_rss_bytes"] = max(rss for _, rss in inside) if inside else None
    return epochs


def reader_argv(reader: str, source: str, cache: Path, names: Path, store_pids: list[int], args) -> list[str]:
    return [sys.executable, __file__, "--read", source, "--reader", reader, "--cache", str(cache),
            "--names", str(names), "--store-pids", ",".join(map(str, store_pids)), "--epochs", str(args.epochs),
            "--workers", str(args.workers), "--image-size", str(args.image_size), "--batch", str(args.batch),
            "--seed", str(args.seed)]


# --- the store's namespace -------------------------------------------------------------------------

def in_ns(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def wait_port(ns: str, host: str, port: int) -> None:
    code = ("import socket, sys, time\nfor _ in range(1200):\n    try:\n"
            "        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close(); break\n"
            "    except OSError: time.sleep(0.05)\nelse: sys.exit(f'nothing listens on {sys.argv[1]}:{sys.argv[2]}')\n")
    subprocess.run(in_ns(ns, sys.executable, "-c", code, host, str(port)), check=True)


def upload(ns: str, endpoint: str, folders: dict[str, Path]) -> None:
    """Each folder's files put under s3://BUCKET/<key>/, from inside the store's namespace (no link)."""
    code = ("import boto3, sys, json, pathlib\n"
            "s3 = boto3.client('s3', endpoint_url=sys.argv[1])\n"
            f"s3.create_bucket(Bucket={BUCKET!r})\n"
            "for key, folder in json.loads(sys.argv[2]).items():\n"
            "    root = pathlib.Path(folder)\n"
            "    for p in sorted(root.rglob('*')):\n"
            "        if p.is_file():\n"
            f"            s3.upload_file(str(p), {BUCKET!r}, key + '/' + p.relative_to(root).as_posix())\n")
    subprocess.run(in_ns(ns, sys.executable, "-c", code, endpoint, json.dumps({k: str(v) for k, v in folders.items()})),
                   check=True, env={**os.environ, **S3_KEYS})


class Store:
    """The servers (and the relay) in the store's namespace, for the whole benchmark."""

    def __init__(self, cluster, shard_dir: Path, litdata_dir: Path | None, rtt_ms: float, logs: Path):
        self.ns, self.reader_ns = cluster.placement[0].netns, cluster.placement[1].netns
        self.host = cluster.address(0)
        relay = rtt_ms > 0
        bind = "127.0.0.1" if relay else self.host
        http, s3 = (HTTP_PORT + 10000, S3_PORT + 10000) if relay else (HTTP_PORT, S3_PORT)
        self.procs = []

        def start(argv, cwd, name):
            log = open(logs / f"{name}.log", "w")
            self.procs.append(subprocess.Popen(in_ns(self.ns, *argv), cwd=cwd, stdout=log, stderr=subprocess.STDOUT))

        start([sys.executable, "-m", "RangeHTTPServer", str(http), "-b", bind], shard_dir.parent, "http")
        start([sys.executable, "-m", "moto.server", "-H", bind, "-p", str(s3)], logs, "moto")
        wait_port(self.ns, bind, http)
        wait_port(self.ns, bind, s3)
        folders = {"shards": shard_dir, **({"litdata": litdata_dir} if litdata_dir else {})}
        upload(self.ns, f"http://{bind}:{s3}", folders)
        if relay:
            start([sys.executable, "-m", "hasten.harness.delay_relay", "--delay-ms", str(rtt_ms / 2),
                   f"{self.host}:{HTTP_PORT}=127.0.0.1:{http}", f"{self.host}:{S3_PORT}=127.0.0.1:{s3}"], logs, "relay")
            wait_port(self.reader_ns, self.host, HTTP_PORT)
            wait_port(self.reader_ns, self.host, S3_PORT)
        self.pids = [p.pid for p in self.procs]  # (`ip netns exec` execs the server: the same process)
        self.http = f"http://{self.host}:{HTTP_PORT}/{shard_dir.name}/"
        self.s3_env = {**S3_KEYS, "AWS_ENDPOINT_URL": f"http://{self.host}:{S3_PORT}"}

    def source(self, reader: str) -> tuple[str, dict]:
        if reader == "hasten-s3":
            return f"s3://{BUCKET}/shards/", self.s3_env
        if reader == "litdata":
            return f"s3://{BUCKET}/litdata", self.s3_env
        return self.http, {}

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


# --- the table -------------------------------------------------------------------------------------

def summarize(runs: dict[str, list[list[dict]]], epochs: int) -> dict:
    local = {c.split()[0]: mean_ci([r[0]["images"] / r[0]["wall_s"] for r in reps])["mean"]
             for c, reps in runs.items() if c.endswith(" local") and reps}
    summary = {}
    for config, reps in runs.items():
        if not reps:
            continue
        reader, rate = config.split()[0], None if config.endswith(" local") else float(config.split()[2])
        row = {}
        for epoch in range(epochs):
            per = [r[epoch] for r in reps]
            row[f"epoch{epoch + 1}"] = {
                "images_per_s": mean_ci([p["images"] / p["wall_s"] for p in per]),
                "images_per_cpu_s": mean_ci([p["images"] / p["cpu_s"] for p in per]),
                "link_mb_per_s": mean_ci([p["link_bytes"] / 1e6 / p["wall_s"] for p in per]),
                "link_mb": mean_ci([p["link_bytes"] / 1e6 for p in per]),
                "store_cpu_s": mean_ci([p["store_cpu_s"] for p in per]),
                "peak_pss_mb": mean_ci([p["peak_pss_bytes"] / 1e6 for p in per if p["peak_pss_bytes"]] or [0.0]),
                "peak_rss_mb": mean_ci([p["peak_rss_bytes"] / 1e6 for p in per if p["peak_rss_bytes"]] or [0.0]),
                "images": sorted({p["images"] for p in per}),
            }
        if epochs > 1:
            # Memory flat: the last epoch's peak over epoch 2's (both from the cache where there is one).
            # (No memory sample in a short epoch, as in --smoke beside other jobs: no ratio, not a crash.)
            second, last = row["epoch2"]["peak_pss_mb"]["mean"], row[f"epoch{epochs}"]["peak_pss_mb"]["mean"]
            row["peak_growth"] = last / second if second else None
        if rate is not None:
            row["link_fraction"] = row["epoch1"]["link_mb_per_s"]["mean"] * 8 / (rate * 1e3)
        own = local.get("hasten" if reader == "hasten-s3" else reader)
        if own:
            row["vs_own_local"] = row["epoch1"]["images_per_s"]["mean"] / own
        if local.get("hasten"):
            row["vs_hasten_local"] = row["epoch1"]["images_per_s"]["mean"] / local["hasten"]
        summary[config] = row
    return summary


GOAL = 0.9  # of the link where it limits, of the same reader's local throughput where decoding does
FLAT = 1.1  # memory flat: the last epoch's peak at most 10% above epoch 2's


def goals(summary: dict, epochs: int) -> dict:
    """Each remote configuration against issue 33's goals. Which limits: the link when the
    reader's local throughput, in bytes (its images/s x the bytes per image that crossed the
    link), is more than the link carries; else decoding."""
    out = {}
    for config, row in summary.items():
        if config.endswith(" local"):
            continue
        reader, rate = config.split()[0], float(config.split()[2])
        local = summary.get(f"{'hasten' if reader == 'hasten-s3' else reader} local")
        e1 = row["epoch1"]
        mb_per_image = e1["link_mb"]["mean"] / e1["images"][0]
        local_mb_s = local["epoch1"]["images_per_s"]["mean"] * mb_per_image if local else float("nan")
        link = "link" if local_mb_s > rate * 1e3 / 8 else "decode"
        reached = row["link_fraction"] if link == "link" else row.get("vs_own_local", float("nan"))
        g = {"limit": link, "reached": reached, "met": reached >= GOAL,
             "epoch2_from_cache": epochs > 1 and row["epoch2"]["link_mb"]["mean"] < 0.01 * e1["link_mb"]["mean"]}
        if row.get("peak_growth") is not None:
            g["memory_flat"] = row["peak_growth"] <= FLAT
        out[config] = g
    return out


def print_table(summary: dict, epochs: int) -> None:
    last = f"epoch{epochs}"
    print(f"{'reader and link':<26} {'epoch 1 img/s':>14} {'img/CPU-s':>10} {'link MB/s':>10} {'of link':>8} "
          f"{'vs local':>9} {'store CPU-s':>11} {'peak MB':>8} {last + ' img/s':>14} {'peak MB':>8} {'link MB':>8}")
    for config, row in summary.items():
        e1, en = row["epoch1"], row[last]
        print(f"{config:<26} {plus_minus(e1['images_per_s']['mean'], e1['images_per_s']['ci95'], '.0f'):>14} "
              f"{e1['images_per_cpu_s']['mean']:>10.0f} {e1['link_mb_per_s']['mean']:>10.1f} "
              f"{row.get('link_fraction', float('nan')):>8.2f} {row.get('vs_own_local', float('nan')):>9.2f} "
              f"{e1['store_cpu_s']['mean']:>11.1f} "
              f"{e1['peak_pss_mb']['mean']:>8.0f} "
              f"{plus_minus(en['images_per_s']['mean'], en['images_per_s']['ci95'], '.0f'):>14} "
              f"{en['peak_pss_mb']['mean']:>8.0f} {en['link_mb']['mean']:>8.1f}")
    for config, g in goals(summary, epochs).items():
        what = "of the link" if g["limit"] == "link" else "of its local rate"
        print(f"{config}: {g['limit']}-limited, {g['reached']:.2f} {what} ({'met' if g['met'] else 'missed'}: "
              f">= {GOAL}); epoch 2 from the cache: {'yes' if g['epoch2_from_cache'] else 'no'}"
              + (f"; memory flat: {'yes' if g['memory_flat'] else 'no'}" if "memory_flat" in g else ""))


def markdown(result: dict) -> str:
    """The result's table for docs/results/remote-shards.md (mean ± the 95% interval's half-width)."""
    summary, epochs = result["summary"], result.get("epochs", 2)
    judged = goals(summary, epochs)
    last = f"epoch{epochs}"
    lines = [f"| reader, link | epoch 1 images/s | images per CPU-s | of the link | of its local | store CPU-s "
             f"| peak MB, epoch 1 / {epochs} | epoch {epochs} images/s | goal |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for config, row in summary.items():
        e1, en = row["epoch1"], row[last]
        g = judged.get(config)
        verdict = "" if g is None else (f"{g['limit']}-limited: {'met' if g['met'] else 'missed'}"
                                        + ("" if g["epoch2_from_cache"] else "; epoch 2 not from cache")
                                        + ("" if g.get("memory_flat", True) else "; memory grew"))
        lines.append(f"| {config} | {plus_minus(e1['images_per_s']['mean'], e1['images_per_s']['ci95'], '.0f')} "
                     f"| {plus_minus(e1['images_per_cpu_s']['mean'], e1['images_per_cpu_s']['ci95'], '.0f')} "
                     f"| {row.get('link_fraction', float('nan')):.2f} | {row.get('vs_own_local', float('nan')):.2f} "
                     f"| {e1['store_cpu_s']['mean']:.1f} "
                     f"| {e1['peak_pss_mb']['mean']:.0f} / {en['peak_pss_mb']['mean']:.0f} "
                     f"| {plus_minus(en['images_per_s']['mean'], en['images_per_s']['ci95'], '.0f')} | {verdict} |")
    return "\n".join(lines).replace("| nan |", "| - |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=4000, help="training JPEGs of the ImageNet-like set")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--rates", default="0.1,1,10", help="link rates, Gbit/s, comma-separated")
    ap.add_argument("--rtt-ms", type=float, default=20.0, help="request round trip added by the relay (0: none)")
    ap.add_argument("--readers", default=",".join(READERS), help=f"comma-separated, of {', '.join(READERS)}")
    ap.add_argument("--workers", type=int, default=2, help="decode processes of every reader")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3, help="epoch 1 over the link, then from the cache")
    ap.add_argument("--shard-mib", type=int, default=64, help="MiB per shard (64: hasten data pack's default). A "
                    "reader decodes a shard once it has arrived whole: the first shard's arrival and the last one's "
                    "decode are not overlapped, about a shard's link time and decode time per epoch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="96 images, 0.1 and 1 Gbit/s, one repeat: checks it runs")
    ap.add_argument("--out", type=Path, default=None, help=f"default {RESULTS / 'remote_shards.json'}")
    ap.add_argument("--netns-prefix", default=PREFIX,
                    help="names of the namespaces made (a second run, or a test, beside a running one needs another)")
    ap.add_argument("--markdown", type=Path, help="print the table of a result JSON for the docs page, and stop")
    ap.add_argument("--read", help=argparse.SUPPRESS)
    ap.add_argument("--reader", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--names", help=argparse.SUPPRESS)
    ap.add_argument("--store-pids", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.read:
        sys.path.insert(0, str(Path(__file__).parent))
        read(args)
        return
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    unknown = sorted(set(readers) - set(READERS))
    if unknown or not readers:
        raise SystemExit(f"--readers: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(READERS)}")
    from hasten.harness.netns import BURST_S, EmulatedCluster, probe

    reason = probe(args.netns_prefix)
    if reason is not None:
        raise SystemExit(f"cannot emulate links here: {reason}")
    if args.smoke:
        args.images, args.classes, args.rates, args.repeats, args.workers, args.epochs = 96, 4, "0.1,1", 1, 1, 2
    sys.path.insert(0, str(Path(__file__).parent))
    from _imagenet_pipeline_data import make_dataset

    cache = Path(os.environ.get("HASTEN_CACHE") or Path.home() / ".cache" / "hasten").expanduser()
    folder, shard_dir = make_dataset(cache, args.images, args.classes, 2, args.seed, procs=min(2, usable_cores()))
    if args.shard_mib != 64:  # the same images in smaller shards, packed once beside the default ones
        from hasten.stream.pack import pack

        resized = shard_dir.parent / f"shards-{args.shard_mib}mib"
        if not (resized / "index.json").is_file():
            pack(folder, resized, shard_bytes=args.shard_mib << 20, seed=args.seed)
        shard_dir = resized
    litdata_dir = None
    if "litdata" in readers:
        from remote_peers import convert_litdata

        litdata_dir = convert_litdata(shard_dir, shard_dir.parent / "litdata")
    out = args.out or (cache / "remote_shards_smoke.json" if args.smoke else RESULTS / "remote_shards.json")
    # Every reading so far, kept as it comes: a run that stops keeps what it measured.
    partial = cache / f"{out.stem}.partial.json"
    rates = [float(r) for r in args.rates.split(",")]
    configs = [f"{r} local" for r in readers if r != "hasten-s3"]
    if "hasten-s3" in readers and "hasten" not in readers:
        configs.append("hasten local")
    configs += [f"{r} @ {rate:g} Gbit/s" for rate in rates for r in readers]
    runs: dict[str, list[list[dict]]] = {c: [] for c in configs}
    if partial.exists():
        # Resume: a stopped run of the same command keeps the readings it made.
        kept = json.loads(partial.read_text())
        if kept.get("command") == " ".join(sys.argv):
            runs.update({c: r for c, r in kept["runs"].items() if c in runs})
            print(f"resuming: {sum(map(len, runs.values()))} reading(s) kept from {partial}", file=sys.stderr)
    index = json.loads((shard_dir / "index.json").read_text())
    link = (f"tc htb rate (burst {BURST_S * 1e3:g} ms of it) on veth + bridge; request RTT +{args.rtt_ms:g} ms by a userspace relay "
            "(hasten.harness.delay_relay; no sch_netem: not packet-level delay), no loss" if args.rtt_ms > 0
            else f"tc htb rate (burst {BURST_S * 1e3:g} ms of it) on veth + bridge; no added latency, no loss")
    with MeasuredConditions("cpu", seconds=0.2 if args.smoke else 1.0) as cond, \
            tempfile.TemporaryDirectory() as tmp, \
            EmulatedCluster(2, rate_gbit=rates[0], prefix=args.netns_prefix) as cluster:
        tmp = Path(tmp)
        names = tmp / "names.json"
        names.write_text(json.dumps([s["name"] for s in index["splits"]["train"]["shards"]]))
        (tmp / "logs").mkdir()
        store = Store(cluster, shard_dir, litdata_dir, args.rtt_ms, tmp / "logs")
        try:
            order = [(r, c) for r, c in interleaved(configs, args.repeats, seed=args.seed) if len(runs[c]) <= r]
            started = time.monotonic()
            for done, (repeat, config) in enumerate(order):
                work = tmp / f"{repeat}-{config.replace(' ', '').replace('/', '')}"
                work.mkdir()
                reader = config.split()[0]
                left = "" if not done else f", about {(time.monotonic() - started) / done * (len(order) - done) / 60:.0f} min left"
                print(f"[{done + 1}/{len(order)}] repeat {repeat + 1}/{args.repeats}: {config}{left}",
                      file=sys.stderr, flush=True)
                # Local readings run in the reader's namespace too: the same surroundings, and its
                # byte counters see only this reader's traffic (none).
                if config.endswith(" local"):
                    source, env = str(litdata_dir if reader == "litdata" else shard_dir), {}
                else:
                    cluster.set_rate(float(config.split()[2]))
                    source, env = store.source(reader)
                argv = in_ns(store.reader_ns, *reader_argv(reader, source, work / "cache", names, store.pids, args))
                runs[config].append(run_reader(argv, env))
                write_json(partial, {"command": " ".join(sys.argv), "runs": runs})
        finally:
            store.close()
    summary = summarize(runs, args.epochs)
    print(f"{args.images} images, {args.workers} decode worker(s) per reader, batch {args.batch}, "
          f"{args.image_size}px, {args.repeats} repeat(s), {hardware_label(cond.as_dict()['environment'])}; {link}")
    print_table(summary, args.epochs)
    print(cond.summary())
    versions = {}
    for pkg in ("webdataset", "litdata", "obstore", "moto", "rangehttpserver"):
        try:
            from importlib.metadata import version

            versions[pkg] = version(pkg)
        except Exception:  # noqa: BLE001 - not installed: not used
            pass
    write_json(out, {"command": " ".join(sys.argv), "images": args.images, "workers": args.workers,
                     "image_size": args.image_size, "batch": args.batch, "epochs": args.epochs, "repeats": args.repeats,
                     "rates_gbit": rates, "rtt_ms": args.rtt_ms, "shards": len(index["splits"]["train"]["shards"]),
                     "shard_mib": args.shard_mib, "goals": goals(summary, args.epochs),
                     "readers": readers, "link": link, "versions": versions, "summary": summary, "runs": runs,
                     "conditions": cond.as_dict()})
    partial.unlink(missing_ok=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
