"""Whether bf16 autocast can pay here, and whether the model runs under it, before a replayed step tries.

**Whether it can pay** (:func:`bf16_pays`): where the CPU has no bf16 instructions
(avx512_bf16, AMX), bf16 matmuls are emulated: measured here with oneDNN capped at AVX2, a
9M-parameter MLP's step took 13 s under autocast against 0.1 s without (capped at AVX512
without bf16, 0.52 against 0.18 s). py-spy ``--native`` on that run put 86% of the samples
in ATen's fallback bf16 GEMM (``at::native::cpublas`` gemm, in backward; forward in
``bf16_dot_with_fp32_arith``) and 3% in hasten's own frames. The autocast probe, run in the
loop, made the whole replay about ten times slower than the loop, and could only find
autocast slower.
So whether the device has native bf16 is asked first, of torch and of the CPU's flags
(:func:`bf16_support`): without it the probe is dropped, with the facts. With it, a bf16
product and a float32 one, the size of a layer of a small model, are timed in turn, seven of
each: the probe is dropped only when bf16 is slower beyond their ratio's 95% interval. (A
single timing of a product under autocast, its casts included, said "1.5x the float32 one"
on a CPU with avx512_bf16 whose autocast step was x1.42-1.56 faster, and flipped the
recommendation from one run to the next: issue 43.)

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
PAIRS = 7  # bf16 and float32 products timed in turn, this many of each: the ratio's interval comes from them
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def bf16_support(device: str) -> dict:
    """Whether this device computes in bf16 natively, as torch and the CPU say (asked, not guessed).

    ``{"native": True/False/None (unknown), "facts": "..."}``: on a CPU, torch's own query
    (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``, which also sees oneDNN capped by
    ``ONEDNN_MAX_CPU_ISA``) decides, the CPU's flags (``/proc/cpuinfo``) where torch has no query;
    on CUDA, ``torch.cuda.is_bf16_supported()``."""
    import torch
    if device == "cuda":
        native = bool(torch.cuda.is_bf16_supported())
        return {"native": native, "facts": f"torch.cuda.is_bf16_supported() is {native}"}
    facts = []
    try:
        asked = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        facts.append(f"torch.ops.mkldnn._is_mkldnn_bf16_supported() is {asked}")
    except (AttributeError, RuntimeError):
        asked = None
    flags = _cpu_flags()
    if flags is not None:
        have = [f for f in CPU_BF16_FLAGS if f in flags]
        facts.append(f"CPU flags {', '.join(have)}" if have else f"no {' nor '.join(CPU_BF16_FLAGS)} in the CPU flags")
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
    if capability:
        facts.append(f"ATen's CPU capability {capability}")
    native = asked if asked is not None else (bool(have) if flags is not None else None)
    return {"native": native, "facts": "; ".join(facts) or "torch and the CPU say nothing of bf16"}


def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def bf16_pays(st: State) -> str | None:
    """Why bf16 autocast cannot make a step faster here, or None.

    Without native bf16 (:func:`bf16_support`) it cannot: emulated, a step took 13 s instead of
    0.1 s. With it, or where nothing says, a bf16 product and a float32 one are timed in turn
    (:data:`PAIRS` of each, the operands cast beforehand: in a model the activations stay bf16
    from layer to layer, and the replayed step measures the casts); only a product slower beyond
    the interval of their ratio drops the probe. One noisy reading on a shared machine flipped the
    earlier single-shot check from run to run (issue 43)."""
    import torch
    import torch.nn.functional as F
    support = st.bf16 = bf16_support(st.device)
    if support["native"] is False:
        return (f"this {st.device} has no native bf16 ({support['facts']}): emulated bf16 matmuls make a step "
                "slower, and its replayed steps would take that much longer")
    rows, features = PRODUCT.get(st.device, PRODUCT["cpu"])
    devices = [torch.cuda.current_device()] if st.device == "cuda" and torch.cuda.is_initialized() else []
    st.in_probe = True
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():  # the run's random numbers untouched
            x = torch.randn(rows, features, device=st.device)
            w = torch.randn(features, features, device=st.device)
            xb, wb = x.bfloat16(), w.bfloat16()
            _timed(st, lambda: F.linear(x, w))  # the first call of each sets its kernel up
            _timed(st, lambda: F.linear(xb, wb))
            logs = [math.log(_timed(st, lambda: F.linear(xb, wb)) / max(_timed(st, lambda: F.linear(x, w)), 1e-9))
                    for _ in range(PAIRS)]
    finally:
        st.in_probe = False
    from hasten.stats import mean_ci
    ci = mean_ci(logs)
    ratio, lo, hi = (math.exp(ci["mean"] + d) for d in (0.0, -ci["ci95"], ci["ci95"]))
    support.update(matmul_ratio=ratio, matmul_interval=[lo, hi], pairs=PAIRS)
    if lo <= 1.0:
        return None
    return (f"a bf16 matmul takes {ratio:.2f}x the float32 one on this {st.device} (95% interval {lo:.2f}x-{hi:.2f}x, "
            f"{PAIRS} pairs; {support['facts']}): autocast cannot make a step faster here, and its replayed steps "
            "would take that much longer")


def _timed(st: State, fn) -> float:
    sync(st)
    t0 = time.perf_counter()
    fn()
    sync(st)
    return time.perf_counter() - t0


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
