"""Where remote shards lose link rate: the emulated link and its server alone, beside hasten's reader.

``benchmarks/remote_shards.py`` found hasten's remote reader at 0.65 of a 1 Gbit/s link
(0.93 of 0.1 Gbit/s). This probe sets up the same link and servers (its ``Store``, on
``hasten.harness.netns``) and fetches the same shards with each of ``--clients``, every
fetch a fresh process in the reader's namespace:
- ``curl``: ``curl -o /dev/null`` of every shard, one after another over one connection
  (whole files: the server copies them 64 KiB at a time, ranged answers 16 KiB at a time);
- ``obstore``: a plain client as hasten's (obstore, ranged GETs of ``PART_BYTES``, streamed
  in ``CHUNK_BYTES`` chunks, hasten's requests in flight), the bodies dropped: no file, no hash;
- ``hasten``: hasten's fetch path without decoding (``open_remote_shards``, the loader's
  ``plan_records``: each shard streamed into its cache file, hashed, scanned);
- ``hasten-loader``: the whole ``ShardLoader`` with decode workers, as remote_shards.py reads.
For each fetch: the fraction of the link carried (wire bytes into the reader's namespace
over the fetch's wall time), the client's CPU seconds per GB (its process and children)
and the server's (``/proc/<pid>/stat`` of the store's processes: servers and relay), and
both as cores busy (the server is one Python process: near 1.0 it is the bound).

The shaping is checked too. Each configuration runs under each of ``--bursts``: ``tc``, tc's
default htb burst (what remote_shards.py used until this probe: 1375 bytes at 1 Gbit/s, 11
microseconds of the rate), and a burst of N ms of the rate (``hasten.harness.netns.BURST_S``
says why). The JSON keeps each setting's ``tc -d class`` lines and, per fetch, the qdiscs'
drops, overlimits and requeues on the store's upload and the reader's download. Also the
bandwidth-delay product at ``--rtt-ms`` beside hasten's bytes in flight (GETs in flight x
their size). A fresh shuffled order per repeat; each run written as it finishes (resumable).

    python benchmarks/remote_link_probe.py [--rate 1] [--rtt-ms 20] [--shard-mib 16] [--images 4000]
        [--bursts tc,4] [--clients curl,obstore,hasten,hasten-loader] [--repeats 5] [--smoke] [--out ...]

Needs root, iproute2, curl, and remote_shards.py's servers (pyproject's ``bench-remote`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hasten.cpu_time import descendants, own_cpu_s, pid_cpu_s
from hasten.rundir import write_json
from hasten.stream.remote_store import CHUNK_BYTES, CONNECTIONS, PART_BYTES
from hasten.timing import interleaved

sys.path.insert(0, str(Path(__file__).parent))
from _common import RESULTS, MeasuredConditions, hardware_label, mean_ci, plus_minus  # noqa: E402
from remote_shards import Store, in_ns, make_loader, rx_bytes  # noqa: E402

PREFIX = "hlp"  # namespaces of this probe (remote_shards.py's are "hrb", the tests' others)
CLIENTS = ("curl", "obstore", "hasten", "hasten-loader")
LOADER = dict(batch=256, workers=2, image_size=224, seed=0)  # remote_shards.py's defaults
COUNTERS = ("dropped", "overlimits", "requeues")


# --- one fetch (a fresh process in the reader's namespace) ---------------------------------------

def processes_cpu_s(pids: list[int]) -> float:  # these processes and their descendants, all threads
    return sum(pid_cpu_s(p) or 0.0 for p in {*pids, *(d for p in pids for d in descendants(p))})


def client_cpu_s() -> float:
    """This process, its exited children (curl) and its live ones (decode workers)."""
    return own_cpu_s() + processes_cpu_s(descendants(os.getpid()))


def requests_in_flight(sizes: list[int]) -> int:
    """hasten's GETs in flight: the loader's shards ahead, each in parts, at most CONNECTIONS."""
    return min(CONNECTIONS, 2 * -(-max(sizes) // PART_BYTES))  # 2: ShardLoader's default prefetch


def fetch(args) -> None:
    """``--fetch CLIENT``: every shard once; one JSON line on stdout."""
    names, sizes = json.loads(Path(args.names).read_text())
    store_pids = [int(p) for p in args.store_pids.split(",")]
    client, url, got = args.fetch, args.url, {}
    if client == "hasten-loader":
        loader = make_loader("hasten", url, args.work, names, argparse.Namespace(**LOADER))
    elif client == "hasten":
        from hasten.stream.epoch_plan import plan_records
        from hasten.stream.remote_cache import open_remote_shards
        from hasten.stream.shard_loader import ShardLoader

        loader = ShardLoader(open_remote_shards(url, cache_dir=args.work), batch_size=LOADER["batch"], workers=0)
    elif client == "obstore":
        import obstore
        from hasten.stream.store_client import store_client
        from hasten.stream.store_url import parse_store_url

        http = store_client(parse_store_url(url), 60.0)
        parts = [(n, a, min(a + PART_BYTES, s)) for n, s in zip(names, sizes) for a in range(0, s, PART_BYTES)]

        def part(p):  # one ranged GET, its body streamed as hasten streams it, and dropped
            name, start, end = p
            body = obstore.get(http, name, options={"range": (start, end)})
            return sum(len(c) for c in body.stream(min_chunk_size=min(end - start, CHUNK_BYTES)))
    t0, c0, s0, r0 = time.perf_counter(), client_cpu_s(), processes_cpu_s(store_pids), rx_bytes()
    if client == "curl":
        argv = ["curl", "-sS", "--fail", "-w", "%{size_download}\n",
                *(a for n in names for a in ("-o", "/dev/null", url + n))]
        data = sum(map(int, subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()))
    elif client == "obstore":
        with ThreadPoolExecutor(requests_in_flight(sizes)) as pool:
            data = sum(pool.map(part, parts))
    elif client == "hasten":
        got["examples"] = sum(1 for _ in plan_records(loader.shards, loader.plan(0), 0, prefetch=loader.prefetch,
                                                      lazy=True))
    else:
        got["examples"] = sum(len(y) for _, y in loader)
    wall = time.perf_counter() - t0
    cpu, server, link = client_cpu_s() - c0, processes_cpu_s(store_pids) - s0, rx_bytes() - r0
    if client.startswith("hasten"):
        data = loader.shards.store.bytes_read  # body bytes received (every shard's SHA-256 checked)
    print(json.dumps({"data_bytes": data, "wall_s": wall, "client_cpu_s": cpu, "server_cpu_s": server,
                      "link_bytes": link, **got}), flush=True)


# --- the link's shaping ----------------------------------------------------------------------------

def tc_text(ns: str | None, dev: str, *what: str) -> str:
    argv = ["tc", *what, "show", "dev", dev]  # (ns None: the root namespace, where the bridge's veths are)
    return subprocess.run(in_ns(ns, *argv) if ns else argv, capture_output=True, text=True, check=True).stdout


def qdisc_counters(text: str) -> dict[str, int]:
    """``tc -s qdisc``'s drops, overlimits and requeues, summed over the device's qdiscs."""
    found = re.findall(r"\(dropped (\d+), overlimits (\d+) requeues (\d+)\)", text)
    return {k: sum(int(f[i]) for f in found) for i, k in enumerate(COUNTERS)}


def parse_bursts(text: str) -> list[float | None]:
    """``tc,4`` -> [None (tc's default), 0.004 s]."""
    try:
        out = [None if b.strip() == "tc" else float(b) / 1e3 for b in text.split(",") if b.strip()]
    except ValueError:
        out = []
    if not out or any(b is not None and not 0 < b < 1 for b in out):
        raise SystemExit(f"--bursts: comma-separated ms in (0, 1000), or 'tc' (tc's default); got {text!r}")
    return out


def burst_label(burst_s: float | None) -> str:
    return "tc default" if burst_s is None else f"{burst_s * 1e3:g} ms"


# --- the table -------------------------------------------------------------------------------------

def summarize(runs: list[dict], rate_gbit: float) -> dict:
    summary = {}
    for config in dict.fromkeys(r["config"] for r in runs):
        per = [r for r in runs if r["config"] == config]
        summary[config] = {
            "link_fraction": mean_ci([r["link_bytes"] * 8 / r["wall_s"] / (rate_gbit * 1e9) for r in per]),
            "data_fraction": mean_ci([r["data_bytes"] * 8 / r["wall_s"] / (rate_gbit * 1e9) for r in per]),
            "client_cpu_s_per_gb": mean_ci([r["client_cpu_s"] / (r["data_bytes"] / 1e9) for r in per]),
            "server_cpu_s_per_gb": mean_ci([r["server_cpu_s"] / (r["data_bytes"] / 1e9) for r in per]),
            "client_cores": mean_ci([r["client_cpu_s"] / r["wall_s"] for r in per]),
            "server_cores": mean_ci([r["server_cpu_s"] / r["wall_s"] for r in per]),
            **{k: mean_ci([r["tc"]["upload"][k] + r["tc"]["download"][k] for r in per]) for k in COUNTERS},  # both ends
        }
    return summary


def print_table(summary: dict) -> None:
    print(f"{'client, burst':<30} {'of link':>12} {'client CPU-s/GB':>16} {'server CPU-s/GB':>16} "
          f"{'cores: client':>13} {'server':>6} {'drops':>6} {'overlimits':>10}")
    for config, s in summary.items():
        print(f"{config:<30} {plus_minus(s['link_fraction']['mean'], s['link_fraction']['ci95']):>12} "
              f"{plus_minus(s['client_cpu_s_per_gb']['mean'], s['client_cpu_s_per_gb']['ci95'], '.1f'):>16} "
              f"{plus_minus(s['server_cpu_s_per_gb']['mean'], s['server_cpu_s_per_gb']['ci95'], '.1f'):>16} "
              f"{s['client_cores']['mean']:>13.2f} {s['server_cores']['mean']:>6.2f} "
              f"{s['dropped']['mean']:>6.0f} {s['overlimits']['mean']:>10.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=1.0, help="link rate, Gbit/s")
    ap.add_argument("--rtt-ms", type=float, default=20.0, help="request round trip added by the relay (0: none)")
    ap.add_argument("--shard-mib", type=int, default=16, help="MiB per shard (remote_shards.py's shards of that size)")
    ap.add_argument("--images", type=int, default=4000, help="training JPEGs of remote_shards.py's ImageNet-like set")
    ap.add_argument("--bursts", default="tc,4", help="htb bursts to compare: ms of the rate, or 'tc' (tc's default)")
    ap.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated, of {', '.join(CLIENTS)}")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="96 images in 1 MiB shards, one repeat: checks it runs")
    ap.add_argument("--out", type=Path, help="default: results/remote_link_probe.json (--smoke: in the cache)")
    ap.add_argument("--netns-prefix", default=PREFIX, help="names of the namespaces made (a test needs its own)")
    for hidden in ("--fetch", "--url", "--names", "--store-pids", "--work"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fetch:
        return fetch(args)
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = sorted(set(clients) - set(CLIENTS))
    if unknown or not clients:
        raise SystemExit(f"--clients: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(CLIENTS)}")
    if args.rate <= 0 or args.rtt_ms < 0 or args.repeats < 1 or args.shard_mib < 1:
        raise SystemExit("--rate must be > 0, --rtt-ms >= 0, --repeats and --shard-mib >= 1")
    bursts = parse_bursts(args.bursts)
    if "curl" in clients and shutil.which("curl") is None:
        raise SystemExit("the curl client needs curl (apt-get install curl); or leave it out of --clients")
    from _imagenet_pipeline_data import make_dataset
    from hasten.harness.netns import EmulatedCluster, probe
    from hasten.stream.pack import pack

    reason = probe(args.netns_prefix)
    if reason is not None:
        raise SystemExit(f"cannot emulate links here: {reason}")
    if args.smoke:
        args.images, args.shard_mib, args.repeats = 96, 1, 1
    cache = Path(os.environ.get("HASTEN_CACHE") or Path.home() / ".cache" / "hasten").expanduser()
    args.out = args.out or (cache / "link_probe_smoke.json" if args.smoke else RESULTS / "remote_link_probe.json")
    folder, shard_dir = make_dataset(cache, args.images, 4 if args.smoke else 100, 2, args.seed, procs=2)
    if args.shard_mib != 64:  # remote_shards.py's smaller shards, packed once beside the default ones
        resized = shard_dir.parent / f"shards-{args.shard_mib}mib"
        if not (resized / "index.json").is_file():
            pack(folder, resized, shard_bytes=args.shard_mib << 20, seed=args.seed)
        shard_dir = resized
    shards = json.loads((shard_dir / "index.json").read_text())["splits"]["train"]["shards"]
    names, sizes = [s["name"] for s in shards], [s["bytes"] for s in shards]
    in_flight = requests_in_flight(sizes)
    setup = {"rate_gbit": args.rate, "rtt_ms": args.rtt_ms, "shard_mib": args.shard_mib, "images": args.images,
             "shards": len(names), "data_bytes": sum(sizes), "bursts": [burst_label(b) for b in bursts],
             "clients": clients, "seed": args.seed, "loader": dict(LOADER), "connections": CONNECTIONS,
             "bdp_bytes": args.rate * 1e9 / 8 * args.rtt_ms / 1e3, "requests_in_flight": in_flight,
             "part_bytes": PART_BYTES, "reader_bytes_in_flight": in_flight * min(PART_BYTES, max(sizes))}
    kept = json.loads(args.out.read_text()) if args.out.is_file() else {}
    runs = kept.get("runs", []) if kept.get("setup") == setup else []
    if runs:
        print(f"resuming: {len(runs)} run(s) kept from {args.out}", file=sys.stderr)
    configs = [(c, b) for b in bursts for c in clients]
    label = {cb: f"{cb[0]}, burst {burst_label(cb[1])}" for cb in configs}
    done_runs = {(r["repeat"], r["config"]) for r in runs}
    order = [(r, cb) for r, cb in interleaved(configs, args.repeats, seed=args.seed) if (r, label[cb]) not in done_runs]
    link = (f"tc htb {args.rate:g} Gbit/s on veth + bridge; request RTT +{args.rtt_ms:g} ms by a userspace relay "
            "(hasten.harness.delay_relay; not packet-level delay)" if args.rtt_ms > 0
            else f"tc htb {args.rate:g} Gbit/s on veth + bridge; no added latency")
    with MeasuredConditions("cpu", seconds=0.2 if args.smoke else 1.0) as cond, tempfile.TemporaryDirectory() as tmp, \
            EmulatedCluster(2, rate_gbit=args.rate, prefix=args.netns_prefix, burst_s=bursts[0]) as cluster:
        tmp = Path(tmp)
        (tmp / "logs").mkdir()
        (tmp / "names.json").write_text(json.dumps([names, sizes]))  # the fetches' list of shards
        store = Store(cluster, shard_dir, None, args.rtt_ms, tmp / "logs")
        p = args.netns_prefix
        sides = {"upload": (f"{p}0", f"{p}0n"), "download": (None, f"{p}1h")}  # the store's out, the reader's in
        tc_classes = {}
        try:
            for burst in bursts:  # each setting's classes as tc reads them back (burst, cburst)
                cluster.burst_s = burst
                cluster.set_rate(args.rate)
                tc_classes[burst_label(burst)] = tc_text(None, f"{p}1h", "-d", "class")
            started = time.monotonic()
            for k, (repeat, (client, burst)) in enumerate(order):
                left = f", about {(time.monotonic() - started) / k * (len(order) - k) / 60:.1f} min left" if k else ""
                print(f"[{k + 1}/{len(order)}] repeat {repeat + 1}/{args.repeats}: {label[client, burst]}{left}",
                      file=sys.stderr, flush=True)
                cluster.burst_s = burst
                cluster.set_rate(args.rate)
                before = {s: qdisc_counters(tc_text(*nd, "-s", "qdisc")) for s, nd in sides.items()}
                work = tmp / "work"
                argv = [sys.executable, __file__, "--fetch", client, "--url", store.http,
                        "--names", str(tmp / "names.json"), "--store-pids", ",".join(map(str, store.pids)),
                        "--work", str(work)]
                proc = subprocess.run(in_ns(store.reader_ns, *argv), capture_output=True, text=True, timeout=1800,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"})
                shutil.rmtree(work, ignore_errors=True)  # a hasten fetch's cache: a copy of the data set
                if proc.returncode:
                    raise SystemExit(f"the {client} fetch failed (runs so far kept in {args.out}):\n"
                                     f"{proc.stderr.strip()[-3000:]}")
                after = {s: qdisc_counters(tc_text(*nd, "-s", "qdisc")) for s, nd in sides.items()}
                run = json.loads(proc.stdout.strip().splitlines()[-1])
                run.update(config=label[client, burst], client=client, burst=burst_label(burst), repeat=repeat,
                           complete=run["data_bytes"] == sum(sizes), load_average=list(os.getloadavg()),
                           tc={s: {c: after[s][c] - before[s][c] for c in COUNTERS} for s in sides})
                runs.append(run)
                write_json(args.out, {"setup": setup, "runs": runs})
            qdiscs = {s: tc_text(*nd, "-s", "qdisc") for s, nd in sides.items()}
        finally:
            store.close()
    summary = summarize(runs, args.rate)
    print(f"{len(names)} shards of {args.shard_mib} MiB ({sum(sizes) / 1e6:.0f} MB), {args.repeats} repeat(s), "
          f"{hardware_label(cond.as_dict()['environment'])}; {link}")
    print(f"bandwidth-delay product {setup['bdp_bytes'] / 1e6:.2f} MB; hasten's bytes in flight "
          f"{setup['reader_bytes_in_flight'] / 1e6:.1f} MB ({in_flight} GETs of up to {PART_BYTES >> 20} MiB)")
    print_table(summary)
    print(cond.summary())
    write_json(args.out, {"command": " ".join(sys.argv), "setup": setup, "link": link, "summary": summary,
                          "tc_classes": tc_classes, "tc_qdiscs_at_end": qdiscs, "runs": runs,
                          "conditions": cond.as_dict()})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
