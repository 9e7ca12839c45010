"""Whether bf16 autocast can pay here, and whether the model runs under it, before a replayed step tries.

**Whether it can pay** (:func:`bf16_pays`): where the CPU has no bf16 instructions
(avx512_bf16, AMX), bf16 matmuls are emulated: measured here with oneDNN capped at AVX2, a
9M-parameter MLP's step took 13 s under autocast against 0.1 s without (capped at AVX512
without bf16, 0.52 against 0.18 s). py-spy ``--native`` on that run put 86% of the samples
in ATen's fallback bf16 GEMM (``at::native::cpublas`` gemm, in backward; forward in
``bf16_dot_with_fp32_arith``) and 3% in hasten's own frames. The autocast probe, run in the
loop, made the whole replay about ten times slower than the loop, and could only find
autocast slower.
So a bf16 matmul under autocast and a float32 one, the size of a layer of a small model,
are timed first (milliseconds; about 60 ms at worst, emulated): when bf16 is not the
faster, the autocast probe is dropped with the ratio, and no step runs under autocast.

**Whether the model runs** under it (:func:`trial`): some do not. oneDNN's LSTM on a CPU
without bf16 support raises "could not create a primitive descriptor for the LSTM forward
propagation primitive"; a model with a large activation overflows bf16. Tried inside the
user's loop, either would end the command. So when the replayed steps begin, the model
runs once on its kept batch under bf16 autocast, forward and backward, isolated from the run:

- gradients come from ``torch.autograd.grad``, never accumulated into ``.grad``, and no
  optimizer is called;
- the buffers (BatchNorm's running statistics) are put back as they were, and the random
  number generators too (``torch.random.fork_rng``: dropout draws none of the run's numbers);
- DDP's wrapper is stepped around (its ``module`` is called), so that no gradient is
  averaged;
- hasten's own hooks look away (``State.in_probe``).

It raises, or gives an output or a gradient that is not finite: the autocast probe is
dropped with that line, and no step of the loop runs under autocast.

Changes the training math: no (weights, gradients, optimizer state, buffers and random
state are as they were).
"""

from __future__ import annotations

import math
import time

from hasten.profile.inject import messages
from hasten.profile.inject.batches import fresh_copy, tensors_in
from hasten.profile.inject.device_sync import sync
from hasten.profile.inject.state import State


# (rows, features) of the product: a small model's layer on a CPU; on a GPU, large enough that
# tensor cores, not launch overhead, set its time.
PRODUCT = {"cpu": (256, 1024), "cuda": (4096, 4096)}


def bf16_pays(st: State) -> str | None:
    """Why bf16 autocast cannot make a step faster here (its matmuls are not faster), or None."""
    import torch
    import torch.nn.functional as F
    rows, features = PRODUCT.get(st.device, PRODUCT["cpu"])
    devices = [torch.cuda.current_device()] if st.device == "cuda" and torch.cuda.is_initialized() else []
    st.in_probe = True
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():  # the run's random numbers untouched
            x = torch.randn(rows, features, device=st.device)
            w = torch.randn(features, features, device=st.device)

            def bf16():
                with torch.autocast(device_type=st.device, dtype=torch.bfloat16):
                    F.linear(x, w)

            f32_s, bf16_s = _best(st, lambda: F.linear(x, w)), _best(st, bf16)
    finally:
        st.in_probe = False
    ratio = bf16_s / max(f32_s, 1e-9)
    if ratio < 1.0:
        return None
    return (f"a bf16 matmul under autocast takes {ratio:.1f}x the float32 one on this {st.device} (no native "
            "bf16): autocast cannot make a step faster here, and its replayed steps would take that much longer")


def _best(st: State, fn, n: int = 5) -> float:
    """The fastest of ``n`` timed calls after one untimed (the first pays for setting up the kernel)."""
    fn()
    best = math.inf
    for _ in range(n):
        sync(st)
        t0 = time.perf_counter()
        fn()
        sync(st)
        best = min(best, time.perf_counter() - t0)
    return best


def trial(st: State) -> str | None:
    """Why the model cannot run under bf16 autocast, or None (also when there is nothing to try it on)."""
    model = st.model_ref() if st.model_ref is not None else None
    if model is None or st.model_args is None:
        return None  # (a model called with keyword arguments only): the replayed steps find out
    import torch
    from torch.nn.parallel import DistributedDataParallel
    module = model.module if isinstance(model, DistributedDataParallel) else model
    params = [p for p in module.parameters() if p.requires_grad]
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    devices = [torch.cuda.current_device()] if st.device == "cuda" and torch.cuda.is_initialized() else []
    loss, grads = None, ()
    st.in_probe = True
    try:
        with torch.random.fork_rng(devices=devices):
            with torch.autocast(device_type=st.device, dtype=torch.bfloat16):
                out = module(*fresh_copy(st.model_args))
            outs = [t for t in tensors_in(out) if t.is_floating_point()]
            if outs:
                loss = sum(t.float().sum() for t in outs)
            if loss is not None and loss.requires_grad and params:
                grads = torch.autograd.grad(loss, params, allow_unused=True)
    except Exception as exc:
        return (f"{messages.error_line(exc)}, in an isolated forward and backward of {type(module).__name__} "
                "under bf16 autocast")
    finally:
        st.in_probe = False
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)
    if loss is not None and not bool(torch.isfinite(loss)):
        return f"{type(module).__name__}'s output under bf16 autocast is not finite"
    if not all(bool(torch.isfinite(g).all()) for g in grads if g is not None):
        return f"{type(module).__name__}'s gradients under bf16 autocast are not finite"
    return None
