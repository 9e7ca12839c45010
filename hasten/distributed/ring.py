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
N grows while a single reducer's grows linearly. Steps are cut into segments and
pipelined: a segment is forwarded as soon as it has arrived and been added, so
sending, receiving and adding overlap.

Changes the training math: no. It computes the same sum as any all-reduce; only
the order of floating-point additions differs (last-bit differences).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hasten.distributed.p2p import (DEFAULT_SEGMENT_BYTES, check_same_tensor, exchange, flat_view,
                             group_ranks, my_index, segment_elems, segments, wait)


def _send_index(t: int, me: int, n: int) -> int:
    """Chunk sent at step t: steps 0..n-2 reduce-scatter, n-1..2n-3 all-gather.

    One formula serves both phases: at all-gather step k = t - n + 1 a rank sends the
    chunk it finished last, (me + 1 - k) mod n, which is (me - t) mod n again.
    """
    return (me - t) % n


def _recv_index(t: int, me: int, n: int) -> int:
    # Always the chunk sent at step t+1: what arrives is forwarded next.
    return (me - t - 1) % n


def _ring_steps(chunks: list[torch.Tensor], ranks: list[int], group, first: int, last: int,
                seg_elems: int, timeout_s: float | None) -> None:
    """Run ring steps first..last-1 in place (see _send_index for the schedule).

    On gloo the steps are pipelined segment by segment: as soon as segment i of
    step t has arrived (and been added), it is sent on as segment i of step t+1,
    so the ring never drains between steps. Receives are posted one step ahead,
    because gloo moves data only into buffers the receiver has announced. Other
    backends (NCCL) get one batched exchange per step: NCCL pipelines internally,
    and its send/recv to one peer must be grouped to avoid deadlock.
    """
    n, me = len(ranks), my_index(ranks)
    right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]
    reducing = first < n - 1
    scratch = ([torch.empty(max(c.numel() for c in chunks), dtype=chunks[0].dtype,
                            device=chunks[0].device) for _ in range(2)] if reducing else None)

    def incoming(t):
        target = chunks[_recv_index(t, me, n)]
        return scratch[t % 2][:target.numel()] if t < n - 1 else target

    def what(t):
        phase, k = ("reduce-scatter", t + 1) if t < n - 1 else ("all-gather", t - n + 2)
        return f"ring {phase} step {k}/{n - 1}"

    if dist.get_backend(group) != "gloo":
        for t in range(first, last):
            target, buf = chunks[_recv_index(t, me, n)], incoming(t)
            tgt_segs, in_segs = segments(target, seg_elems), segments(buf, seg_elems)
            exchange(chunks[_send_index(t, me, n)], buf, right, left, group, seg_elems, timeout_s,
                     what(t), on_segment=(lambda i: tgt_segs[i].add_(in_segs[i])) if t < n - 1 else None)
        return

    def post_recvs(t):
        segs = segments(incoming(t), seg_elems)
        return segs, [dist.irecv(s, left, group) for s in segs]

    recvs = post_recvs(first)
    sends = [dist.isend(s, right, group) for s in segments(chunks[_send_index(first, me, n)], seg_elems)]
    for t in range(first, last):
        in_segs, works = recvs
        if t + 1 < last:
            recvs = post_recvs(t + 1)
        target_segs = segments(chunks[_recv_index(t, me, n)], seg_elems)
        for i, work in enumerate(works):
            wait(work, f"{what(t)} (receive from rank {left})", timeout_s)
            if t < n - 1:
                target_segs[i].add_(in_segs[i])
            if t + 1 < last:
                sends.append(dist.isend(target_segs[i], right, group))
    for work in sends:
        wait(work, f"ring (send to rank {right})", timeout_s)


def ring_reduce_scatter_(chunks: list[torch.Tensor], ranks: list[int], group=None, *,
                         seg_elems: int, timeout_s: float | None = None) -> torch.Tensor:
    """In place: afterwards chunk (i+1) mod N on group rank i holds the sum over ranks.

    ``chunks`` are N disjoint slices (views) of the caller's buffer; ``ranks`` the
    group's global ranks. Returns the owned chunk.
    """
    n = len(ranks)
    if n > 1:
        _ring_steps(chunks, ranks, group, 0, n - 1, seg_elems, timeout_s)
    return chunks[(my_index(ranks) + 1) % n]


def ring_all_gather_(chunks: list[torch.Tensor], ranks: list[int], group=None, *,
                     seg_elems: int, timeout_s: float | None = None) -> None:
    """In place: from chunk (i+1) mod N being final on group rank i, make every chunk final."""
    n = len(ranks)
    if n > 1:
        _ring_steps(chunks, ranks, group, n - 1, 2 * n - 2, seg_elems, timeout_s)


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
        # Both phases in one pipeline: the last reduced segments flow straight into the all-gather.
        _ring_steps(chunks, ranks, group, 0, 2 * len(ranks) - 2, seg, timeout_s)
    return tensor
