"""Where the profile meets torch: module forward hooks, ``backward``, ``clip_grad_norm_``, collectives.

- Global module forward hooks (:func:`torch.nn.modules.module.register_module_forward_pre_hook`)
  find the model wherever it is built: a top-level call of a module with parameters (or
  of a loss module), not nested in another, is a compute interval. The first module with
  parameters called in training mode with grad enabled is taken as the model; its first
  positional arguments in the measured window are kept for the replay of a loop without
  a DataLoader.
- ``torch.autograd.backward`` (which ``Tensor.backward`` calls), ``clip_grad_norm_`` and
  the ``torch.distributed`` collectives are wrapped: compute intervals, and the
  collectives' time as communication. Each wrapper keeps the original as ``__wrapped__``.

Changes the training math: no (in the replayed steps of a loop without a DataLoader,
the model's arguments are the kept batch: see :mod:`hasten.profile.inject.phases`).
"""

from __future__ import annotations

import time

from hasten.profile.inject import state, steps
from hasten.profile.inject.batches import batch_nbytes, has_tensor

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "barrier", "gather", "scatter")


def forward_pre(mod, args):
    st = state.current
    if st is None or st.finished:
        return None
    if st.cdepth > 0:
        st.cdepth += 1
        return None
    key = id(mod)
    hp = st.has_params.get(key)
    if hp is None:
        import torch
        hp = any(True for _ in mod.parameters()) or isinstance(mod, torch.nn.modules.loss._Loss)
        st.has_params[key] = hp
    if not hp:
        return None
    import torch
    steps.begin_compute(st)
    st.forwards += 1
    loss_module = isinstance(mod, torch.nn.modules.loss._Loss)
    if loss_module:
        return None
    train = mod.training and torch.is_grad_enabled()
    sp = st.span
    if train:
        st.train_forwards += 1
        if sp is not None:
            sp["train_fwd"] += 1
        if st.model_id is None:
            st.model_id = key
    elif sp is not None:
        sp["eval_fwd"] += 1
    if st.last_loader is not None:
        d = st.loaders.get(st.last_loader)
        if d is not None:
            d["train_votes" if train else "eval_votes"] += 1
        st.last_loader = None
    if key == st.model_id and train:
        if st.model_args is None and st.phase == "measure" and args and has_tensor(args):
            st.model_args = args
            if not st.cached_bytes:
                st.cached_bytes = batch_nbytes(args)
        # Step alone for a loop without a DataLoader: the captured batch replayed (data is still made
        # by the loop; its time is outside compute and left out of the replayed step).
        if st.phase == "replay" and st.model_args is not None and st.span is not None and not st.span["loader"]:
            return st.model_args
    return None


def forward_post(mod, args, out):
    st = state.current
    if st is None or st.finished or st.cdepth <= 0:
        return None
    steps.end_compute(st)
    return None


def patch_backward() -> None:
    import torch
    orig = torch.autograd.backward

    def backward(*args, **kwargs):
        st = state.current
        if st is None or st.finished:
            return orig(*args, **kwargs)
        st.backwards += 1
        steps.begin_compute(st)
        try:
            return orig(*args, **kwargs)
        finally:
            steps.sync(st)
            steps.end_compute(st)

    backward.__wrapped__ = orig
    torch.autograd.backward = backward
    clip = torch.nn.utils.clip_grad_norm_

    def clip_grad_norm_(*args, **kwargs):
        st = state.current
        if st is None or st.finished:
            return clip(*args, **kwargs)
        steps.begin_compute(st)
        try:
            return clip(*args, **kwargs)
        finally:
            steps.end_compute(st)

    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_


def patch_collectives() -> None:
    import torch.distributed as dist
    if not dist.is_available():
        return
    for name in COLLECTIVES:
        orig = getattr(dist, name, None)
        if orig is None:
            continue

        def make(orig):
            def collective(*args, **kwargs):
                st = state.current
                if st is None or st.finished:
                    return orig(*args, **kwargs)
                t0 = time.perf_counter()
                steps.begin_compute(st)
                try:
                    return orig(*args, **kwargs)
                finally:
                    steps.end_compute(st)
                    if st.span is not None:
                        st.span["comm_s"] += time.perf_counter() - t0
            collective.__wrapped__ = orig
            collective.__name__ = orig.__name__
            return collective
        setattr(dist, name, make(orig))
