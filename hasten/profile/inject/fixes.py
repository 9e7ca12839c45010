"""The fixes a verification run applies from outside the command (``HASTEN_PROFILE_APPLY``).

- ``echo=E`` or ``echo=E,group=K``: batch echoing, the training loader's batches handed
  out as ``hasten.echo.echo_batches(loader, E, group=K)`` hands them out, the call the
  report prints (:func:`hasten.profile.fix_code.echo_code`): under gradient accumulation over K micro-batches a
  step's K batches are echoed together and stay distinct;
- ``workers=N``: every DataLoader built with ``N`` worker processes (persistent);
  ``workers=N,keep_iter`` also hands ``iter(loader)`` the loader's live iterator, for
  ``next(iter(loader))`` loops;
- ``comm=bf16``: hasten's bf16-compressing all-reduce hook
  (:mod:`hasten.profile.inject.ddp`);
- ``autocast``: bf16 autocast around each top-level forward of a module (the model, a loss
  module), as ``with autocast(): loss = model(x)`` would
  (:func:`hasten.profile.inject.torch_patches.forward_pre`).
- ``resident``: the training loader's batches gathered from its warm-up's batches in memory,
  as a device-resident loader gathers them (:mod:`hasten.profile.inject.resident`);
- ``batch_fn=...``: a loop without a DataLoader's batch function in workers, echoed, or with
  its rows made at once (:mod:`hasten.profile.inject.batch_fn`).

With ``HASTEN_PROFILE_SWITCH`` (``"<steps>:<pattern>"``), a fix read where each step happens
(``autocast``, ``comm=bf16``) is switched on and off between steps (:func:`switch_fix`): on in
the measured window's blocks of ``<steps>`` steps that ``pattern`` marks 1, on every other
warm-up step (both kinds warm), off after the window; :mod:`hasten.profile.verify` compares
the blocks.

Changes the training math: yes for ``echo``, ``comm=bf16`` and ``autocast`` (each says so
in the report), no for ``workers``; only in the verification runs.
"""

from __future__ import annotations

from hasten.profile.fix_code import echo_arguments
from hasten.profile.inject.state import State


def install_fixes(st: State) -> None:
    """Apply the DataLoader fixes of ``st.apply`` (the others act where the step happens)."""
    if not (st.apply.startswith("workers=") or "keep_iter" in st.apply.split(",")):
        return
    from torch.utils.data import DataLoader
    if st.apply.startswith("workers="):
        override_workers(DataLoader, int(st.apply[8:].split(",")[0]))
    if "keep_iter" in st.apply.split(","):
        keep_one_iterator(DataLoader)


def echoed(st: State, batches):
    """``batches`` (one pass of the training loader) as the printed fix hands them out."""
    from hasten.echo import echo_batches
    factor, group = echo_arguments(st.apply)
    return echo_batches(batches, factor, group=group)


def keep_one_iterator(loader_cls) -> None:
    """``iter(loader)`` hands back the loader's live iterator: ``next(iter(loader))`` per step draws
    from one pass (and one set of workers) instead of starting a new one each step."""
    orig_iter = loader_cls.__iter__

    def __iter__(self):
        it = self.__dict__.get("_hasten_it")
        if it is None:
            it = orig_iter(self)
            self.__dict__["_hasten_it"] = it
        return it

    loader_cls.__iter__ = __iter__


def override_workers(loader_cls, workers: int) -> None:
    """Build every DataLoader with ``workers`` worker processes."""
    import inspect
    orig_init = loader_cls.__init__
    sig = inspect.signature(orig_init)

    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        bound.arguments["num_workers"] = workers
        if workers == 0:  # both are refused without workers
            bound.arguments.pop("prefetch_factor", None)
            bound.arguments.pop("persistent_workers", None)
        elif "persistent_workers" in sig.parameters:
            bound.arguments["persistent_workers"] = True
        orig_init(*bound.args, **bound.kwargs)

    loader_cls.__init__ = __init__


def switch_fix(st: State) -> None:
    """Set the fix for the step that opens next, from ``HASTEN_PROFILE_SWITCH`` (a no-op without it)."""
    if not st.settings.switch:
        return
    block, _, pattern = st.settings.switch.partition(":")
    if st.phase == "warmup":
        on = st.phase_step % 2 == 0
    elif st.phase == "measure":
        i = st.phase_step // int(block)
        on = i < len(pattern) and pattern[i] == "1"
    else:
        on = False
    st.apply = st.settings.apply if on else ""
