"""Single-reducer all-reduce: every rank sends to one root, which sums and sends back.

Based on: the baseline in Andrew Gibiansky, "Bringing HPC Techniques to Deep
Learning" (Baidu Research, 2017). The root receives N-1 full tensors and sends
N-1 full tensors, so its link carries 2(N-1) x K bytes and the time grows
linearly with N. It exists as the baseline the ring and torus are measured
against, built from point-to-point send/recv (not the backend's reduce, which may
itself be a tree or a ring).

Changes the training math: no (same sum; addition order differs in the last bits).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hasten.distributed.p2p import check_same_tensor, flat_view, group_ranks, my_index, wait


def naive_allreduce(tensor: torch.Tensor, group=None, *, root: int = 0,
                    check_sizes: bool = True, timeout_s: float | None = None) -> torch.Tensor:
    """Sum ``tensor`` over ``group`` in place through one reducer (group rank ``root``).

    The root receives into two buffers in turn, so adding one peer's tensor
    overlaps receiving the next. Other arguments as in ``ring_allreduce``.
    """
    ranks = group_ranks(group)
    n = len(ranks)
    if not 0 <= root < n:
        raise ValueError(f"root must be a group rank in 0..{n - 1}, got {root}")
    if check_sizes:
        check_same_tensor(tensor, group, "naive_allreduce")
    if n == 1 or tensor.numel() == 0:
        return tensor
    me, root_rank = my_index(ranks), ranks[root]
    peers = [r for r in ranks if r != root_rank]
    with flat_view(tensor) as flat:
        if me == root:
            bufs = [torch.empty_like(flat), torch.empty_like(flat)]
            pending = dist.irecv(bufs[0], peers[0], group)
            for i, peer in enumerate(peers):
                work, buf = pending, bufs[i % 2]
                wait(work, f"naive reduce (receive from rank {peer})", timeout_s)
                if i + 1 < len(peers):
                    pending = dist.irecv(bufs[(i + 1) % 2], peers[i + 1], group)
                flat.add_(buf)
            sends = [(peer, dist.isend(flat, peer, group)) for peer in peers]
            for peer, work in sends:
                wait(work, f"naive broadcast (send to rank {peer})", timeout_s)
        else:
            wait(dist.isend(flat, root_rank, group), f"naive reduce (send to root rank {root_rank})",
                 timeout_s)
            wait(dist.irecv(flat, root_rank, group),
                 f"naive broadcast (receive from root rank {root_rank})", timeout_s)
    return tensor
