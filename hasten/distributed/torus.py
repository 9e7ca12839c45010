"""2-D torus all-reduce (and its hierarchical nodes x local-ranks form).

Based on: Ying et al., "Image Classification at Supercomputer Scale" (Google,
NeurIPS 2018 workshop; arXiv:1811.06992), which sums gradients on a 2-D torus of
1,024 TPU v3 chips in two phases, one per dimension, cutting the sequential steps
from O(N) to O(sqrt N); the hierarchical form is the same idea with "rows" being
the ranks of one node (Jia et al., arXiv:1807.11205; Horovod's hierarchical
all-reduce).

Ranks are laid out row-major on an R x C grid (rank r sits in row r // C, column
r % C; torchrun numbers the ranks of one node consecutively, so a row is a node
when C is the local world size). Three phases:

1. ring reduce-scatter along each row: every rank ends with the row's sum of one
   1/C shard (built from point-to-point, because gloo's reduce_scatter is an
   all-reduce in disguise and would move C times the data);
2. ring all-reduce of that shard along each column (the only phase on the slow
   inter-node links in the hierarchical case, carrying K/C bytes);
3. ring all-gather along each row.

Each rank runs 2(C-1) + 2(R-1) sequential steps instead of 2(RC-1).

Changes the training math: no (same sum; addition order differs in the last bits).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hasten.distributed.p2p import (DEFAULT_SEGMENT_BYTES, check_same_tensor, flat_view, group_ranks,
                             segment_elems)
from hasten.distributed.ring import ring_all_gather_, ring_allreduce, ring_reduce_scatter_


@dataclass(frozen=True)
class TorusGroups:
    """This rank's row and column of the grid, as global ranks and process groups."""
    grid: tuple[int, int]
    row_ranks: list[int]
    col_ranks: list[int]
    row_group: object
    col_group: object


_GROUPS: dict[tuple, TorusGroups] = {}


def parse_grid(grid, world_size: int) -> tuple[int, int]:
    """Validate ``grid`` (``(R, C)`` or ``"RxC"``) against the number of ranks."""
    if isinstance(grid, str):
        parts = grid.lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"grid must look like '2x4' (rows x columns), got {grid!r}")
        grid = (int(parts[0]), int(parts[1]))
    try:
        rows, cols = (int(g) for g in grid)
    except (TypeError, ValueError):
        raise ValueError(f"grid must be (rows, columns) or 'RxC', got {grid!r}") from None
    if rows < 1 or cols < 1 or rows * cols != world_size:
        raise ValueError(
            f"grid {rows}x{cols} holds {rows * cols} ranks but the group has {world_size}; "
            f"pass rows x columns = {world_size}, e.g. {default_grid(world_size)}"
        )
    return rows, cols


def default_grid(world_size: int) -> tuple[int, int]:
    """The most square R x C = world_size with R <= C (1 x N for a prime N)."""
    rows = max(r for r in range(1, int(world_size ** 0.5) + 1) if world_size % r == 0)
    return rows, world_size // rows


def torus_groups(grid, group=None, timeout_s: float | None = None) -> TorusGroups:
    """Create (once, then cached) this rank's row and column subgroups of ``grid``.

    Every rank of ``group`` must call this with the same grid. Only the members of a
    row or column take part in creating it (``use_local_synchronization``): without
    that, torch.distributed makes every rank of the whole job create every subgroup,
    and tori on disjoint subgroups, each creating its own rows, would hang.
    """
    ranks = group_ranks(group)
    rows, cols = parse_grid(grid, len(ranks))
    # Keyed on the parent group object too: after destroy/init_process_group the old
    # subgroups are dead and must not be reused.
    key = (rows, cols, tuple(ranks), group if group is not None else dist.group.WORLD)
    if key not in _GROUPS:
        kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s is not None else {}
        me = ranks.index(dist.get_rank())
        row = ranks[me // cols * cols:(me // cols + 1) * cols]
        col = ranks[me % cols::cols]
        # Row first, then column, on every rank: a row's members all create it before
        # any of them moves on, so no rank waits on a group its peers have not reached.
        _GROUPS[key] = TorusGroups((rows, cols), row, col,
                                   dist.new_group(row, use_local_synchronization=True, **kwargs),
                                   dist.new_group(col, use_local_synchronization=True, **kwargs))
    return _GROUPS[key]


def torus_allreduce(tensor: torch.Tensor, grid=None, group=None, *,
                    segment_bytes: int = DEFAULT_SEGMENT_BYTES, check_sizes: bool = True,
                    timeout_s: float | None = None) -> torch.Tensor:
    """Sum ``tensor`` over ``group`` in place on an R x C grid (None: ``default_grid``).

    Non-square grids work (2x3, 1xN, Nx1); tensors smaller than C elements too.
    Other arguments as in ``ring_allreduce``.
    """
    ranks = group_ranks(group)
    tg = torus_groups(grid if grid is not None else default_grid(len(ranks)), group, timeout_s)
    seg = segment_elems(tensor.dtype, segment_bytes)
    if check_sizes:
        check_same_tensor(tensor, group, "torus_allreduce")
    if len(ranks) == 1:
        return tensor
    with flat_view(tensor) as flat:
        chunks = list(torch.tensor_split(flat, len(tg.row_ranks)))
        shard = ring_reduce_scatter_(chunks, tg.row_ranks, tg.row_group, seg_elems=seg,
                                     timeout_s=timeout_s)
        ring_allreduce(shard, tg.col_group, segment_bytes=segment_bytes, check_sizes=False,
                       timeout_s=timeout_s)
        if len(tg.row_ranks) > 1:
            ring_all_gather_(chunks, tg.row_ranks, tg.row_group, seg_elems=seg,
                             timeout_s=timeout_s)
    return tensor


def hierarchical_allreduce(tensor: torch.Tensor, local_size: int, group=None, **kwargs) -> torch.Tensor:
    """Torus all-reduce with rows = nodes of ``local_size`` consecutive ranks.

    Reduce-scatter and all-gather stay on the fast links inside a node; only a
    1/local_size shard crosses the slow links between nodes.
    """
    n = len(group_ranks(group))
    if local_size < 1 or n % local_size:
        raise ValueError(f"local_size must divide the world size {n}, got {local_size}")
    return torus_allreduce(tensor, (n // local_size, local_size), group, **kwargs)
