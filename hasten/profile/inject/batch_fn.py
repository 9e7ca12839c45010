"""The fixes of a loop without a DataLoader, applied by a verification run to the script's batch function.

The report prints them as code changes (:func:`hasten.profile.input_fixes.input_fixes`); a
verification run (``HASTEN_PROFILE_APPLY=batch_fn=...``) applies each to the function that
makes the batch, so that the #1 fix of such a loop is measured, not only predicted (issue
32, item 5). The function is the one called on the lines that make the batch, in the frame
that calls the model (``X, Y = get_batch('train')``: :func:`batch_source.batch_function`),
and the fix is applied at the model's first training forward, in the warm-up:

- ``batch_fn=workers:N``: the calls go to ``N`` DataLoader workers, each making batches with
  the function (:class:`Calls`, as the printed ``Batches`` dataset does), one loader per
  distinct arguments (``'train'`` and ``'val'``);
- ``batch_fn=echo:E``: each batch handed out ``E`` times, a fresh copy each time;
- ``batch_fn=rows``: the function's per-row comprehensions rewritten as one index of every
  row (:func:`rows_at_once.rewrite_rows`);
- ``batch_fn=pool:N``: ``N`` results made at its first call and handed out in turn (:func:`pooled`).

In a profiling run (no fix applied), the function's calls are timed instead (:func:`time_calls`).

A fix that cannot be applied (no such function, nothing to rewrite) is said in the rank's
report (``apply_error``): the launcher then reports the verification as failed, never the
unchanged run as the fix's.

Changes the training math: ``echo`` and ``pool`` yes (batches repeated), ``workers`` (the batches come
from other processes' random streams) and ``rows`` (the same rows) no; only in the
verification runs.
"""

from __future__ import annotations

from hasten.profile.inject import batch_shape, batch_source, messages, rows_at_once
from hasten.profile.inject.batches import fresh_copy
from hasten.profile.inject.state import State

PREFIX = "batch_fn="


def kind_of(apply: str) -> tuple[str, int] | None:
    """``("workers", 2)``, ``("echo", 2)`` or ``("rows", 0)`` for a ``batch_fn=`` value; None for another fix."""
    if not apply.startswith(PREFIX):
        return None
    kind, _, arg = apply[len(PREFIX):].partition(":")
    return kind, int(arg or 0)


def install(st: State, frame) -> None:
    """Apply ``st.apply``'s fix to the batch function of the loop that called the model from ``frame``."""
    kind, n = kind_of(st.apply)
    found = batch_source.batch_function(frame, st.batch_lines or {})
    if found is None:
        st.apply_error = "no function of the script's own makes the batch on the lines that assign the model's input"
    elif kind == "rows":
        if not rows_at_once.rewrite_rows(found[2]):
            st.apply_error = f"{found[1]}() has no per-row comprehension of windows to rewrite"
    elif kind == "workers":
        found[0][found[1]] = in_workers(found[2], n)
    elif kind == "echo":
        found[0][found[1]] = echoed(found[2], n)
    elif kind == "pool":
        found[0][found[1]] = pooled(found[2], n)
    else:
        st.apply_error = f"unknown batch function fix {kind!r}"
    if st.apply_error:
        messages.say(st, f"cannot apply {st.apply}: {st.apply_error}")


def time_calls(st: State, frame) -> None:
    """Time the batch function's calls outside compute in each step (a profiling run of a loop without a
    DataLoader): its time is data, exactly, where the stack sampler's 20 samples a second would
    leave a short run's share unknown (:func:`hasten.profile.attribution.data_split`). The name in the
    script's globals is bound to a timing wrapper (``functools.wraps``: the same name, docstring and
    signature); the sampler counts its samples inside the function apart (``st.batch_fn_code``). Where the
    lines that make the batch do nothing but call it (``st.batch_call_only``), the timed calls are all
    of the data (:func:`hasten.profile.attribution.data_split`)."""
    found = batch_source.batch_function(frame, st.batch_lines or {})
    if found is None:
        return
    ns, name, fn = found
    st.batch_fn_code = fn.__code__
    st.batch_call_only = batch_source.only_the_call(frame, st.batch_lines or {}, name)
    st.batch_fn_shape = batch_shape.function_shape(fn)
    ns[name] = timed(st, fn)


def timed(st: State, fn):
    """``fn``, its calls' wall time inside a step and outside compute added to the step's ``batch_fn_s``."""
    import functools
    import time

    @functools.wraps(fn)
    def batch(*args, **kwargs):
        sp = st.span
        if sp is None or st.cdepth or st.finished:
            return fn(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        finally:
            if st.span is sp:
                sp["batch_fn_s"] += time.perf_counter() - t0
        if st.batch_fn_result is None:  # the batch a worker would send, for the hand-off probe: hasten's time
            t1 = time.perf_counter()
            st.batch_fn_result = fresh_copy(result)
            if st.span is sp:
                sp["t0"] += time.perf_counter() - t1
        return result

    return batch


class Calls:
    """A map-style dataset whose every item is a new ``fn(*args, **kwargs)``: a worker that is handed an
    index makes a batch (module level, and no torch base class: spawned workers import it, and nothing
    here imports torch before the script does)."""

    def __init__(self, fn, args: tuple, kwargs: dict) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __len__(self) -> int:
        return 2**62  # endless, as the loop's calls are

    def __getitem__(self, i):
        return self.fn(*self.args, **self.kwargs)


def _key(args: tuple, kwargs: dict) -> str:
    return repr((args, sorted(kwargs.items())))


def in_workers(fn, workers: int):
    """``fn`` with its calls made ahead by ``workers`` DataLoader worker processes, one loader per arguments."""
    from torch.utils.data import DataLoader

    iters: dict = {}

    def batch(*args, **kwargs):
        key = _key(args, kwargs)
        if key not in iters:
            iters[key] = iter(DataLoader(Calls(fn, args, kwargs), batch_size=None, num_workers=workers,
                                         persistent_workers=True))
        return next(iters[key])

    return batch


def echoed(fn, factor: int):
    """``fn`` with each result handed out ``factor`` times (a fresh copy each: the loop may change it)."""
    kept: dict = {}

    def batch(*args, **kwargs):
        key = _key(args, kwargs)
        left, value = kept.get(key, (0, None))
        if left == 0:
            left, value = factor, fn(*args, **kwargs)
        kept[key] = (left - 1, value)
        return fresh_copy(value)

    return batch


def pooled(fn, batches: int):
    """``fn``'s first ``batches`` results per arguments, all made at its first call with them, then handed out
    in turn (a fresh copy each): the fixed set of batches made once, before the steps that use it, that the
    report prints for a function drawing its data at random each call (:mod:`hasten.profile.prepare_once`).
    The set is made inside the call that first needs it, a warm-up step of a verification run (the fix is
    installed there), so that its measured steps are the set's steady state, not its making."""
    kept: dict = {}

    def batch(*args, **kwargs):
        key = _key(args, kwargs)
        if key not in kept:
            kept[key] = [[fn(*args, **kwargs) for _ in range(batches)], 0]
        entry = kept[key]
        pool, i = entry
        entry[1] = (i + 1) % batches
        return fresh_copy(pool[i])

    return batch
