"""What runs inside each rank of an all-reduce benchmark: timing, checking, calibration.

Times follow nccl-tests: each iteration starts after a barrier and lasts until the
slowest rank finishes (the max over ranks). algbw = bytes / time; busbw = algbw x
2(N-1)/N, the per-link rate a bandwidth-optimal all-reduce needs, comparable
across N and to the link rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hasten.distributed.hooks import HOOKS, allreduce
from hasten.distributed.torus import torus_allreduce
from hasten.progress import progress, progress_enabled
from hasten.timing import Stopwatch, interleaved

# Message sizes (bytes) of the rank 0 <-> peer ping-pong that calibrates a link's beta.
CALIBRATION_SIZES = (4, 64 << 10, 1 << 20, 8 << 20)


@dataclass(frozen=True)
class BenchConfig:
    algos: tuple[str, ...]          # each one of hasten.distributed.hooks.HOOKS
    sizes: tuple[int, ...]          # bytes, float32 tensors
    iters: int = 5
    warmup: int = 1
    grid: tuple[int, int] | None = None
    calibrate_peers: dict = field(default_factory=lambda: {"link": 1})  # name -> peer of rank 0
    calibrate_sizes: tuple[int, ...] = CALIBRATION_SIZES

    def __post_init__(self) -> None:
        unknown = [a for a in self.algos if a not in HOOKS]
        if unknown:
            raise ValueError(f"unknown all-reduce algorithms {unknown}; choose from {HOOKS}")


@dataclass(frozen=True)
class RankTimings:
    """What rank 0 measured: one-way ping-pong seconds per calibration peer, one per
    size of ``pingpong_sizes``; the model's alpha and gamma; and seconds per
    iteration per (algorithm, bytes)."""
    pingpong_sizes: tuple[int, ...]
    pingpong: dict[str, list[float]]
    alpha: float
    gamma: float
    times: dict[tuple[str, int], list[float]]


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_allreduce(algo: str, nbytes: int, iters: int, warmup: int, grid=None) -> list[float]:
    """Seconds per iteration (slowest rank); raises if the sum is ever wrong."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.empty(max(1, nbytes // 4), dtype=torch.float32)
    expected = world * (world + 1) / 2  # exact in float32 for these small integers
    clock = Stopwatch()
    times = []
    for i in range(warmup + iters):
        x.fill_(rank + 1)
        dist.barrier()
        clock.start()
        allreduce(x, algo, grid=grid, check_sizes=False)
        elapsed = clock.stop()
        if not bool((x == expected).all()):
            raise RuntimeError(f"{algo} all-reduce of {nbytes} bytes gave a wrong sum on rank {rank}")
        elapsed = _slowest(elapsed)
        if i >= warmup:
            times.append(elapsed)
    return times


def ping_pong(peer: int, sizes: tuple[int, ...], iters: int = 3) -> list[float]:
    """One-way seconds rank 0 <-> ``peer`` for each size (half the best round trip); others idle."""
    rank = dist.get_rank()
    clock = Stopwatch()
    out = []
    for nbytes in sizes:
        buf = torch.empty(max(1, nbytes // 4), dtype=torch.float32)
        best = float("inf")
        for _ in range(iters + 1):  # the first round trip also sets up the connection
            dist.barrier()
            clock.start()
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            elif rank == peer:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            best = min(best, clock.stop())
        out.append(best / 2)
    return out


def step_latency(iters: int = 20) -> float:
    """Seconds per ring step of a 4-byte message with every rank active: the model's alpha.

    Every rank sends to its right neighbour and receives from its left at once, as in
    a ring step, so the time includes what a 2-rank ping-pong does not see: waiting
    for N processes to be scheduled (on a machine with fewer cores than ranks, the
    larger part of alpha).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return 0.0
    send, recv = torch.zeros(1), torch.zeros(1)
    right, left = (rank + 1) % world, (rank - 1) % world
    clock = Stopwatch()
    for i in range(iters + 2):  # two untimed steps set up the connections
        if i == 2:
            dist.barrier()
            clock.start()
        works = [dist.irecv(recv, left), dist.isend(send, right)]
        for w in works:
            w.wait()
    return _slowest(clock.stop() / iters)


def gamma_per_byte(nbytes: int = 32 << 20, iters: int = 5) -> float:
    """Seconds per byte to add two float32 tensors on this machine (the model's gamma)."""
    a, b = torch.ones(nbytes // 4), torch.ones(nbytes // 4)
    a.add_(b)
    with Stopwatch() as clock:
        for _ in range(iters):
            a.add_(b)
    return clock.elapsed / iters / nbytes


def bench_worker(rank: int, world: int, cfg: BenchConfig) -> RankTimings:
    """Calibrate, warm up every case, then time ``cfg.iters`` rounds of every algorithm
    at every size, each round in a shuffled order; rank 0's timings are the result."""
    pingpong = {}
    if world > 1:
        for name, peer in cfg.calibrate_peers.items():
            pingpong[name] = ping_pong(peer, cfg.calibrate_sizes)
    alpha = step_latency()
    gamma = gamma_per_byte()
    if "torus" in cfg.algos:
        torus_allreduce(torch.ones(world), cfg.grid)  # creates the subgroups outside the timing
    cases = [(algo, nbytes) for algo in cfg.algos for nbytes in cfg.sizes]
    hidden = rank != 0 or not progress_enabled()
    for algo, nbytes in progress(cases, desc="all-reduce warm-up", unit="case",
                                  disable=hidden or not cfg.warmup):
        time_allreduce(algo, nbytes, 0, cfg.warmup, cfg.grid)
    # One iteration of every case per round, in a shuffled order: load that drifts
    # during the run spreads over all cases instead of landing on whichever ran last.
    # The seed is fixed, so every rank draws the same order (a must: they run in step).
    times = {case: [] for case in cases}
    schedule = list(interleaved(cases, cfg.iters, seed=0))
    for _, (algo, nbytes) in progress(schedule, desc="all-reduce", unit="case", disable=hidden):
        times[(algo, nbytes)] += time_allreduce(algo, nbytes, 1, 0, cfg.grid)
    return RankTimings(cfg.calibrate_sizes, pingpong, alpha, gamma, times)
