"""DistributedDataParallel communication hooks: ring, torus or naive, optionally in bf16.

("native" runs the backend's own all_reduce inside the same hook: torch's
``bf16_compress_hook`` refuses gloo, this one does not.)

Register with ``ddp_model.register_comm_hook(state, allreduce_hook)`` (or
``register_allreduce_hook(ddp_model, "ring")``). DDP hands the hook one gradient
bucket at a time; the hook averages it with the chosen algorithm and returns a
``torch.futures.Future``. gloo's point-to-point work has no future of its own,
so on CPU the hook runs the algorithm on a background thread and fulfils the
future itself when done (DDP waits for it at the end of backward); on NCCL the
work is queued on the current stream, which DDP's copy-back also uses, so the
future is returned already set.

bf16 compression follows torch's ``bf16_compress_hook`` (and Google's TPU
training): the bucket is cast to bfloat16 before the all-reduce and back after,
halving the bytes on the wire.

Changes the training math: no without compression (same average, addition
order differs in the last bits); yes with ``compress="bf16"`` (gradients are
rounded to 8 mantissa bits before summing).
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations at runtime.
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hasten.distributed.naive import naive_allreduce
from hasten.distributed.p2p import group_ranks
from hasten.distributed.ring import ring_allreduce
from hasten.distributed.torus import default_grid, parse_grid, torus_allreduce, torus_groups

# The all-reduce algorithms a DDP hook can use; every command and recipe reads this list.
HOOKS = ("native", "ring", "torus", "naive")
COMPRESSIONS = (None, "bf16")


@dataclass
class AllReduceHookState:
    """What the hook needs: the algorithm, its group and grid, and the compression."""
    algo: str = "ring"
    group: object = None
    grid: tuple[int, int] | str | None = None
    compress: str | None = None
    timeout_s: float | None = None
    _worker: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    def worker(self) -> ThreadPoolExecutor:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hasten-allreduce")
        return self._worker

    def __post_init__(self):
        if self.algo not in HOOKS:
            raise ValueError(f"hook algorithm must be one of {HOOKS}, got {self.algo!r}")
        if self.compress not in COMPRESSIONS:
            raise ValueError(f"compress must be one of {COMPRESSIONS}, got {self.compress!r}")
        if self.grid is not None:
            if self.algo != "torus":
                raise ValueError(f"grid only applies to the torus hook, not {self.algo!r}")
            self.grid = parse_grid(self.grid, len(group_ranks(self.group)))
        if self.algo == "torus":
            # Subgroup creation is collective: do it now, on every rank, not mid-backward.
            n = len(group_ranks(self.group))
            self.grid = self.grid or default_grid(n)
            torus_groups(self.grid, self.group, self.timeout_s)


def allreduce(tensor: torch.Tensor, algo: str, group=None, *, grid=None, check_sizes: bool = True,
              timeout_s: float | None = None) -> torch.Tensor:
    """Sum ``tensor`` over ``group`` in place with ``algo``, one of :data:`HOOKS`
    ("native": the backend's own ``all_reduce``). ``grid`` is the torus's; the
    other arguments are those of ``ring_allreduce``. Returns ``tensor``."""
    kwargs = {"check_sizes": check_sizes, "timeout_s": timeout_s}
    if algo == "ring":
        return ring_allreduce(tensor, group, **kwargs)
    if algo == "torus":
        return torus_allreduce(tensor, grid, group, **kwargs)
    if algo == "naive":
        return naive_allreduce(tensor, group, **kwargs)
    if algo == "native":
        dist.all_reduce(tensor, group=group)
        return tensor
    raise ValueError(f"all-reduce algorithm must be one of {HOOKS}, got {algo!r}")


def _reduce(state: AllReduceHookState, tensor: torch.Tensor) -> None:
    # Bucket sizes are identical on every rank by DDP's construction: skip the size check.
    allreduce(tensor, state.algo, state.group, grid=state.grid, check_sizes=False, timeout_s=state.timeout_s)


def _average(state: AllReduceHookState, buf: torch.Tensor) -> torch.Tensor:
    # Divide before summing, like DDP's own hook: keeps bf16 sums in range.
    buf.div_(len(group_ranks(state.group)))
    if state.compress == "bf16":
        low = buf.to(torch.bfloat16)
        _reduce(state, low)
        buf.copy_(low)
    else:
        _reduce(state, buf)
    return buf


def allreduce_hook(state: AllReduceHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average one DDP gradient bucket across ranks with ``state.algo``.

    CPU buckets are reduced on one background thread per hook state, so the
    all-reduce of a bucket overlaps the backward pass of the layers before it (as
    DDP's own asynchronous all_reduce does). One thread keeps the buckets in
    order: every rank then sends and receives them in the same sequence. CUDA
    buckets are reduced inline: NCCL work is already asynchronous on its streams.
    """
    buf = bucket.buffer()
    if buf.is_cuda:
        fut = torch.futures.Future(devices=[buf.device])
        fut.set_result(_average(state, buf))
        return fut
    fut = torch.futures.Future()

    def work():
        try:
            fut.set_result(_average(state, buf))
        except BaseException as exc:  # surfaces in DDP's backward on the training thread
            fut.set_exception(exc)

    state.worker().submit(work)
    return fut


def register_allreduce_hook(ddp_model, algo: str = "ring", *, compress: str | None = None,
                            grid=None, group=None, timeout_s: float | None = None) -> AllReduceHookState:
    """Make ``ddp_model`` average its gradients with ``algo``; returns the hook state."""
    state = AllReduceHookState(algo, group, grid, compress, timeout_s)
    ddp_model.register_comm_hook(state, allreduce_hook)
    return state
