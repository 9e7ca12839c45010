"""ring / torus / naive all-reduce equal torch.distributed.all_reduce (gloo on localhost).

One spawned job per world size runs every case on one process group: spawning per
case would cost more than the checks themselves on 2 cores.
"""

import pytest
import torch
import torch.distributed as dist

from hasten.distributed import (HOOKS, TensorMismatchError, allreduce, hierarchical_allreduce,
                                naive_allreduce, ring_allreduce, torus_allreduce)
from hasten.harness.launch import spawn
from hasten.distributed.torus import default_grid, parse_grid

SIZES = [0, 1, 3, 7, 1001]  # includes fewer elements than ranks, and odd sizes
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64]
GRIDS = {1: [(1, 1)], 2: [(1, 2), (2, 1)], 3: [(1, 3), (3, 1)], 4: [(2, 2), (1, 4), (4, 1)],
         5: [(1, 5), (5, 1)], 6: [(2, 3), (3, 2)], 8: [(2, 4), (4, 2), (1, 8), (8, 1)]}


def _input(rank, size, dtype):
    g = torch.Generator().manual_seed(1000 * rank + size)
    if dtype == torch.int64:
        return torch.randint(-1000, 1000, (size,), generator=g)
    return (torch.randn(size, generator=g, dtype=torch.float64) * 3).to(dtype)


def _algorithms(world):
    algos = {"ring": ring_allreduce, "naive": naive_allreduce,
             # a segment smaller than a chunk exercises the pipelined path
             "ring-seg16B": lambda t: ring_allreduce(t, segment_bytes=16)}
    for grid in GRIDS[world]:
        algos[f"torus-{grid[0]}x{grid[1]}"] = lambda t, grid=grid: torus_allreduce(t, grid)
    if world % 2 == 0:
        algos["hierarchical"] = lambda t: hierarchical_allreduce(t, local_size=2)
    for name in HOOKS:  # the dispatch by name that the DDP hooks and the benchmark harness share
        algos[f"by-name-{name}"] = lambda t, name=name: allreduce(t, name)
    return algos


def _worker(rank, world):
    failures = []
    for size in SIZES:
        for dtype in DTYPES:
            x = _input(rank, size, dtype)
            expected = x.clone()
            dist.all_reduce(expected)
            exact = sum(_input(r, size, dtype).double() for r in range(world))
            for name, fn in _algorithms(world).items():
                y = x.clone()
                out = fn(y)
                if out is not y or y.dtype != dtype:
                    failures.append((name, size, dtype, "not in place"))
                elif dtype == torch.int64:
                    if not torch.equal(y, expected):
                        failures.append((name, size, dtype, "differs"))
                else:
                    # bf16 rounds at every partial sum; bound the error by N roundings of the largest one
                    eps = {torch.float32: 1e-6, torch.float64: 1e-12, torch.bfloat16: 2 ** -8}[dtype]
                    bound = world * eps * (exact.abs().max().item() + 3 * world) if size else 0
                    err = (y.double() - exact).abs().max().item() if size else 0
                    if err > bound:
                        failures.append((name, size, dtype, err, bound))
    # non-contiguous input is summed and written back in place
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (rank + 1)
    for name, fn in _algorithms(world).items():
        y = x.clone().t().t()  # same non-contiguous layout
        fn(y)
        if not torch.allclose(y, x / (rank + 1) * world * (world + 1) / 2):
            failures.append((name, "non-contiguous"))
    # different sizes on different ranks: a clear error on every rank, and the group survives
    if world > 1:
        for name, fn in {"ring": ring_allreduce, "naive": naive_allreduce,
                         "torus": torus_allreduce}.items():
            try:
                fn(torch.ones(5 + (rank == world - 1)))
                failures.append((name, "mismatch not detected"))
            except TensorMismatchError as exc:
                if f"rank {world - 1}: 6 x float32" not in str(exc):
                    failures.append((name, "unclear message", str(exc)))
        y = torch.ones(4)
        ring_allreduce(y)
        if not torch.equal(y, torch.full((4,), float(world))):
            failures.append(("ring after mismatch", y))
    return failures


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 8])
def test_algorithms_equal_backend_all_reduce(world):
    for rank, failures in enumerate(spawn(_worker, world, timeout_s=60)):
        assert failures == [], f"rank {rank}: {failures[:5]}"


def test_grid_parsing_and_validation():
    assert parse_grid("2x3", 6) == (2, 3) and parse_grid((4, 1), 4) == (4, 1)
    assert default_grid(8) == (2, 4) and default_grid(7) == (1, 7) and default_grid(16) == (4, 4)
    with pytest.raises(ValueError, match=r"grid 2x3 holds 6 ranks but the group has 8"):
        parse_grid((2, 3), 8)
    with pytest.raises(ValueError, match="must look like"):
        parse_grid("2by4", 8)


def test_without_process_group_is_a_clear_error():
    from hasten.distributed import CollectiveError

    with pytest.raises(CollectiveError, match="not initialised"):
        ring_allreduce(torch.ones(3))


def test_allreduce_by_name_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match=r"one of \('native', 'ring', 'torus', 'naive'\), got 'tree'"):
        allreduce(torch.ones(3), "tree")
