"""Point-to-point plumbing shared by the all-reduce algorithms.

Group membership, the cheap "same tensor on every rank?" check, segment-wise
send/recv with a timeout, and the errors raised when a peer disagrees or dies.
Everything here runs on torch.distributed (gloo on CPU, NCCL on GPU); hasten has
no transport of its own.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from hasten.errors import HastenError

DEFAULT_SEGMENT_BYTES = 1 << 20  # 1 MiB: big enough to amortise per-message cost, small enough to pipeline

# Codes for the size check; a dtype not listed gets -1, which still compares equal to itself.
_DTYPE_CODES = {dt: i for i, dt in enumerate([
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.complex64, torch.complex128,
])}


class TensorMismatchError(HastenError, ValueError):
    """Ranks called a collective with tensors of different sizes or dtypes."""


class CollectiveError(HastenError, RuntimeError):
    """A peer died, hung past the timeout, or the transport failed mid-collective."""


def group_ranks(group=None) -> list[int]:
    """Global ranks of ``group`` (None: the default group), in group-rank order."""
    if not dist.is_available() or not dist.is_initialized():
        raise CollectiveError(
            "torch.distributed is not initialised: call hasten.distributed.init_distributed() "
            "(or torch.distributed.init_process_group) first"
        )
    return dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)


def my_index(ranks: list[int]) -> int:
    me = dist.get_rank()
    if me not in ranks:
        raise ValueError(f"rank {me} is not a member of the group {ranks}")
    return ranks.index(me)


def check_same_tensor(tensor: torch.Tensor, group=None, what: str = "all-reduce") -> None:
    """Raise TensorMismatchError on every rank unless all ranks hold the same numel and dtype.

    Costs one tiny all_gather; without it a size mismatch either hangs (a rank waits
    for bytes that never come) or silently sums the wrong elements.
    """
    n = len(group_ranks(group))
    if n == 1:
        return
    mine = torch.tensor([tensor.numel(), _DTYPE_CODES.get(tensor.dtype, -1)],
                        dtype=torch.int64, device=tensor.device)
    gathered = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(gathered, mine, group=group)
    seen = [(int(g[0]), int(g[1])) for g in gathered]
    if len(set(seen)) > 1:
        names = {code: str(dt).removeprefix("torch.") for dt, code in _DTYPE_CODES.items()}
        per_rank = ", ".join(f"rank {r}: {numel} x {names.get(code, 'other dtype')}"
                             for r, (numel, code) in zip(group_ranks(group), seen))
        raise TensorMismatchError(
            f"{what}: ranks passed different tensors ({per_rank}); "
            "every rank must pass a tensor with the same number of elements and dtype"
        )


@contextlib.contextmanager
def flat_view(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """A 1-D view to work on in place; a non-contiguous tensor gets a copy written back."""
    if tensor.is_contiguous():
        yield tensor.view(-1)
    else:
        flat = tensor.contiguous().view(-1)
        yield flat
        tensor.copy_(flat.view_as(tensor))


def segments(buf: torch.Tensor, seg_elems: int) -> list[torch.Tensor]:
    """Consecutive slices of at most ``seg_elems`` elements; none for an empty buffer."""
    return [buf[i:i + seg_elems] for i in range(0, buf.numel(), seg_elems)]


def segment_elems(dtype: torch.dtype, segment_bytes: int) -> int:
    if segment_bytes <= 0:
        raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
    return max(1, segment_bytes // torch.empty((), dtype=dtype).element_size())


def wait(work, what: str, timeout_s: float | None) -> None:
    """Wait for one send/recv; turn a dead peer or a timeout into a CollectiveError."""
    try:
        if timeout_s is None:
            work.wait()
        else:
            work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as exc:  # gloo and NCCL both raise (subclasses of) RuntimeError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        limit = f" within {timeout_s:g} s" if timeout_s is not None else ""
        raise CollectiveError(
            f"rank {dist.get_rank()}: {what} did not complete{limit} "
            f"(a peer died, hung, or passed a different tensor): {first}"
        ) from exc


def exchange(send: torch.Tensor, recv: torch.Tensor, dst: int, src: int, group,
             seg_elems: int, timeout_s: float | None, what: str,
             on_segment: Callable[[int], None] | None = None) -> None:
    """Send ``send`` to ``dst`` while receiving ``recv`` from ``src``, segment by segment.

    All segments are posted at once, so while segment i is being reduced by
    ``on_segment(i)`` the later ones are still on the wire: sending, receiving
    and adding overlap.
    """
    send_segs, recv_segs = segments(send, seg_elems), segments(recv, seg_elems)
    # Receives first: gloo sends data only once the receiver has announced a buffer, and
    # with two ranks that announcement shares one TCP stream with our own data; posted
    # after our sends it would wait behind them.
    ops = ([dist.P2POp(dist.irecv, r, src, group) for r in recv_segs]
           + [dist.P2POp(dist.isend, s, dst, group) for s in send_segs])
    if not ops:
        return
    works = dist.batch_isend_irecv(ops)
    if len(works) != len(ops):
        # NCCL coalesces a batch into one work: no per-segment completion to overlap with.
        for w in works:
            wait(w, what, timeout_s)
        if on_segment is not None:
            for i in range(len(recv_segs)):
                on_segment(i)
        return
    for i, w in enumerate(works[:len(recv_segs)]):
        wait(w, f"{what} (receive from rank {src})", timeout_s)
        if on_segment is not None:
            on_segment(i)
    for w in works[len(recv_segs):]:
        wait(w, f"{what} (send to rank {dst})", timeout_s)
