"""Start N local ranks of a function, the way torchrun would, optionally one per network namespace.

Each rank is a forked process with torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and an initialised process group, so the
function runs exactly as it would under ``torchrun --nproc-per-node N``. Forking
(rather than spawning a fresh interpreter) saves re-importing torch N times, which
matters on a 2-core machine. With ``placement`` each rank first enters its own
network namespace (see ``hasten.harness.netns``) and gloo is pinned to its veth.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import random
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

from hasten.cpu_time import PPID, pid_stat
from hasten.distributed.p2p import CollectiveError

_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank runs: a network namespace, its interface, and rank 0's address."""
    netns: str
    ifname: str
    master_addr: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _enter_netns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name} failed")
    finally:
        os.close(fd)


def _child(rank, world_size, port, placement, backend, timeout_s, fn, args, conn):
    try:
        import torch

        torch.set_num_threads(1)  # N ranks share the machine's cores
        if backend == "nccl":
            torch.cuda.set_device(rank)
        master_addr = "127.0.0.1"
        if placement is not None:
            _enter_netns(placement.netns)
            os.environ["GLOO_SOCKET_IFNAME"] = placement.ifname
            master_addr = placement.master_addr
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR=master_addr,
                          MASTER_PORT=str(port))
        import torch.distributed as dist

        from hasten.distributed.data_parallel import shutdown

        # Always a real group, world size 1 included, so the algorithms run as they would under torchrun.
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        try:
            # Plain pickle copies tensors by value; multiprocessing's own pickler would pass
            # shared-memory handles that vanish when this process exits.
            conn.send_bytes(pickle.dumps(("ok", fn(rank, world_size, *args))))
        finally:
            shutdown()
    except BaseException as exc:  # reported to the parent, which raises it with the rank
        conn.send_bytes(pickle.dumps(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())))
    finally:
        conn.close()


def spawn(fn: Callable, world_size: int, args: tuple = (), *, backend: str = "gloo",
          timeout_s: float = 60.0, placement: list[RankPlacement] | None = None,
          check: bool = True, join_timeout_s: float | None = None,
          start_method: str = "fork") -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` forked ranks; return their results.

    ``timeout_s`` is the process group's timeout (a dead peer makes the others fail
    after at most this long). The whole launch is killed after ``join_timeout_s``
    (default: 4 x timeout_s + 60 s). ``start_method="spawn"`` starts fresh
    interpreters instead of forking (needed once CUDA is initialised; ``fn`` must
    then be importable). With ``check`` a failed rank raises
    CollectiveError naming it; without, its entry is an ``("error", message)``
    tuple (``("died", exitcode)`` for a rank that exited without reporting).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if placement is not None and len(placement) != world_size:
        raise ValueError(f"placement has {len(placement)} entries for {world_size} ranks")
    if start_method not in ("fork", "spawn"):
        raise ValueError(f"start_method must be 'fork' or 'spawn', got {start_method!r}")
    if backend == "nccl":
        # One GPU per rank, checked here, before any rank dies with "invalid device ordinal".
        from hasten.distributed.data_parallel import rank_device
        rank_device("cuda", world_size - 1, world_size)
    ctx = mp.get_context(start_method)
    port = free_port() if placement is None else random.randint(20000, 60000)
    procs, pipes = [], []
    for rank in range(world_size):
        recv_end, send_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, daemon=True,
                        args=(rank, world_size, port, placement[rank] if placement else None,
                              backend, timeout_s, fn, args, send_end))
        p.start()
        send_end.close()
        procs.append(p)
        pipes.append(recv_end)
    deadline = time.monotonic() + (join_timeout_s if join_timeout_s is not None else 4 * timeout_s + 60)
    results: list = [None] * world_size
    done = [False] * world_size
    try:
        while not all(done):
            if time.monotonic() > deadline:
                raise CollectiveError(f"launch of {world_size} ranks did not finish in time; "
                                      f"ranks still running: {[r for r in range(world_size) if not done[r]]}")
            for rank, (p, conn) in enumerate(zip(procs, pipes)):
                if done[rank]:
                    continue
                if conn.poll(0.05):
                    try:
                        results[rank] = pickle.loads(conn.recv_bytes())
                    except EOFError:
                        p.join(5)
                        results[rank] = ("died", p.exitcode)
                    done[rank] = True
                elif not p.is_alive():
                    results[rank] = ("died", p.exitcode)
                    done[rank] = True
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    if check:
        for rank, res in enumerate(results):
            if res[0] == "error":
                raise CollectiveError(f"rank {rank} failed: {res[1]}\n{res[2]}")
            if res[0] == "died":
                raise CollectiveError(f"rank {rank} exited with code {res[1]} without a result")
        return [res[1] for res in results]
    return [res[1] if res[0] == "ok" else res[:2] for res in results]


def torchrun_worker_pids(parent: int) -> dict[int, int]:
    """RANK -> pid of the worker processes that torchrun (pid ``parent``) started, read
    from /proc (Linux): how fault tests and benchmarks pick the rank to kill."""
    pids = {}
    for d in Path("/proc").iterdir():
        fields = pid_stat(int(d.name)) if d.name.isdigit() else None
        if fields is None:  # not a process, or one that ended meanwhile
            continue
        try:
            ppid = int(fields[PPID])
            env = dict(v.split(b"=", 1) for v in (d / "environ").read_bytes().split(b"\0") if b"=" in v)
        except (OSError, ValueError, IndexError):  # the process ended meanwhile, or is not ours to read
            continue
        if ppid == parent and b"RANK" in env:
            pids[int(env[b"RANK"])] = int(d.name)
    return pids
