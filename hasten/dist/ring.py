"""Ring all-reduce over point-to-point send/recv: a reduce-scatter, then an all-gather.

Based on: Andrew Gibiansky, "Bringing HPC Techniques to Deep Learning", Baidu
Research blog, 2017 (and Patarasuk & Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 2009).

The N ranks form a ring; the tensor is cut into N chunks (sizes differ by at most
one element, so any size works, including fewer elements than ranks). In N-1
steps each rank sends one chunk to its right neighbour and adds the chunk it gets
from its left one (reduce-scatter): afterwards rank i holds the full sum of chunk
(i+1) mod N. N-1 more steps pass the summed chunks around (all-gather). Each rank
sends 2(N-1)/N x K bytes whatever N is, which is why the ring's time stays flat as
N grows while a single reducer's grows linearly. Each step is cut into segments
so that reducing one segment overlaps the transfer of the next.

Changes the training math: no. It computes the same sum as any all-reduce; only
the order of floating-point additions differs (last-bit differences).
"""

from __future__ import annotations

import torch

from hasten.dist.p2p import (DEFAULT_SEGMENT_BYTES, check_same_tensor, exchange, flat_view,
                             group_ranks, my_index, segment_elems, segments)


def ring_reduce_scatter_(chunks: list[torch.Tensor], ranks: list[int], group=None, *,
                         seg_elems: int, timeout_s: float | None = None) -> torch.Tensor:
    """In place: afterwards chunk (i+1) mod N on group rank i holds the sum over ranks.

    ``chunks`` are N disjoint slices (views) of the caller's buffer. Returns the owned chunk.
    """
    n, me = len(ranks), my_index(ranks)
    if n == 1:
        return chunks[0]
    right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]
    scratch = torch.empty(max(c.numel() for c in chunks), dtype=chunks[0].dtype,
                          device=chunks[0].device)
    for step in range(n - 1):
        send = chunks[(me - step) % n]
        target = chunks[(me - step - 1) % n]
        incoming = scratch[:target.numel()]
        tgt_segs, in_segs = segments(target, seg_elems), segments(incoming, seg_elems)
        exchange(send, incoming, right, left, group, seg_elems, timeout_s,
                 f"ring reduce-scatter step {step + 1}/{n - 1}",
                 on_segment=lambda i: tgt_segs[i].add_(in_segs[i]))
    return chunks[(me + 1) % n]


def ring_all_gather_(chunks: list[torch.Tensor], ranks: list[int], group=None, *,
                     seg_elems: int, timeout_s: float | None = None) -> None:
    """In place: from chunk (i+1) mod N being final on group rank i, make every chunk final."""
    n, me = len(ranks), my_index(ranks)
    right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]
    for step in range(n - 1):
        exchange(chunks[(me + 1 - step) % n], chunks[(me - step) % n], right, left, group,
                 seg_elems, timeout_s, f"ring all-gather step {step + 1}/{n - 1}")


def ring_allreduce(tensor: torch.Tensor, group=None, *,
                   segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                   check_sizes: bool = True, timeout_s: float | None = None) -> torch.Tensor:
    """Sum ``tensor`` over the ranks of ``group`` in place with the ring algorithm.

    Args:
        tensor: any shape and any dtype torch can add; same numel and dtype on every rank.
        group: a torch.distributed process group (None: the default group).
        segment_bytes: pipelining granularity of each ring step.
        check_sizes: first all_gather (numel, dtype) and raise TensorMismatchError on
            every rank if they differ. Costs one tiny collective; turn off when sizes
            are equal by construction (DDP buckets).
        timeout_s: per send/recv; a dead or stuck peer raises CollectiveError after it
            (None: the process group's own timeout).

    Returns ``tensor``, now holding the sum.
    """
    ranks = group_ranks(group)
    seg = segment_elems(tensor.dtype, segment_bytes)
    if check_sizes:
        check_same_tensor(tensor, group, "ring_allreduce")
    if len(ranks) == 1:
        return tensor
    with flat_view(tensor) as flat:
        chunks = list(torch.tensor_split(flat, len(ranks)))
        ring_reduce_scatter_(chunks, ranks, group, seg_elems=seg, timeout_s=timeout_s)
        ring_all_gather_(chunks, ranks, group, seg_elems=seg, timeout_s=timeout_s)
    return tensor
