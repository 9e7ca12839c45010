"""``hasten allreduce``: time ring / torus / naive / the backend's all-reduce, beside the cost model.

Local ranks on loopback:      hasten allreduce --world 4 --sizes 1K,1M,64M
Emulated 1 Gbit/s cluster:    hasten allreduce --world 8 --network emulated --link-gbit 1
Two-level (2 nodes x 4):      hasten allreduce --world 8 --network emulated --link-gbit 1 \\
                                  --inter-gbit 0.25 --local-size 4
Under torchrun:               torchrun --nproc-per-node 4 -m hasten allreduce --sizes 1M

The method is ``hasten.recipes.allreduce``; this parses, runs it and prints.
"""

from __future__ import annotations

import argparse
import os

# The ranks' C++ warnings say nothing to the user: in network namespaces each TCP store
# connection logs "[c10d] The hostname of the client socket cannot be retrieved" (no
# reverse DNS there). Read once, when torch loads, hence here, before the first import.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from hasten import cli_types as t
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


# Largest message: each rank holds a few buffers of it.
MAX_SIZE = 64 << 30


def sizes_type(text: str) -> str:
    """``--sizes``: comma-separated sizes, each read by :func:`parse_size`; at least one."""
    sizes = [s for s in str(text).split(",") if s.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError("give at least one message size, e.g. 1K,1M,64M")
    for s in sizes:
        try:
            nbytes = parse_size(s)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("--sizes: ")) from None
        if nbytes > MAX_SIZE:
            raise argparse.ArgumentTypeError(f"{s!r} is larger than the largest size, {MAX_SIZE >> 30}G")
    return text


def grid_type(text: str) -> str:
    """``--grid``: rows x columns, e.g. 2x4 (checked against the world size later)."""
    parts = str(text).lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"must look like 2x4 (rows x columns, each >= 1), got {text!r}")
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hasten.distributed.hooks import HOOKS

    p.add_argument("--algo", nargs="+", default=list(HOOKS), choices=HOOKS,
                   help="algorithms to time ('native' is the backend's own all_reduce)")
    p.add_argument("--world", type=t.int_range(1, 1024), default=4,
                   help="local ranks to launch (ignored under torchrun)")
    p.add_argument("--sizes", type=sizes_type, default=DEFAULT_SIZES, help="message sizes, comma-separated")
    p.add_argument("--iters", type=t.positive_int, default=5, help="timed iterations per algorithm and size")
    p.add_argument("--warmup", type=t.nonneg_int, default=1, help="untimed iterations first")
    p.add_argument("--grid", type=grid_type, help="torus grid RxC (default: nodes x local ranks, else most square)")
    p.add_argument("--network", choices=["loopback", "emulated"], default="loopback",
                   help="emulated: one network namespace per rank with tc-shaped links")
    p.add_argument("--link-gbit", type=t.positive_float, default=1.0, help="emulated link rate (inside a node)")
    p.add_argument("--inter-gbit", type=t.positive_float, help="emulated rate between nodes (two levels)")
    p.add_argument("--local-size", type=t.positive_int, help="ranks per emulated node (with --inter-gbit)")
    p.add_argument("--timeout", type=t.positive_float, default=300.0, help="seconds before a stuck rank fails")
    p.add_argument("--json", type=t.output_file, help="also write the results to this JSON file")
    p.add_argument("--plot", type=t.output_file, help="also write the PNG plot here")


def config_from(args: argparse.Namespace):
    from hasten.recipes.allreduce import AllreduceConfig

    return AllreduceConfig(
        sizes=tuple(parse_size(s) for s in args.sizes.split(",") if s.strip()), algos=tuple(args.algo),
        world=int(os.environ.get("WORLD_SIZE", args.world)), iters=args.iters, warmup=args.warmup,
        grid=args.grid, network=args.network, link_gbit=args.link_gbit, inter_gbit=args.inter_gbit,
        local_size=args.local_size, timeout_s=args.timeout)


def check_memory(cfg) -> None:
    """``ConfigError`` when the largest message cannot fit this machine's ranks' buffers."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.world))
    need = 3 * max(cfg.sizes) * ranks  # each rank: the tensor and about two message-sized buffers
    if need > total:
        raise ConfigError(f"--sizes up to {max(cfg.sizes) / 2**30:.1f} GiB on {ranks} ranks need about "
                          f"{need / 2**30:.0f} GiB of memory; this machine has {total / 2**30:.0f} GiB")


def run(args: argparse.Namespace) -> int:
    from hasten.environment import hardware_label
    from hasten.plots import plot_allreduce
    from hasten.progress import progress_interval, progress_mode, status
    from hasten.recipes import allreduce as recipe
    from hasten.rundir import RunDir, write_json

    cfg = config_from(args)
    check_memory(cfg)
    if progress_mode() == "lines" and int(os.environ.get("RANK", "0")) == 0:  # on a terminal the bar says it
        status(f"hasten allreduce: {cfg.world} ranks, {cfg.network} network, {len(cfg.algos)} algorithm(s) x "
               f"{len(cfg.sizes)} size(s), {cfg.iters} timed iteration(s) each; progress every "
               f"{progress_interval():g} s")
    report = recipe.run(cfg)
    if report is None:  # a non-zero rank under torchrun
        return 0
    if "fallback_reason" in report["network"]:
        print(f"hasten allreduce: network namespaces unavailable ({report['network']['fallback_reason']}); "
              "fell back to loopback")
    with RunDir("allreduce", device="cpu") as rd:
        report["environment"] = rd.environment
        rd.write_config({k: v for k, v in vars(args).items() if not k.startswith("_")})
        for row in report["results"]:
            rd.log(**{k: v for k, v in row.items() if k != "times_s"})
        rd.write_results(report)
        title = (f"all-reduce, {cfg.world} ranks, gloo, {recipe.network_label(report)}"
                 f"\n{hardware_label(rd.environment)}, torch {rd.environment['torch']}")
        for path in [rd.path / "allreduce.png"] + ([args.plot] if args.plot else []):
            plot_allreduce(report["results"], path, title)
        if args.json:
            write_json(args.json, report)
        print(f"{cfg.world} ranks, {recipe.network_label(report)}; "
              f"calibrated: {recipe.format_calibration(report['calibration'])}")
        print(recipe.format_table(report["results"]))
        print(f"run directory: {rd.path}")
    return 0
