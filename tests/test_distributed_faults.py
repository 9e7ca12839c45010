"""A rank that dies or hangs mid-collective: the others stop with a clear error in time."""

import os
import time

import pytest
import torch
import torch.distributed as dist

from hasten.distributed import CollectiveError, naive_allreduce, ring_allreduce, torus_allreduce
from hasten.harness.launch import spawn

TIMEOUT_S = 3.0


def _worker(rank, world, fault, algo):
    fn = {"ring": ring_allreduce, "naive": naive_allreduce, "torus": torus_allreduce}[algo]
    x = torch.ones(1000)
    fn(x, timeout_s=TIMEOUT_S)  # a healthy round first: the links are up
    dist.barrier()
    if rank == world - 1:
        if fault == "kill":
            os._exit(1)
        time.sleep(TIMEOUT_S + 1.5)  # hung: alive, but never joins the collective
        return "slept"
    start = time.monotonic()
    try:
        fn(x, timeout_s=TIMEOUT_S, check_sizes=False)
    except CollectiveError as exc:
        return ("error", str(exc), time.monotonic() - start)
    return ("no error", time.monotonic() - start)


@pytest.mark.multiproc
@pytest.mark.parametrize("fault, algo", [("kill", "ring"), ("kill", "torus"), ("hang", "ring"),
                                         ("hang", "naive")])
def test_dead_or_hung_rank_gives_clear_error_within_timeout(fault, algo):
    world = 4
    results = spawn(_worker, world, (fault, algo), timeout_s=TIMEOUT_S, check=False,
                    join_timeout_s=40)
    if fault == "kill":
        assert results[-1] == ("died", 1)
    for rank, res in enumerate(results[:-1]):
        assert res[0] == "error", f"rank {rank}: {res}"
        assert "did not complete" in res[1] and f"rank {rank}" in res[1]
        # 1 s slack for 4 processes on 2 shared cores
        assert res[2] < TIMEOUT_S + 1.0, f"rank {rank} took {res[2]:.1f} s"


def _ddp_worker(rank, world):
    from hasten.distributed import wrap_ddp

    model = wrap_ddp(torch.nn.Linear(10, 10), hook="ring", timeout_s=TIMEOUT_S)
    for _ in range(3):  # past DDP's bucket rebuild: later steps all-reduce through the hook only
        model(torch.randn(4, 10)).sum().backward()
    dist.barrier()
    if rank == world - 1:
        os._exit(1)
    start = time.monotonic()
    try:
        model(torch.randn(4, 10)).sum().backward()
    except RuntimeError as exc:
        return ("error", str(exc), time.monotonic() - start)
    return ("no error", time.monotonic() - start)


@pytest.mark.multiproc
def test_rank_killed_during_ddp_backward_fails_the_others():
    results = spawn(_ddp_worker, 3, timeout_s=TIMEOUT_S, check=False, join_timeout_s=40)
    assert results[-1] == ("died", 1)
    for rank, res in enumerate(results[:-1]):
        assert res[0] == "error" and "did not complete" in res[1], f"rank {rank}: {res}"
        assert res[2] < TIMEOUT_S + 1.0
