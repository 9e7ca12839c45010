"""The fixes a verification run applies from outside the command (``HASTEN_PROFILE_APPLY``).

- ``echo=E``: batch echoing, each training batch handed on ``E`` times on average
  (:func:`hasten.echo.echo_copies`);
- ``workers=N``: every DataLoader built with ``N`` worker processes (persistent);
  ``workers=N,keep_iter`` also hands ``iter(loader)`` the loader's live iterator, for
  ``next(iter(loader))`` loops;
- ``comm=bf16``: hasten's bf16-compressing all-reduce hook
  (:mod:`hasten.profile.inject.ddp`);
- ``autocast``: bf16 autocast around each top-level forward of a module (the model, a loss
  module), as ``with autocast(): loss = model(x)`` would
  (:func:`hasten.profile.inject.torch_patches.forward_pre`).

Changes the training math: yes for ``echo``, ``comm=bf16`` and ``autocast`` (each says so
in the report), no for ``workers``; only in the verification runs.
"""

from __future__ import annotations

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


def echo_copies(st: State) -> int:
    """How many more times the training batch just drawn is handed on (``echo=E``; else 0)."""
    if not st.apply.startswith("echo="):
        return 0
    from hasten.echo import echo_copies as copies
    n = copies(float(st.apply[5:]), seed=0, epoch=0, index=st.fresh_index) - 1
    st.fresh_index += 1
    return n


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
        if workers == 0:
            bound.arguments.pop("prefetch_factor", None)
        elif "persistent_workers" in sig.parameters:
            bound.arguments["persistent_workers"] = True
        orig_init(*bound.args, **bound.kwargs)

    loader_cls.__init__ = __init__
