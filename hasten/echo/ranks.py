"""AutoEcho's agreement between data-parallel ranks: one e, one cap and one repeat value for
all ranks, so that every rank echoes alike and takes the same number of steps.

hasten's own (``hasten.echo.auto``). Changes the training math: no (it averages measurements).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def distributed():
    """torch.distributed when it runs more than one rank, else None."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist


def own_group():
    """A gloo process group of AutoEcho's own, or None without ``torch.distributed``.

    Why: the ranks agree inside the echo stage, on whatever thread runs it. From a thread
    other than the training thread, a collective on the default group would interleave with
    DDP's collectives in an order that differs between ranks (NCCL then hangs or mixes
    tensors); DDP never uses this group, and it reduces CPU tensors. Create it on the training
    thread of every rank, at the same point."""
    return dist.new_group(backend="gloo") if distributed() is not None else None


def agree(group, estimate: float, cap: float,
          dots: tuple[float, float, int]) -> tuple[float, float, tuple[float, float, int]]:
    """The mean estimate of R over the ranks (nan, i.e. 'not input-bound', only if no rank
    waits), the mean cap and the sums of the repeat-value reports; the arguments unchanged
    with one rank."""
    if distributed() is None:
        return estimate, cap, dots
    backend = dist.get_backend(group)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    valid = not math.isnan(estimate)
    t = torch.tensor([estimate if valid else 0.0, 1.0 if valid else 0.0, cap, *dots],
                     device=device, dtype=torch.float64)
    dist.all_reduce(t, group=group)
    world = dist.get_world_size(group)
    return (math.nan if t[1] == 0 else float(t[0] / t[1])), float(t[2] / world), (float(t[3]), float(t[4]), int(t[5]))
