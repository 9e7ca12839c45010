"""All-reduce benchmark: ring, 2-D torus, single reducer and the backend's own, beside the cost model.

``run(config)`` launches ``config.world`` local ranks with ``hasten.harness.launch``
(on loopback, or each in its own network namespace with tc-shaped links:
``hasten.harness.netns``), or joins the ranks of torchrun. Every rank calibrates
and times each algorithm at each message size (``hasten.harness.collectives``);
rank 0 then fits the alpha-beta-gamma model's links
(``hasten.distributed.cost_model``) and returns a JSON-able report with the
measured and the predicted time of every case.

Times follow nccl-tests: each iteration starts after a barrier and lasts until
the slowest rank finishes. algbw = bytes / time; busbw = algbw x 2(N-1)/N, the
per-link rate a bandwidth-optimal all-reduce needs, comparable across N and to
the link rate. Only gloo (CPU) is timed.

Changes the training math: no (a benchmark).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from hasten.distributed.cost_model import Link, Network, fit_link, predict
from hasten.distributed.hooks import HOOKS
from hasten.distributed.torus import default_grid, parse_grid
from hasten.errors import ConfigError
from hasten.harness.collectives import BenchConfig, RankTimings, bench_worker
from hasten.harness.launch import spawn

NETWORKS = ("loopback", "emulated")
DEFAULT_SIZES = (1 << 10, 16 << 10, 256 << 10, 4 << 20, 64 << 20, 256 << 20)  # bytes: 1K .. 256M


@dataclass(frozen=True)
class AllreduceConfig:
    """What to time and on which (emulated) network. ``grid`` (torus rows x columns,
    or "RxC") is resolved at construction: nodes x ranks per node with
    ``local_size``, else the most square grid."""
    sizes: tuple[int, ...] = DEFAULT_SIZES  # message bytes, positive multiples of 4 (float32)
    algos: tuple[str, ...] = HOOKS          # "native" is the backend's own all_reduce
    world: int = 4                          # ranks (under torchrun: its WORLD_SIZE)
    iters: int = 5                          # timed iterations per algorithm and size
    warmup: int = 1                         # untimed iterations first
    grid: tuple[int, int] | str | None = None
    network: str = "loopback"               # emulated: one network namespace per rank
    link_gbit: float = 1.0                  # emulated link rate (inside a node)
    inter_gbit: float | None = None         # emulated rate between nodes: two levels, with local_size
    local_size: int | None = None           # ranks per emulated node
    timeout_s: float = 300.0                # before a stuck rank fails

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ConfigError("--sizes: give at least one message size, e.g. 1M")
        bad = [s for s in self.sizes if s < 4 or s % 4]
        if bad:
            raise ConfigError(f"--sizes {bad} are not positive multiples of 4 bytes (float32 elements)")
        unknown = [a for a in self.algos if a not in HOOKS]
        if not self.algos or unknown:
            raise ConfigError(f"--algo must be among {', '.join(HOOKS)}; got {list(self.algos)}")
        if self.world < 1:
            raise ConfigError(f"--world must be >= 1, got {self.world}")
        if self.iters < 1 or self.warmup < 0:
            raise ConfigError(f"--iters must be >= 1 and --warmup >= 0, got {self.iters}, {self.warmup}")
        if self.network not in NETWORKS:
            raise ConfigError(f"--network must be one of {', '.join(NETWORKS)}, got {self.network!r}")
        if (self.inter_gbit is None) != (self.local_size is None):
            raise ConfigError("--inter-gbit and --local-size go together (a two-level network)")
        if self.inter_gbit is not None and self.network != "emulated":
            raise ConfigError("--inter-gbit needs --network emulated")
        if self.local_size is not None and (self.local_size < 1 or self.world % self.local_size):
            raise ConfigError(f"--local-size must divide --world {self.world}, got {self.local_size}")
        if self.link_gbit <= 0 or (self.inter_gbit is not None and self.inter_gbit <= 0):
            raise ConfigError("--link-gbit and --inter-gbit must be positive")
        if self.timeout_s <= 0:
            raise ConfigError(f"--timeout must be positive, got {self.timeout_s}")
        object.__setattr__(self, "grid", self._resolve_grid())

    def _resolve_grid(self) -> tuple[int, int]:
        if self.grid is not None:
            try:
                return parse_grid(self.grid, self.world)
            except ValueError as exc:
                raise ConfigError(f"--grid: {exc}") from None
        if self.local_size:
            return self.world // self.local_size, self.local_size
        return default_grid(self.world)


def human(nbytes: int) -> str:
    """4096 -> '4K', 1 << 20 -> '1M', 100 -> '100B'."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def measure(cfg: AllreduceConfig) -> tuple[RankTimings | None, dict]:
    """Launch (or join, under torchrun) the ranks: rank 0's timings (None on the
    other ranks under torchrun) and a description of the network they ran on."""
    peers = {"link": 1} if cfg.world > 1 else {}
    if cfg.local_size and cfg.world > cfg.local_size:
        peers["inter"] = cfg.local_size  # rank 0's counterpart in the next node
    bench = BenchConfig(cfg.algos, cfg.sizes, cfg.iters, cfg.warmup, cfg.grid, peers)
    if _under_torchrun():
        from hasten.distributed.data_parallel import init_distributed

        info = init_distributed(device="cpu", timeout_s=cfg.timeout_s)
        if info.world_size != cfg.world:
            raise ConfigError(f"--world {cfg.world} differs from torchrun's WORLD_SIZE {info.world_size}")
        timings = bench_worker(info.rank, info.world_size, bench)
        return (timings if info.rank == 0 else None), {"kind": "torchrun"}
    if cfg.network == "emulated":
        from hasten.harness.netns import EmulatedCluster, probe

        reason = probe()
        if reason is None:
            with EmulatedCluster(cfg.world, cfg.link_gbit, inter_rate_gbit=cfg.inter_gbit,
                                 local_size=cfg.local_size) as cluster:
                network = {"kind": "emulated", "description": cluster.describe(), "link_gbit": cfg.link_gbit,
                           "inter_gbit": cfg.inter_gbit, "local_size": cfg.local_size}
                return spawn(bench_worker, cfg.world, (bench,), timeout_s=cfg.timeout_s,
                             placement=cluster.placement)[0], network
        network = {"kind": "loopback", "fallback_reason": reason}
    else:
        network = {"kind": "loopback"}
    return spawn(bench_worker, cfg.world, (bench,), timeout_s=cfg.timeout_s)[0], network


def fit_links(timings: RankTimings) -> tuple[dict[str, Link], dict]:
    """The cost model's links from rank 0's calibration, and the JSON-able calibration.

    beta comes from the ping-pong's slope; alpha from a ring step with all N ranks
    active (the ping-pong's intercept, kept for reference, misses N-process scheduling).
    """
    fits = {name: fit_link(list(timings.pingpong_sizes), times, timings.gamma)
            for name, times in timings.pingpong.items()}
    links = {name: Link(timings.alpha, f.beta, f.gamma) for name, f in fits.items()}
    calibration = {name: {"alpha_s": link.alpha, "beta_s_per_byte": link.beta, "gbit_per_s": link.gbit_per_s,
                          "pingpong_alpha_s": fits[name].alpha}
                   for name, link in links.items()}
    calibration["gamma_s_per_byte"] = timings.gamma
    return links, calibration


def summarize(timings: RankTimings, cfg: AllreduceConfig, links: dict[str, Link]) -> list[dict]:
    """One row per (algorithm, size): mean and spread, bandwidths, and the model's time."""
    model = Network(links["link"], links.get("inter"), cfg.local_size) if "link" in links else None
    world = cfg.world
    rows = []
    for (algo, nbytes), times in timings.times.items():
        mean = statistics.fmean(times)
        algbw = nbytes / mean / 1e9
        rows.append({
            "algo": algo, "bytes": nbytes, "n": len(times), "time_s": mean,
            "time_std_s": statistics.stdev(times) if len(times) > 1 else 0.0,
            "times_s": times, "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (world - 1) / world if world > 1 else 0.0,
            "predicted_time_s": predict(algo, nbytes, world, model, cfg.grid) if model else None,
        })
    return rows


def run(cfg: AllreduceConfig) -> dict | None:
    """Measure and model; the JSON-able report (None on ranks other than 0 under torchrun)."""
    timings, network = measure(cfg)
    if timings is None:
        return None
    links, calibration = fit_links(timings)
    return {"world_size": cfg.world, "backend": "gloo", "network": network, "grid": list(cfg.grid),
            "calibration": calibration, "results": summarize(timings, cfg, links)}


def network_label(report: dict) -> str:
    return report["network"].get("description", report["network"]["kind"])


def format_calibration(calibration: dict) -> str:
    return ", ".join(f"{name} alpha {c['alpha_s'] * 1e6:.0f} us, {c['gbit_per_s']:.2f} Gbit/s"
                     for name, c in calibration.items() if isinstance(c, dict))


def format_table(rows: list[dict]) -> str:
    lines = [f"{'algo':<7} {'size':>6} {'time ms':>10} {'+-':>7} {'algbw GB/s':>10} "
             f"{'busbw GB/s':>10} {'model ms':>9}"]
    for r in rows:
        pred = f"{r['predicted_time_s'] * 1e3:9.3f}" if r["predicted_time_s"] is not None else f"{'-':>9}"
        std = f"{r['time_std_s'] * 1e3:7.3f}" if r["n"] > 1 else f"{'-':>7}"  # one iteration: no spread
        lines.append(f"{r['algo']:<7} {human(r['bytes']):>6} {r['time_s'] * 1e3:10.3f} "
                     f"{std} {r['algbw_gbps']:10.4f} {r['busbw_gbps']:10.4f} {pred}")
    return "\n".join(lines)
