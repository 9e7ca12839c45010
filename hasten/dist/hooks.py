"""DistributedDataParallel communication hooks: ring, torus or naive, optionally in bf16.

("native" runs the backend's own all_reduce inside the same hook: torch's
``bf16_compress_hook`` refuses gloo, this one does not.)

Register with ``ddp_model.register_comm_hook(state, allreduce_hook)`` (or
``register_allreduce_hook(ddp_model, "ring")``). DDP hands the hook one gradient
bucket at a time; the hook averages it with the chosen algorithm and returns a
completed ``torch.futures.Future``. gloo's point-to-point work has no future of
its own, so the hook runs the algorithm to completion and fulfils the future
itself (on NCCL the work is queued on the current stream, which DDP's
copy-back also uses, so the ordering holds).

bf16 compression follows torch's ``bf16_compress_hook`` (and Google's TPU
training): the bucket is cast to bfloat16 before the all-reduce and back after,
halving the bytes on the wire.

Changes the training math: no without compression (same average, addition
order differs in the last bits); yes with ``compress="bf16"`` (gradients are
rounded to 8 mantissa bits before summing).
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations at runtime.
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hasten.dist.naive import naive_allreduce
from hasten.dist.p2p import group_ranks
from hasten.dist.ring import ring_allreduce
from hasten.dist.torus import default_grid, parse_grid, torus_allreduce, torus_groups

HOOK_ALGORITHMS = ("ring", "torus", "naive", "native")
COMPRESSIONS = (None, "bf16")


@dataclass
class AllReduceHookState:
    """What the hook needs: the algorithm, its group and grid, and the compression."""
    algo: str = "ring"
    group: object = None
    grid: tuple[int, int] | str | None = None
    compress: str | None = None
    timeout_s: float | None = None

    def __post_init__(self):
        if self.algo not in HOOK_ALGORITHMS:
            raise ValueError(f"hook algorithm must be one of {HOOK_ALGORITHMS}, got {self.algo!r}")
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


def _reduce(state: AllReduceHookState, tensor: torch.Tensor) -> None:
    # Bucket sizes are identical on every rank by DDP's construction: skip the size check.
    kwargs = {"check_sizes": False, "timeout_s": state.timeout_s}
    if state.algo == "ring":
        ring_allreduce(tensor, state.group, **kwargs)
    elif state.algo == "torus":
        torus_allreduce(tensor, state.grid, state.group, **kwargs)
    elif state.algo == "naive":
        naive_allreduce(tensor, state.group, **kwargs)
    else:
        dist.all_reduce(tensor, group=state.group)


def allreduce_hook(state: AllReduceHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average one DDP gradient bucket across ranks with ``state.algo``."""
    buf = bucket.buffer()
    # Divide before summing, like DDP's own hook: keeps bf16 sums in range.
    buf.div_(len(group_ranks(state.group)))
    if state.compress == "bf16":
        low = buf.to(torch.bfloat16)
        _reduce(state, low)
        buf.copy_(low)
    else:
        _reduce(state, buf)
    fut = torch.futures.Future(devices=[buf.device]) if buf.is_cuda else torch.futures.Future()
    fut.set_result(buf)
    return fut


def register_allreduce_hook(ddp_model, algo: str = "ring", *, compress: str | None = None,
                            grid=None, group=None, timeout_s: float | None = None) -> AllReduceHookState:
    """Make ``ddp_model`` average its gradients with ``algo``; returns the hook state."""
    state = AllReduceHookState(algo, group, grid, compress, timeout_s)
    ddp_model.register_comm_hook(state, allreduce_hook)
    return state
