"""DistributedDataParallel under the profile: one dispatching communication hook, and the link's timings.

The first DDP model gets one communication hook, :func:`dispatch_hook`, so that the
replayed steps can swap in DDP's ``noop_hook`` (``comm_off``: the step without gradient
averaging) and hasten's bf16-compressing hook (``comm_bf16``), and a verification run
the bf16 hook (``comm=bf16``). A hook the user registers later is kept and called
through it. :func:`calibrate_link` times all-reduces of a few sizes up to the
gradient's, in float32 and bfloat16, on every rank at the same step: the data of the
alpha-beta cost model in :mod:`hasten.profile.verdict`.

Changes the training math: only in the replayed ``comm_off`` / ``comm_bf16`` steps and
with ``comm=bf16`` applied (bf16-rounded gradient averages).
"""

from __future__ import annotations

import math
import time

from hasten.profile.inject import state
from hasten.profile.inject.device_sync import sync
from hasten.profile.inject.state import State


def dispatch_hook(hook_state, bucket):
    # No annotations: DDP inspects them.
    st = state.current
    if st.comm_mode == "noop":
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
        return noop_hook(None, bucket)
    if st.apply == "comm=bf16" or st.comm_mode == "bf16":
        from hasten.distributed.hooks import allreduce_hook
        return allreduce_hook(st.bf16_state, bucket)
    if st.user_hook is not None:
        user_state, hook = st.user_hook
        return hook(user_state, bucket)
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    return allreduce_hook(hook_state, bucket)


def patch_ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig_init, orig_register = DDP.__init__, DDP.register_comm_hook

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        st = state.current
        if st is None or st.ddp:
            return
        st.ddp.append(self)
        st.grad_bytes = sum(p.numel() * p.element_size() for p in self.module.parameters() if p.requires_grad)
        from hasten.distributed.hooks import AllReduceHookState
        st.bf16_state = AllReduceHookState("native", self.process_group, compress="bf16")
        orig_register(self, self.process_group, dispatch_hook)

    def register_comm_hook(self, hook_state, hook):
        st = state.current
        if st is not None and st.ddp and self is st.ddp[0]:
            st.user_hook = (hook_state, hook)
            return None
        return orig_register(self, hook_state, hook)

    DDP.__init__ = __init__
    DDP.register_comm_hook = register_comm_hook


def calibrate_link(st: State) -> None:
    """Time all-reduces of a few sizes up to the gradient's: the cost model's data (every rank, same step)."""
    import torch
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or st.grad_bytes == 0:
        return
    ar = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)
    dev = "cuda" if st.device == "cuda" else "cpu"
    numel = st.grad_bytes // 4
    for dtype, out in ((torch.float32, st.allreduce_times), (torch.bfloat16, st.allreduce_bf16_times)):
        for frac in (1 / 8, 1 / 4, 1 / 2, 1):
            t = torch.ones(max(1, int(numel * frac)), device=dev, dtype=dtype)
            ar(t)
            best = math.inf
            for _ in range(3):
                sync(st)
                t0 = time.perf_counter()
                ar(t)
                sync(st)
                best = min(best, time.perf_counter() - t0)
            out.append((t.numel() * t.element_size(), best))
    full = torch.ones(max(1, numel), device=dev)
    st.bf16_cast_s = math.inf
    for _ in range(3):
        sync(st)
        t0 = time.perf_counter()
        full.copy_(full.to(torch.bfloat16))
        sync(st)
        st.bf16_cast_s = min(st.bf16_cast_s, time.perf_counter() - t0)
