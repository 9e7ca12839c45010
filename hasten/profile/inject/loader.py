"""The DataLoader as the profile sees it: which loader feeds training, and how long each batch took.

Every torch ``DataLoader`` iterator is timed in ``__next__``, through the private class
both of its iterators derive from (``torch.utils.data.dataloader._BaseDataLoaderIter``).
A loader is a training loader when its batches go into training-mode forwards with
grad enabled (votes cast by :func:`hasten.profile.inject.torch_patches.forward_pre`).
Private attributes read from an iterator (``_num_yielded``, ``_workers``,
``_num_workers``, ``_prefetch_factor``) are read with a default; a torch without the
class or its methods gets one line and no loader timing, never a crash.

The first batch of a training loader is copied when it comes (before the loop can change
it in place, ``batch.pop("labels")``), its copy's time left out of the step; the replayed
steps get a fresh copy of it each, in place of the pass's own batches and never past its
end (``len(loader)``: :mod:`hasten.profile.inject.epoch_fit`), the batches handed out in
the pass counted on the iterator (reset by ``_reset``, where a persistent workers'
iterator starts its next pass).

In a verification run of the echo fix, the training loader's batches are handed out by
``hasten.echo.echo_batches`` with the arguments the report prints (:func:`_draw`); in one of the
device-resident loader, gathered from its warm-up's batches kept in memory
(:mod:`hasten.profile.inject.resident`). The
first batches of an IterableDataset's workers are fingerprinted: the same batch from
every worker means a dataset that ignores ``get_worker_info()`` (:func:`_check_workers`).

Changes the training math: no (in the replayed steps, a training loader hands out its
kept batch again: see :mod:`hasten.profile.inject.phases`; in the echo fix's verification
run, its batches are echoed).
"""

from __future__ import annotations

import time

from hasten.cpu_time import pid_cpu_s, runqueue_s
from hasten.profile.inject import fixes, messages, resident, state, steps
from hasten.profile.inject.epoch_fit import handed, pass_length
from hasten.profile.inject.batches import batch_nbytes, fingerprint, fresh_copy, tensor_layout
from hasten.profile.inject.state import State, is_training_loader


def _is_iterable(dataset) -> bool:
    from torch.utils.data import IterableDataset
    return isinstance(dataset, IterableDataset)


def loader_name(loader) -> str:
    ds = getattr(loader, "dataset", None)
    return f"DataLoader({type(ds).__name__}, batch_size={getattr(loader, 'batch_size', None)})"


def patch_dataloader(st: State) -> None:
    """Time every DataLoader iterator; one line instead if this torch has no iterator class to patch."""
    try:
        from torch.utils.data import dataloader as dl
    except ImportError:
        messages.say(st, "this torch has no torch.utils.data.dataloader; loader timing off")
        return
    base = getattr(dl, "_BaseDataLoaderIter", None)
    missing = ("_BaseDataLoaderIter" if base is None else
               next((m for m in ("__init__", "__next__") if m not in vars(base)), None))
    if missing:
        messages.say(st, f"this torch's DataLoader has no {missing}; loader timing off")
        return
    orig_init = base.__init__
    from hasten.profile.inject.probes import Repeat

    def __init__(it, loader, *args, **kwargs):
        orig_init(it, loader, *args, **kwargs)
        if state.current is None or st.finished or isinstance(getattr(loader, "dataset", None), Repeat):
            return  # our own hand-off probe is no loader of the command
        try:
            _new_iterator(st, it, loader)
        except Exception as exc:
            messages.hasten_failed(st, "DataLoader iterator hook", exc)

    base.__init__ = __init__
    base.__next__ = _timed_next(base.__next__)
    orig_reset = vars(base).get("_reset")
    if orig_reset is not None:  # a persistent workers' iterator starts each pass here, not in __init__
        def _reset(it, *args, **kwargs):
            it.__dict__["_hasten_handed"] = 0
            return orig_reset(it, *args, **kwargs)
        base._reset = _reset


def _new_iterator(st: State, it, loader) -> None:
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
        d["iterable"] = _is_iterable(getattr(loader, "dataset", None))
        if d["workers"] > 1 and d["iterable"]:
            d["worker_firsts"] = []  # _check_workers
        for attr in ("_num_yielded", "_num_workers"):
            if not hasattr(it, attr):
                messages.say(st, f"this torch's DataLoader iterator has no {attr}; worker start-up detection off")
    d["iters"] += 1
    d["pids"] = [p for p in d["pids"] if pid_cpu_s(p) is not None]
    # (The workers themselves are noted at the iterator's first batch, _note_workers: the
    # multiprocessing iterator starts them after the base class's __init__, which runs this.)


def _note_workers(st: State, d: dict, it) -> None:
    """Note the pids of ``it``'s worker processes, once per iterator, at its first batch."""
    if not d["workers"] or it.__dict__.get("_hasten_workers_noted"):
        return
    it._hasten_workers_noted = True
    workers = getattr(it, "_workers", None)
    if workers is None:
        if not d.get("no_workers_said"):
            d["no_workers_said"] = True
            messages.say(st, "this torch's DataLoader iterator has no _workers; its workers' CPU is not counted")
        return
    d["pids"] = d["pids"] + [w.pid for w in workers if getattr(w, "pid", None) is not None]


def _timed_next(orig):
    def __next__(it):
        st = state.current
        lid = getattr(it, "_hasten_loader", None)
        if st is None or st.finished or st.in_probe or lid is None:
            return orig(it)
        try:
            d = st.loaders[lid]
            training = is_training_loader(st, lid)
            t0, c0, rq0 = time.perf_counter(), time.process_time(), runqueue_s()
            replaying = st.phase == "replay" and training and st.cached is not None
        except Exception as exc:
            messages.hasten_failed(st, "DataLoader timing", exc)
            return orig(it)
        try:
            if replaying:
                if handed(it) >= pass_length(it, float("inf")):
                    raise StopIteration  # the pass ends on time: a loop trusts len(loader)
                batch = fresh_copy(st.cached)  # a copy each time: the loop may change its batch in place
                # the pass under way is this iterator's, also where every batch of it is a replayed one (the
                # replayed steps waited for it): the loader probe pulls from it, not the last pass's, ended
                st.train_iter = (it, orig)
            else:
                batch = _draw(st, it, orig, training)
        except StopIteration:  # the end of an epoch is no batch; a kept iterator starts afresh
            owner = getattr(it, "_hasten_owner", None)
            if owner is not None and owner.__dict__.get("_hasten_it") is it:
                del owner.__dict__["_hasten_it"]
            raise
        it.__dict__["_hasten_handed"] = handed(it) + 1
        try:
            if not replaying:
                t0, c0 = _keep(st, it, orig, batch, training, t0, c0)
                _check_workers(st, d, batch)
                _note_workers(st, d, it)
            steps.sync(st)
            _account(st, it, d, lid, t0, c0, rq0, replaying)
        except Exception as exc:
            messages.hasten_failed(st, "DataLoader timing", exc)
        return batch
    return __next__


def _keep(st: State, it, orig, batch, training: bool, t0: float, c0: float) -> tuple[float, float]:
    """Keep what the probes and fixes need of a fresh batch; its copy's time is not the loader's."""
    if training and not st.cached_copy:
        t, c = time.perf_counter(), time.process_time()
        st.cached, st.cached_copy = fresh_copy(batch), True  # before the loop can change it in place
        steps.leave_out(st, t, c)
        t0, c0 = t0 + (time.perf_counter() - t), c0 + (time.process_time() - c)
    elif st.cached is None:
        st.cached = batch
    if not st.cached_bytes:
        st.cached_bytes = batch_nbytes(batch)
    if training and not st.batch_layout:
        st.batch_layout = tensor_layout(batch)
    if training:
        st.train_iter = (it, orig)
    return t0, c0


def _draw(st: State, it, orig, training: bool):
    """The iterator's next batch: the loader's own, or in a verification run of the echo fix
    (``echo=``), the next of ``echo_batches`` over this pass of the training loader, the
    call the report prints, from the pass's first batch on (:func:`fixes.echoed`)."""
    if training and st.apply == resident.APPLY:
        return resident.draw(st, it, orig)
    echo = it.__dict__.get("_hasten_echo")
    if echo is None and fixes.echo_arguments(st.apply):
        first = it.__dict__.pop("_hasten_first", None)
        if training:
            # The pass's first batch went out before its forward said this loader trains:
            # the echo stage starts from it, so that its runs of `group` batches fall on the
            # loop's steps, and hands it out again first, which the loop has had already.
            echo = it._hasten_echo = fixes.echoed(st, _passes(it, orig, first))
            if first is not None:
                next(echo)
        elif first is None and "_hasten_drawn" not in it.__dict__:
            it._hasten_drawn = True
            it._hasten_first = batch = orig(it)
            return batch
        else:
            it._hasten_echo = echo = False  # a second batch before any training forward: not trained on
    return next(echo) if echo else orig(it)


def _passes(it, orig, first):
    """The batches of one pass of ``it``, ``first`` (already drawn) first."""
    if first is not None:
        yield first
    while True:
        try:
            yield orig(it)
        except StopIteration:
            return


def _check_workers(st: State, d: dict, batch) -> None:
    """Fingerprint the first batch of each worker of an IterableDataset's first pass.

    A DataLoader hands out the batches of its workers in turn, so the first ``workers``
    batches are one per worker. An IterableDataset whose ``__iter__`` ignores
    ``torch.utils.data.get_worker_info()`` yields every item in every worker: those batches
    are then the same, and the run trains on each item ``workers`` times (the workers fix
    of issue 34's report did so in 20 of 20 steps, unannounced)."""
    firsts = d.get("worker_firsts")
    if firsts is None or len(firsts) >= d["workers"] or d["iters"] > 1 or fixes.echo_arguments(st.apply):
        return
    t, c = time.perf_counter(), time.process_time()
    firsts.append(fingerprint(batch))
    if len(firsts) == d["workers"]:
        d["worker_duplicates"] = {"workers": d["workers"], "distinct": len(set(firsts))}
    steps.leave_out(st, t, c)


def _account(st: State, it, d: dict, lid: int, t0: float, c0: float, rq0: float, replaying: bool) -> None:
    t1 = time.perf_counter()
    d["batches"] += 1
    d["batches_in_span"] = d.get("batches_in_span", 0) + 1 if d.get("span") is st.span else 1
    d["span"] = st.span
    st.last_loader = lid
    sp = st.span
    if sp is not None:
        sp["loader"][lid] = sp["loader"].get(lid, 0.0) + (t1 - t0)
        sp["loader_batches"][lid] = sp["loader_batches"].get(lid, 0) + 1
        sp["loader_cpu"][lid] = sp["loader_cpu"].get(lid, 0.0) + (time.process_time() - c0)
        sp["rq_loader"] += runqueue_s() - rq0
        if getattr(it, "_num_yielded", 2) == 1 and not replaying and d["workers"]:
            sp["epoch_start"] = True  # worker start-up is not steady state
