"""Where the profile meets torch: module forward hooks, ``backward``, ``clip_grad_norm_``, collectives.

- Global module forward hooks (:func:`torch.nn.modules.module.register_module_forward_pre_hook`)
  find the model wherever it is built: a top-level call of a module with parameters (or
  of a loss module), not nested in another, is a compute interval. The first module with
  parameters called in training mode with grad enabled is taken as the model; a copy of
  its first positional arguments in the measured window that are data (no tensor of an
  autograd graph) is kept for the replay of a loop without a DataLoader.
- ``torch.autograd.backward`` (which ``Tensor.backward`` calls), ``clip_grad_norm_`` and
  the ``torch.distributed`` collectives are wrapped (:func:`compute_interval`): compute
  intervals, and the collectives' time as communication. Each wrapper keeps the original
  as ``__wrapped__``.

This module imports torch: :func:`hasten.profile.inject.install` imports it once torch is
imported. hasten's own code here never raises into the user's call: it turns profiling
off in the process instead (:func:`hasten.profile.inject.messages.hasten_failed`).

Changes the training math: no (in the replayed steps of a loop without a DataLoader,
the model's arguments are the kept batch: see :mod:`hasten.profile.inject.phases`).
"""

from __future__ import annotations

import sys
import time
import weakref

import torch

from hasten.profile.inject import batch_fn, device_sync, messages, state, steps
from hasten.profile.inject.batches import batch_nbytes, fresh_copy, is_data, map_tensors, same_layout, tensor_layout
from hasten.profile.inject.state import State

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "barrier", "gather", "scatter")


def forward_pre(mod, args):
    entered = time.perf_counter()
    st = state.current
    if st is None or st.finished or st.in_probe:
        return None
    try:
        return _forward_pre(st, mod, args, entered)
    except Exception as exc:
        messages.hasten_failed(st, "module forward pre-hook", exc)
        return None


def _forward_pre(st: State, mod, args, entered: float | None = None):
    # Nested in another module's call, or in backward: counted with it. A forward directly inside an
    # optimizer's step (LBFGS's closure) is the model's own call, and counts.
    if st.cdepth > 0 and st.cdepth != st.opt_depth:
        st.cdepth += 1
        return None
    key = id(mod)
    hp = st.has_params.get(key)
    if hp is None:
        hp = any(True for _ in mod.parameters()) or isinstance(mod, torch.nn.modules.loss._Loss)
        st.has_params[key] = hp
    if not hp:
        return None
    steps.begin_compute(st, entered)
    st.forwards += 1
    if (st.step_kind == "autocast" or st.apply == "autocast") and st.autocast_ctx is None:
        # Around each top-level forward, its bf16 outputs handed on in float32 (forward_post), not around
        # the whole step: a step that ends between two optimizers (a GAN's) would leave bf16 tensors
        # behind for the part of the loop that runs without it.
        st.autocast_ctx = torch.autocast(device_type=st.device, dtype=torch.bfloat16)
        st.autocast_ctx.__enter__()
        st.autocast_depth = st.cdepth
    if isinstance(mod, torch.nn.modules.loss._Loss):
        return None
    train = mod.training and torch.is_grad_enabled()
    sp = st.span
    if train:
        st.train_forwards += 1
        if sp is not None and not st.opt_depth:  # a closure evaluates the step's batch again: no micro-batch
            sp["train_fwd"] += 1
        if st.model_id is None:
            st.model_id, st.model_ref = key, weakref.ref(mod)
    elif sp is not None:
        sp["eval_fwd"] += 1
    if st.last_loader is not None:
        d = st.loaders.get(st.last_loader)
        if d is not None:
            d["train_votes" if train else "eval_votes"] += 1
        st.last_loader = None
    if key == st.model_id and train:
        t0, c0 = time.perf_counter(), time.process_time()
        replayed = None
        if st.batch_lines is None and st.phase in ("warmup", "measure"):
            st.batch_lines = _batch_lines()
            try:
                if batch_fn.kind_of(st.apply):  # a verification run's fix to the loop's batch function
                    batch_fn.install(st, sys._getframe())
                elif st.batch_lines and not st.loaders:  # no DataLoader so far: time the batch function's calls
                    batch_fn.time_calls(st, sys._getframe())
            except Exception as exc:  # a source hasten cannot read as it expects: the samples say what they can
                if batch_fn.kind_of(st.apply):
                    st.apply_error = f"applying it failed: {messages.error_line(exc)}"
        # Kept only when it is data: a generator's output that a discriminator takes is part of a graph
        # the step frees, and replayed it would take autograd through that graph a second time.
        if st.model_args is None and st.phase == "measure" and args and is_data(args):
            st.model_args = fresh_copy(args)  # a copy: the loop may change its tensors in place
            if not st.cached_bytes:
                st.cached_bytes = batch_nbytes(args)
            if not st.batch_layout:  # a training loader's batch, where there is one, came first
                st.batch_layout = tensor_layout(args)
        # Step alone for a loop without a DataLoader: the kept batch stands in for arguments of the same
        # layout (data is still made by the loop; its time is outside compute, left out of the step).
        elif st.phase == "replay" and st.replay_args and sp is not None and same_layout(args, st.model_args):
            replayed = fresh_copy(st.model_args)
        steps.leave_out(st, t0, c0)  # the copies are hasten's time, not the step's
        return replayed
    return None


def _batch_lines() -> dict:
    """Where the loop makes the batch the model was just called with (:mod:`batch_source`)."""
    from hasten.profile.inject import batch_source
    try:
        return batch_source.batch_lines(sys._getframe(1))
    except Exception:  # a source hasten cannot read as it expects: no line is known to make the batch
        return {}


def forward_post(mod, args, out):
    st = state.current
    if st is None or st.finished or st.in_probe or st.cdepth <= 0:
        return None
    try:
        if st.autocast_ctx is not None and st.cdepth == st.autocast_depth:
            st.autocast_ctx.__exit__(None, None, None)
            st.autocast_ctx = None
            out = _as_without_autocast(mod, out)
        else:
            out = None
        steps.end_compute(st)
        steps.hook_done(st)
        return out
    except Exception as exc:
        messages.hasten_failed(st, "module forward hook", exc)
    return None


def _as_without_autocast(mod, out):
    """The forward's bf16 outputs in its parameters' dtype: the rest of the loop, which does not run
    under autocast (the step may end between two optimizers, a GAN's), sees the dtypes it always does."""
    dtype = next((p.dtype for p in mod.parameters() if p.is_floating_point()), None)
    if dtype is None or dtype == torch.bfloat16:
        return None
    return map_tensors(lambda t: t.to(dtype) if t.dtype == torch.bfloat16 else t, out)


def compute_interval(orig, what: str, on_return=None, comm: bool = False, sync: bool = False):
    """``orig`` wrapped: a compute interval around each call (and its time as communication, ``comm``;
    the device synchronised at its end, ``sync``); ``on_return(st)`` after a call that returned.

    An exception of hasten's own turns profiling off, never the call; the call's own
    exceptions pass through unchanged."""
    def wrapper(*args, **kwargs):
        st = state.current
        if st is None or st.finished or st.in_probe:
            return orig(*args, **kwargs)
        try:
            t0 = time.perf_counter()
            if what == "backward":
                st.backwards += 1
            steps.begin_compute(st, t0)
        except Exception as exc:
            messages.hasten_failed(st, f"{what} wrapper", exc)
            return orig(*args, **kwargs)
        try:
            result = orig(*args, **kwargs)
        except BaseException:
            _close(st, what, t0, comm, sync)
            steps.hook_done(st)
            raise
        _close(st, what, t0, comm, sync)
        if on_return is not None and not st.finished:
            try:
                on_return(st)
            except Exception as exc:
                messages.hasten_failed(st, f"{what} wrapper", exc)
        steps.hook_done(st)
        return result

    wrapper.__wrapped__ = orig
    wrapper.__name__ = getattr(orig, "__name__", what)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    return wrapper


def _close(st: State, what: str, t0: float, comm: bool, sync: bool) -> None:
    if st.finished:
        return
    try:
        if sync:
            device_sync.sync(st)
        steps.end_compute(st)
        if comm and st.span is not None:
            st.span["comm_s"] += time.perf_counter() - t0
    except Exception as exc:
        messages.hasten_failed(st, f"{what} wrapper", exc)


def patch_backward() -> None:
    torch.autograd.backward = compute_interval(torch.autograd.backward, "backward", on_return=steps.after_backward,
                                               sync=True)
    torch.nn.utils.clip_grad_norm_ = compute_interval(torch.nn.utils.clip_grad_norm_, "clip_grad_norm_")


def patch_optimizer_init() -> None:
    """Count the optimizers built: with none, a step ends at each backward() (:mod:`steps`)."""
    orig = torch.optim.Optimizer.__init__

    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        st = state.current
        if st is not None:
            st.optimizers_built += 1

    torch.optim.Optimizer.__init__ = __init__


def patch_collectives() -> None:
    import torch.distributed as dist
    if not dist.is_available():
        return
    for name in COLLECTIVES:
        orig = getattr(dist, name, None)
        if orig is not None:
            setattr(dist, name, compute_interval(orig, name, comm=True))
