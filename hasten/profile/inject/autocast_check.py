"""Whether the model runs under bf16 autocast at all, found out before a replayed step of the loop tries.

Some models do not: oneDNN's LSTM on a CPU without bf16 support raises "could not create a
primitive descriptor for the LSTM forward propagation primitive"; a model with a large
activation overflows bf16. Tried inside the user's loop, either would end the command.
So when the replayed steps begin, :func:`trial` runs the model once on its kept batch
under bf16 autocast, forward and backward, isolated from the run:

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

from hasten.profile.inject import output
from hasten.profile.inject.batches import fresh_copy, tensors_in
from hasten.profile.inject.state import State


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
        return f"{output.error_line(exc)}, in an isolated forward and backward of {type(module).__name__} under bf16 autocast"
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
