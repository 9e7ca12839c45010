"""ring / torus / naive all-reduce equal torch.distributed.all_reduce (gloo on localhost).

One spawned job per world size runs every case on one process group: spawning per
case would cost more than the checks themselves on 2 cores.
"""

import os

import pytest
import torch
import torch.distributed as dist

from hasten.distributed import (HOOKS, TensorMismatchError, allreduce, hierarchical_allreduce,
                                naive_allreduce, ring_allreduce, torus_allreduce)
from hasten.harness.launch import spawn
from hasten.distributed.torus import default_grid, parse_grid

# How long a rank waits for a peer before the collective fails. scripts/mutation.py lowers it:
# many broken variants of the ring deadlock, and each would otherwise cost a full minute.
TIMEOUT_S = float(os.environ.get("HASTEN_TEST_COLLECTIVE_TIMEOUT_S", "60"))
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
                message = str(exc)
                if not message.startswith(f"{name}_allreduce: ") or f"rank {world - 1}: 6 x float32" not in message:
                    failures.append((name, "unclear message", str(exc)))
        y = torch.ones(4)
        ring_allreduce(y)
        if not torch.equal(y, torch.full((4,), float(world))):
            failures.append(("ring after mismatch", y))
    return failures


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 8])
def test_algorithms_equal_backend_all_reduce(world):
    for rank, failures in enumerate(spawn(_worker, world, timeout_s=TIMEOUT_S)):
        assert failures == [], f"rank {rank}: {failures[:5]}"


def test_grid_parsing_and_validation():
    assert parse_grid("2x3", 6) == (2, 3) and parse_grid((4, 1), 4) == (4, 1)
    assert default_grid(8) == (2, 4) and default_grid(7) == (1, 7) and default_grid(16) == (4, 4)
    with pytest.raises(ValueError, match=r"grid 2x3 holds 6 ranks but the group has 8"):
        parse_grid((2, 3), 8)
    with pytest.raises(ValueError, match="must look like"):
        parse_grid("2by4", 8)
    with pytest.raises(ValueError, match="must look like"):
        parse_grid("2x4x1", 8)
    with pytest.raises(ValueError, match=r"^grid must be \(rows, columns\) or 'RxC', got 8$"):
        parse_grid(8, 8)
    assert parse_grid(" 2 X 4 ", 8) == (2, 4)
    # most square, rows <= columns, and plain ints (callers use them as sizes)
    for n, grid in {2: (1, 2), 6: (2, 3), 12: (3, 4), 15: (3, 5), 9: (3, 3)}.items():
        assert default_grid(n) == grid and all(type(v) is int for v in default_grid(n))


def _torus_groups_worker(rank, world):
    from datetime import timedelta

    from hasten.distributed import torus

    made = []
    real_new_group = dist.new_group

    def recording_new_group(ranks, **kwargs):
        made.append((list(ranks), kwargs.get("timeout")))
        return real_new_group(ranks, **kwargs)

    torus.dist.new_group = recording_new_group  # a forked rank: nothing to restore
    failures = []
    square = torus.torus_groups((2, 2), timeout_s=9.0)
    # only its own row and column, with the timeout
    if made != [([rank // 2 * 2, rank // 2 * 2 + 1], timedelta(seconds=9)),
                ([rank % 2, rank % 2 + 2], timedelta(seconds=9))]:
        failures.append(("groups made", made))
    if torus.torus_groups((2, 2)) is not square or len(made) != 2:
        failures.append("the groups of a grid are not reused")
    line = torus.torus_groups("1x4")
    if (square.grid, square.row_ranks, square.col_ranks) != ((2, 2), [rank // 2 * 2, rank // 2 * 2 + 1],
                                                              [rank % 2, rank % 2 + 2]):
        failures.append(("2x2", square))
    if (line.grid, line.row_ranks, line.col_ranks) != ((1, 4), [0, 1, 2, 3], [rank]):
        failures.append(("1x4", line))
    # a torus over a subgroup: two pairs, each summing on its own
    pairs = [real_new_group([0, 1]), real_new_group([2, 3])]
    mine = pairs[rank // 2]
    for fn in (lambda t: torus_allreduce(t, group=mine), lambda t: torus_allreduce(t, (2, 1), mine),
               lambda t: hierarchical_allreduce(t, local_size=2, group=mine),
               lambda t: ring_allreduce(t, mine)):
        x = torch.full((5,), float(rank))
        fn(x)
        if not torch.equal(x, torch.full((5,), float(rank // 2 * 4 + 1))):
            failures.append(("subgroup", x))
    for local_size in (0, 3, 8):
        try:
            hierarchical_allreduce(torch.ones(3), local_size=local_size)
            failures.append(("local_size accepted", local_size))
        except ValueError as exc:
            if str(exc) != f"local_size must divide the world size 4, got {local_size}":
                failures.append(("message", str(exc)))
    # The two pairs run on their own: rank 0, which hosts the rendezvous store, must not exit
    # while the other pair still creates its subgroups (seen on a loaded machine).
    dist.barrier()
    return failures


@pytest.mark.multiproc
def test_torus_groups_rows_columns_subgroups_and_errors():
    for rank, failures in enumerate(spawn(_torus_groups_worker, 4, timeout_s=TIMEOUT_S)):
        assert failures == [], f"rank {rank}: {failures[:5]}"


def test_without_process_group_is_a_clear_error():
    from hasten.distributed import CollectiveError

    with pytest.raises(CollectiveError, match="not initialised"):
        ring_allreduce(torch.ones(3))


def test_allreduce_by_name_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match=r"one of \('native', 'ring', 'torus', 'naive'\), got 'tree'"):
        allreduce(torch.ones(3), "tree")


class _CoalescedWork:
    """One work for a whole batch, as NCCL returns from batch_isend_irecv."""

    def __init__(self, works):
        self.works = works

    def wait(self, *timeout):
        for w in self.works:
            w.wait(*timeout)
        return True


class _DistAsNccl:
    """torch.distributed as ring.py and p2p.py see it on NCCL: the backend says "nccl" and a
    batch of send/recv comes back as one coalesced work. Transport stays gloo underneath.
    With ``only`` set, just that group claims to be NCCL (a gloo side group in an NCCL job)."""

    def __init__(self, only=None):
        self.batches, self.groups, self.only = 0, [], only

    def __getattr__(self, name):
        return getattr(dist, name)

    def get_backend(self, group=None):
        return "nccl" if self.only is None or group is self.only else dist.get_backend(group)

    def batch_isend_irecv(self, ops):
        self.batches += 1
        self.groups += [op.group for op in ops]
        return [_CoalescedWork(dist.batch_isend_irecv(ops))]


def _nccl_paths_worker(rank, world):
    from hasten.distributed import p2p, ring

    fake = _DistAsNccl()
    ring.dist, p2p.dist = fake, fake  # a forked rank: nothing to restore
    failures = []
    for size in (1, 5, 1001):
        for dtype in (torch.float64, torch.float32, torch.int64):
            for seg_bytes in (16, 1 << 20):  # several segments per chunk, and one
                x = _input(rank, size, dtype)
                exact = sum(_input(r, size, dtype).double() for r in range(world))
                y = ring_allreduce(x.clone(), segment_bytes=seg_bytes)
                tol = 0 if dtype == torch.int64 else 1e-12 if dtype == torch.float64 else 1e-5
                err = (y.double() - exact).abs().max().item()
                if err > tol * (1 + exact.abs().max().item()):
                    failures.append(("ring", size, dtype, seg_bytes, err))
        for grid in GRIDS[world]:
            x = _input(rank, 1001, torch.float64)
            exact = sum(_input(r, 1001, torch.float64) for r in range(world))
            fake.groups.clear()
            y = torus_allreduce(x.clone(), grid, segment_bytes=64)
            if not torch.allclose(y, exact, rtol=1e-12, atol=1e-12):
                failures.append(("torus", grid))
            if None in fake.groups:  # rows and columns talk over their own subgroups
                failures.append(("torus sent outside its subgroups", grid))
    if fake.batches == 0:
        failures.append("the NCCL branch never ran")
    # The branch follows the group passed in: only the group that says NCCL takes it.
    side = dist.new_group(list(range(world)))
    only = _DistAsNccl(only=side)
    ring.dist, p2p.dist = only, only
    ring_allreduce(torch.ones(8))
    if only.batches:
        failures.append("the default (gloo) group took the NCCL branch")
    ring_allreduce(torch.ones(8), side)
    if not only.batches:
        failures.append("the NCCL side group took the gloo branch")
    return failures


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 3, 4])
def test_nccl_code_paths_over_gloo(world):
    """The branches ring and p2p take on NCCL (one batched exchange per ring step, one
    coalesced work per batch), run on CPU by making gloo look like NCCL to them."""
    for rank, failures in enumerate(spawn(_nccl_paths_worker, world, timeout_s=TIMEOUT_S)):
        assert failures == [], f"rank {rank}: {failures[:5]}"


def _labels_worker(rank, world, as_nccl):
    from hasten.distributed import p2p, ring

    if as_nccl:
        ring.dist = p2p.dist = _DistAsNccl()  # a forked rank: nothing to restore
    seen = []
    for module in (ring, p2p):
        def recording_wait(work, what, timeout_s, _real=module.wait):
            seen.append((what, timeout_s))
            return _real(work, what, timeout_s)

        module.wait = recording_wait
    ring_allreduce(torch.ones(6 * world), timeout_s=7.5)
    ring_seen = list(seen)
    # a 1 x world torus: one row, reduce-scatter and all-gather called on their own
    x = torch.arange(6.0 * world) * (rank + 1)
    torus_allreduce(x, (1, world), timeout_s=7.5)
    if not torch.equal(x, torch.arange(6.0 * world) * world * (world + 1) / 2):
        return ring_seen, "torus sum wrong", x
    return ring_seen, [t for _, t in seen[len(ring_seen):]], len(seen) - len(ring_seen)


@pytest.mark.multiproc
@pytest.mark.parametrize("as_nccl", [False, True])
def test_ring_names_the_step_a_peer_failed_in(as_nccl):
    """What a CollectiveError says when a peer dies: phase, step, the peer's rank, and the
    timeout it waited (gloo: per segment; NCCL: one coalesced wait per step)."""
    world = 3
    for rank, (seen, *torus) in enumerate(spawn(_labels_worker, world, (as_nccl,), timeout_s=TIMEOUT_S)):
        # the torus's ring phases: the same number of waits, each with the timeout passed in
        assert torus == [[7.5] * len(seen), len(seen)], rank
        left, right = (rank - 1) % world, (rank + 1) % world
        steps = [f"ring {phase} step {k}/2" for phase in ("reduce-scatter", "all-gather") for k in (1, 2)]
        if as_nccl:
            expected = steps
        else:
            expected = [f"{step} (receive from rank {left})" for step in steps]
            expected += [f"ring (send to rank {right})"] * 4  # one chunk per step, one segment each
        assert seen == [(what, 7.5) for what in expected], rank


def _reinit_worker(rank, world, store_path):
    x = torch.ones(4)
    torus_allreduce(x, (2, 2))
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    y = torch.ones(4)
    torus_allreduce(y, (2, 2))  # the cached rows and columns belong to the destroyed group
    return x.tolist(), y.tolist()


@pytest.mark.multiproc
def test_torus_after_a_new_process_group_makes_new_rows_and_columns(tmp_path):
    for rank, (before, after) in enumerate(spawn(_reinit_worker, 4, (str(tmp_path / "store"),),
                                                 timeout_s=TIMEOUT_S)):
        assert before == after == [4.0] * 4, rank
