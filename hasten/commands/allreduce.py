"""``hasten allreduce``: time ring / torus / naive / the backend's all-reduce, beside the cost model.

Local ranks on loopback:      hasten allreduce --world 4 --sizes 1K,1M,64M
Emulated 1 Gbit/s cluster:    hasten allreduce --world 8 --network emulated --link-gbit 1
Two-level (2 nodes x 4):      hasten allreduce --world 8 --network emulated --link-gbit 1 \\
                                  --inter-gbit 0.25 --local-size 4
Under torchrun:               torchrun --nproc-per-node 4 -m hasten allreduce --sizes 1M
"""

from __future__ import annotations

import argparse
import os
import statistics

from hasten.errors import ConfigError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30}
DEFAULT_SIZES = "1K,16K,256K,4M,64M,256M"


def parse_size(text: str) -> int:
    """'64K', '1M', '256MB' or '4096' -> bytes; a positive multiple of 4 (float32 elements)."""
    t = text.strip().upper()
    digits = t.rstrip("BKMG")
    unit = t[len(digits):]
    if not digits.isdigit() or unit not in _UNITS:
        raise ConfigError(f"--sizes: cannot read {text!r}; use e.g. 1K, 64K, 1M, 256M or a byte count")
    nbytes = int(digits) * _UNITS[unit]
    if nbytes < 4 or nbytes % 4:
        raise ConfigError(f"--sizes: {text!r} is {nbytes} bytes; sizes must be positive multiples "
                          "of 4 bytes (float32 elements)")
    return nbytes


def human(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hasten.harness.collectives import BENCH_ALGORITHMS

    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--algo", nargs="+", default=list(BENCH_ALGORITHMS), choices=BENCH_ALGORITHMS,
                   help="algorithms to time ('native' is the backend's own all_reduce)")
    p.add_argument("--world", type=int, default=4, help="local ranks to launch (ignored under torchrun)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="message sizes, comma-separated")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per algorithm and size")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    p.add_argument("--grid", help="torus grid RxC (default: nodes x local ranks, else most square)")
    p.add_argument("--network", choices=["loopback", "emulated"], default="loopback",
                   help="emulated: one network namespace per rank with tc-shaped links")
    p.add_argument("--link-gbit", type=float, default=1.0, help="emulated link rate (inside a node)")
    p.add_argument("--inter-gbit", type=float, help="emulated rate between nodes (two levels)")
    p.add_argument("--local-size", type=int, help="ranks per emulated node (with --inter-gbit)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a stuck rank fails")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--plot", help="also write the PNG plot here")


def validate(args) -> tuple[list[int], int]:
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes:
        raise ConfigError("--sizes: give at least one size, e.g. 1M")
    world = int(os.environ.get("WORLD_SIZE", args.world))
    if world < 1:
        raise ConfigError(f"--world must be >= 1, got {world}")
    if args.iters < 1 or args.warmup < 0:
        raise ConfigError(f"--iters must be >= 1 and --warmup >= 0, got {args.iters}, {args.warmup}")
    if (args.inter_gbit is None) != (args.local_size is None):
        raise ConfigError("--inter-gbit and --local-size go together (a two-level network)")
    if args.inter_gbit is not None and args.network != "emulated":
        raise ConfigError("--inter-gbit needs --network emulated")
    if args.local_size is not None and (args.local_size < 1 or world % args.local_size):
        raise ConfigError(f"--local-size must divide --world {world}, got {args.local_size}")
    if args.link_gbit <= 0 or (args.inter_gbit is not None and args.inter_gbit <= 0):
        raise ConfigError("--link-gbit and --inter-gbit must be positive")
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout}")
    return sizes, world


def _grid(args, world: int) -> tuple[int, int]:
    from hasten.distributed.torus import default_grid, parse_grid

    if args.grid:
        try:
            return parse_grid(args.grid, world)
        except ValueError as exc:
            raise ConfigError(f"--grid: {exc}") from None
    if args.local_size:
        return world // args.local_size, args.local_size
    return default_grid(world)


def summarize(raw: dict, world: int, grid, network) -> tuple[list[dict], dict]:
    """Per (algo, size) statistics and cost-model predictions from rank 0's raw timings."""
    from hasten.distributed.cost_model import Link, Network, fit_link, predict
    from hasten.harness.collectives import BenchConfig

    sizes = BenchConfig.__dataclass_fields__["calibrate_sizes"].default
    # beta from the ping-pong's slope; alpha from a ring step with all N ranks active
    # (the ping-pong's intercept, kept for reference, misses N-process scheduling).
    fits = {name: fit_link(list(sizes), times, raw["gamma"]) for name, times in raw["calibration"].items()}
    links = {name: Link(raw["alpha"], f.beta, f.gamma) for name, f in fits.items()}
    model = None
    if "link" in links:
        model = Network(links["link"], links.get("inter"), network.get("local_size"))
    rows = []
    for (algo, nbytes), times in raw["times"].items():
        mean = statistics.fmean(times)
        algbw = nbytes / mean / 1e9
        rows.append({
            "algo": algo, "bytes": nbytes, "n": len(times), "time_s": mean,
            "time_std_s": statistics.stdev(times) if len(times) > 1 else 0.0,
            "times_s": times, "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (world - 1) / world if world > 1 else 0.0,
            "predicted_time_s": predict(algo, nbytes, world, model, grid) if model else None,
        })
    calibration = {name: {"alpha_s": l.alpha, "beta_s_per_byte": l.beta, "gbit_per_s": l.gbit_per_s,
                          "pingpong_alpha_s": fits[name].alpha}
                   for name, l in links.items()}
    calibration["gamma_s_per_byte"] = raw["gamma"]
    return rows, calibration


def format_table(rows: list[dict]) -> str:
    lines = [f"{'algo':<7} {'size':>6} {'time ms':>10} {'+-':>7} {'algbw GB/s':>10} "
             f"{'busbw GB/s':>10} {'model ms':>9}"]
    for r in rows:
        pred = f"{r['predicted_time_s'] * 1e3:9.3f}" if r["predicted_time_s"] is not None else f"{'-':>9}"
        lines.append(f"{r['algo']:<7} {human(r['bytes']):>6} {r['time_s'] * 1e3:10.3f} "
                     f"{r['time_std_s'] * 1e3:7.3f} {r['algbw_gbps']:10.4f} {r['busbw_gbps']:10.4f} {pred}")
    return "\n".join(lines)


def plot(rows: list[dict], path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for algo in dict.fromkeys(r["algo"] for r in rows):
        rs = [r for r in rows if r["algo"] == algo]
        xs = [r["bytes"] for r in rs]
        line, = ax_t.plot(xs, [r["time_s"] for r in rs], "o-", label=algo)
        if all(r["predicted_time_s"] for r in rs):
            ax_t.plot(xs, [r["predicted_time_s"] for r in rs], "--", color=line.get_color(), alpha=0.6)
        ax_b.plot(xs, [r["busbw_gbps"] for r in rs], "o-", label=algo)
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.grid(alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (s); dashed: cost model")
    ax_b.set_ylabel("busbw (GB/s)")
    ax_b.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure(args, sizes: list[int], world: int) -> dict:
    """Launch (or join, under torchrun) the ranks and return the JSON-able report."""
    from hasten.harness.launch import spawn
    from hasten.harness.collectives import BenchConfig, bench_worker

    grid = _grid(args, world)
    peers = {"link": 1} if world > 1 else {}
    if args.local_size and world > args.local_size:
        peers["inter"] = args.local_size
    cfg = BenchConfig(tuple(args.algo), tuple(sizes), args.iters, args.warmup, grid, peers)
    network = {"kind": args.network}
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        from hasten.distributed.data_parallel import init_distributed

        info = init_distributed(device="cpu", timeout_s=args.timeout)
        raw = bench_worker(info.rank, info.world_size, cfg)
        if info.rank != 0:
            return {}
        network = {"kind": "torchrun"}
    elif args.network == "emulated":
        from hasten.harness.netns import EmulatedCluster, probe

        reason = probe()
        if reason is None:
            with EmulatedCluster(world, args.link_gbit, inter_rate_gbit=args.inter_gbit,
                                 local_size=args.local_size) as cluster:
                network = {"kind": "emulated", "description": cluster.describe(),
                           "link_gbit": args.link_gbit, "inter_gbit": args.inter_gbit,
                           "local_size": args.local_size}
                raw = spawn(bench_worker, world, (cfg,), timeout_s=args.timeout,
                            placement=cluster.placement)[0]
        else:
            print(f"hasten allreduce: network namespaces unavailable ({reason}); "
                  "falling back to loopback")
            network = {"kind": "loopback", "fallback_reason": reason}
            raw = spawn(bench_worker, world, (cfg,), timeout_s=args.timeout)[0]
    else:
        raw = spawn(bench_worker, world, (cfg,), timeout_s=args.timeout)[0]
    rows, calibration = summarize(raw, world, grid, network)
    return {"world_size": world, "backend": "gloo", "network": network, "grid": list(grid),
            "calibration": calibration, "results": rows}


def run(args: argparse.Namespace) -> int:
    from hasten.environment import describe_environment, hardware_label
    from hasten.rundir import RunDir, write_json

    sizes, world = validate(args)
    report = measure(args, sizes, world)
    if not report:  # a non-zero rank under torchrun
        return 0
    env = describe_environment("cpu")
    report["environment"] = env
    with RunDir("allreduce") as rd:
        rd.write_config({k: v for k, v in vars(args).items() if not k.startswith("_")})
        for row in report["results"]:
            rd.log(**{k: v for k, v in row.items() if k != "times_s"})
        rd.write_results(report)
        title = (f"all-reduce, {world} ranks, gloo, {report['network'].get('description', report['network']['kind'])}"
                 f"\n{hardware_label(env)}, torch {env['torch']}")
        plot(report["results"], rd.path / "allreduce.png", title)
        if args.plot:
            plot(report["results"], args.plot, title)
        if args.json:
            write_json(args.json, report)
        print(f"{world} ranks, {report['network'].get('description', report['network']['kind'])}; "
              f"calibrated: " + ", ".join(
                  f"{k} alpha {v['alpha_s'] * 1e6:.0f} us, {v['gbit_per_s']:.2f} Gbit/s"
                  for k, v in report["calibration"].items() if isinstance(v, dict)))
        print(format_table(report["results"]))
        print(f"run directory: {rd.path}")
    return 0
