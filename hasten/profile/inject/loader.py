"""The DataLoader as the profile sees it: which loader feeds training, and how long each batch took.

Every torch ``DataLoader`` iterator is timed in ``__next__``, through the private class
both of its iterators derive from (``torch.utils.data.dataloader._BaseDataLoaderIter``).
A loader is a training loader when its batches go into training-mode forwards with
grad enabled (votes cast by :func:`hasten.profile.inject.torch_patches.forward_pre`).
Private attributes read from an iterator (``_num_yielded``, ``_workers``,
``_num_workers``, ``_prefetch_factor``) are read with a default; a torch without the
class or its methods gets one line and no loader timing, never a crash.

Changes the training math: no (in the replayed steps, a training loader hands out its
kept batch again: see :mod:`hasten.profile.inject.phases`).
"""

from __future__ import annotations

import sys
import time

from hasten.profile.inject import fixes, state, steps
from hasten.profile.inject.batches import batch_nbytes
from hasten.profile.inject.proc_times import pid_cpu_s, runqueue_s
from hasten.profile.inject.state import State


def is_training_loader(st: State, lid: int) -> bool:
    d = st.loaders.get(lid)
    return d is not None and d["train_votes"] > d["eval_votes"]


def loader_name(loader) -> str:
    ds = getattr(loader, "dataset", None)
    return f"DataLoader({type(ds).__name__}, batch_size={getattr(loader, 'batch_size', None)})"


def patch_dataloader(st: State) -> None:
    """Time every DataLoader iterator; one line instead if this torch has no iterator class to patch."""
    try:
        from torch.utils.data import dataloader as dl
    except ImportError:
        sys.stderr.write("hasten profile: this torch has no torch.utils.data.dataloader; loader timing off\n")
        return
    base = getattr(dl, "_BaseDataLoaderIter", None)
    missing = ("_BaseDataLoaderIter" if base is None else
               next((m for m in ("__init__", "__next__") if m not in vars(base)), None))
    if missing:
        sys.stderr.write(f"hasten profile: this torch's DataLoader has no {missing}; loader timing off\n")
        return
    orig_init = base.__init__
    from hasten.profile.inject.probes import Repeat

    def __init__(it, loader, *args, **kwargs):
        orig_init(it, loader, *args, **kwargs)
        if state.current is None or st.finished or isinstance(getattr(loader, "dataset", None), Repeat):
            return  # our own hand-off probe is no loader of the command
        lid = id(loader)
        it._hasten_loader = lid
        it._hasten_owner = loader
        d = st.loaders.get(lid)
        if d is None:
            try:
                n = len(loader.dataset)
            except (TypeError, AttributeError):
                n = None
            d = st.loaders[lid] = {"name": loader_name(loader), "batches": 0, "train_votes": 0, "eval_votes": 0,
                                   "workers": getattr(loader, "num_workers", 0),
                                   "batch_size": getattr(loader, "batch_size", None),
                                   "dataset_len": n, "pids": [], "iters": 0}
        d["iters"] += 1
        d["pids"] = ([p for p in d["pids"] if pid_cpu_s(p) is not None]
                     + [w.pid for w in getattr(it, "_workers", [])])

    base.__init__ = __init__
    base.__next__ = _timed_next(base.__next__)


def _timed_next(orig):
    def __next__(it):
        st = state.current
        lid = getattr(it, "_hasten_loader", None)
        if st is None or st.finished or lid is None:
            return orig(it)
        d = st.loaders[lid]
        training = is_training_loader(st, lid)
        t0, c0, rq0 = time.perf_counter(), time.process_time(), runqueue_s()
        replaying = st.phase == "replay" and training and st.cached is not None
        if replaying:
            batch = st.cached
        elif training and st.pending_copies > 0:
            st.pending_copies -= 1
            batch = st.cached
        else:
            try:
                batch = orig(it)
            except StopIteration:  # the end of an epoch is no batch; a kept iterator starts afresh
                owner = getattr(it, "_hasten_owner", None)
                if owner is not None and owner.__dict__.get("_hasten_it") is it:
                    del owner.__dict__["_hasten_it"]
                raise
            if training or st.cached is None:
                st.cached = batch
                if not st.cached_bytes:
                    st.cached_bytes = batch_nbytes(batch)
            if training:
                st.train_iter = (it, orig)
                st.pending_copies = fixes.echo_copies(st)
        steps.sync(st)
        t1 = time.perf_counter()
        d["batches"] += 1
        d["batches_in_span"] = d.get("batches_in_span", 0) + 1 if d.get("span") is st.span else 1
        d["span"] = st.span
        st.last_loader = lid
        sp = st.span
        if sp is not None:
            sp["loader"][lid] = sp["loader"].get(lid, 0.0) + (t1 - t0)
            sp["loader_cpu"][lid] = sp["loader_cpu"].get(lid, 0.0) + (time.process_time() - c0)
            sp["rq_loader"] += runqueue_s() - rq0
            if getattr(it, "_num_yielded", 2) == 1 and not replaying and d["workers"]:
                sp["epoch_start"] = True  # worker start-up is not steady state
        return batch
    return __next__
