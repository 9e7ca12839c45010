"""A profile's #1 fix applied by the truth harness (``_real_script_truth.py``), on in some blocks of steps and off in the others.

The fix truth of ``profile_real_scripts.py`` (issue 43: "the #1 fix verified ... within 15% of the
truth") times the script as run against the same with the fix hasten recommended applied, in
alternating blocks of one process, as the data-free truth does. Each fix is named by the
``apply`` string of hasten's recommendation (``hasten.profile.records.Recommendation.apply``, the
value ``--verify`` hands its own runs) and applied here by the benchmark's own code, so that the
truth does not share hasten's verification's machinery:

- ``workers=N`` (``workers=N,keep_iter``): the training loader's twin, built with the loader's own
  arguments but ``N`` workers (persistent, as the fix's ``DataLoader(..., num_workers=N,
  persistent_workers=True)`` says; none for ``N = 0``), hands out the batches of a fix block; with
  ``keep_iter`` one iterator of the twin lives across passes;
- ``resident``: the training loader's first :data:`POOL` batches as run are kept in memory, and a
  fix block's batch is ``batch_size`` rows gathered from them at random, one ``index_select`` per
  tensor: what a loader of the dataset decoded once into memory does per batch (the gather's cost
  does not depend on how many rows are resident; decoding once happens before any step);
- ``autocast``: each top-level module call under ``torch.autocast(device, bfloat16)``, as ``with
  autocast(): loss = model(x)`` would;
- ``batch_fn=rows``: the script's batch function (``REAL_TRUTH_DATA_FN``) with its per-row
  comprehension gathered at once. This one rewrite is hasten's own
  (``hasten.profile.inject.rows_at_once.rewrite_rows``, the line its report prints): the fix is the
  rewritten source, and only its timing is the harness's.

Any other ``apply`` (batch echoing, which changes the steps a run needs; a batch function in
workers or pooled; bf16 gradient compression) is not applied here: the harness says so and the run
has no fix truth. The training loader is the first DataLoader the script iterates.

Changes the training math: yes for ``autocast`` (bf16) and ``resident`` (the first batches' rows
again), in these timing runs only.
"""

from __future__ import annotations

import inspect
import os

import torch
from torch.utils.data import DataLoader

APPLY = os.environ.get("REAL_TRUTH_FIX") or ""
POOL = 16  # batches kept for the resident fix (as hasten's verification keeps)
_loader_init = DataLoader.__init__
_loader_iter = DataLoader.__iter__
_module_call = torch.nn.Module.__call__
applied = {"uses": 0, "error": None, "training_loader": None}


def workers_of(apply: str) -> tuple[int, bool] | None:
    """``(N, keep_iter)`` of a ``workers=N[,keep_iter]`` fix; None for another fix."""
    if not apply.startswith("workers="):
        return None
    parts = apply[len("workers="):].split(",")
    return int(parts[0]), "keep_iter" in parts[1:]


def supported(apply: str | None) -> bool:
    """Whether the harness can apply this fix (the module's docstring says how)."""
    return bool(apply) and (apply in ("autocast", "resident", "batch_fn=rows") or workers_of(apply) is not None)


def _recording_init(self, *args, **kwargs):
    # the arguments the twin of a workers fix is built with
    self.__dict__["_truth_args"] = inspect.signature(_loader_init).bind(self, *args, **kwargs).arguments
    _loader_init(self, *args, **kwargs)


def _twin(loader: DataLoader, workers: int) -> DataLoader:
    args = {k: v for k, v in loader.__dict__["_truth_args"].items() if k != "self"}
    kwargs = args.pop("kwargs", {})
    args["num_workers"] = workers
    if workers == 0:  # both are refused without workers
        args.pop("prefetch_factor", None)
        args.pop("persistent_workers", None)
    else:
        args["persistent_workers"] = True
    return DataLoader(**args, **kwargs)


def ahead(loader: DataLoader) -> int:
    """Batches the fix's twin loader makes ahead (its workers x 2), skipped at each block's start."""
    w = workers_of(APPLY)
    return w[0] * 2 if w and applied["training_loader"] == id(loader) else 0


def copy_batch(batch):
    """A copy of a batch's tensors (in its lists, tuples and dicts); anything else as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(copy_batch(b) for b in batch)
    if isinstance(batch, dict):
        return type(batch)((k, copy_batch(v)) for k, v in batch.items())
    return batch


def _join(batches: list):
    """The batches joined leaf by leaf along their rows (a leaf that cannot be: the first batch's)."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        try:
            return torch.cat(batches) if first.dim() else first
        except RuntimeError:
            return first
    if isinstance(first, (list, tuple)) and not hasattr(first, "_fields"):
        return type(first)(_join([b[i] for b in batches]) for i in range(len(first)))
    if isinstance(first, dict):
        return type(first)((k, _join([b[k] for b in batches])) for k in first)
    return first


def _gather(leaf, idx, rows: int):
    """The rows ``idx`` of every leaf whose first dimension is the ``rows`` joined (a per-batch value: as is)."""
    if isinstance(leaf, torch.Tensor):
        return leaf.index_select(0, idx) if leaf.dim() and leaf.shape[0] == rows else leaf
    if isinstance(leaf, (list, tuple)) and not hasattr(leaf, "_fields"):
        return type(leaf)(_gather(x, idx, rows) for x in leaf)
    if isinstance(leaf, dict):
        return type(leaf)((k, _gather(v, idx, rows)) for k, v in leaf.items())
    return leaf


def _rows(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 0
    if isinstance(batch, (list, tuple)) and batch:
        return _rows(batch[0])
    if isinstance(batch, dict) and batch:
        return _rows(next(iter(batch.values())))
    return 0


class LoaderFix:
    """One pass of the training loader with the fix: ``draw(on)`` is the pass's next batch, the fix's
    in a fix block (``on``), the loader's own otherwise."""

    pools: dict[int, list] = {}      # per loader, across passes (resident)
    joined: dict[int, tuple] = {}
    twins: dict[int, DataLoader] = {}
    kept: dict[int, object] = {}     # per loader, the twin's iterator kept across passes (keep_iter)

    def __init__(self, loader: DataLoader, it):
        self.loader, self.it, self.twin_it = loader, it, None

    def draw(self, on: bool):
        key = id(self.loader)
        if not on:
            batch = next(self.it)
            pool = self.pools.setdefault(key, [])
            if APPLY == "resident" and len(pool) < POOL:
                pool.append(copy_batch(batch))
                self.joined.pop(key, None)
            return batch
        if APPLY == "resident":
            pool = self.pools.get(key)
            if not pool:  # nothing kept yet: the loader's own batch, kept
                return self.draw(False)
            if key not in self.joined:
                self.joined[key] = (_join(pool), sum(_rows(b) for b in pool), _rows(pool[0]))
            joined, rows, size = self.joined[key]
            applied["uses"] += 1
            return _gather(joined, torch.randint(rows, (size,)), rows)
        workers, keep = workers_of(APPLY)
        if key not in self.twins:
            self.twins[key] = _twin(self.loader, workers)
        if self.twin_it is None:
            self.twin_it = self.kept.get(key) if keep else None
            if self.twin_it is None:
                self.twin_it = _loader_iter(self.twins[key])
                if keep:
                    self.kept[key] = self.twin_it
        try:
            batch = next(self.twin_it)
        except StopIteration:  # a kept iterator's pass is over: the next one
            self.twin_it = self.kept[key] = _loader_iter(self.twins[key])
            batch = next(self.twin_it)
        applied["uses"] += 1
        return batch


def for_loader(loader: DataLoader, it) -> LoaderFix | None:
    """The fix of the training loader's pass (the first loader the script iterates); None for another
    loader or a fix that is not the loader's."""
    if APPLY != "resident" and workers_of(APPLY) is None:
        return None
    if applied["training_loader"] is None:
        applied["training_loader"] = id(loader)
    return LoaderFix(loader, it) if applied["training_loader"] == id(loader) else None


def autocast_call(is_on):
    """``nn.Module.__call__`` with each top-level call under bf16 autocast while ``is_on()``."""
    depth = [0]

    def __call__(self, *args, **kwargs):
        if depth[0] or not is_on():
            depth[0] += 1
            try:
                return _module_call(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        param = next(self.parameters(), None)
        device = param.device.type if param is not None else "cpu"
        depth[0] += 1
        try:
            with torch.autocast(device, dtype=torch.bfloat16):
                out = _module_call(self, *args, **kwargs)
            applied["uses"] += 1
            return out
        finally:
            depth[0] -= 1
    return __call__


def rows_rewritten(fn):
    """A copy of the batch function ``fn`` with its per-row comprehension gathered at once (hasten's
    rewrite, the fix its report prints); None, with the reason in ``applied``, where there is none."""
    import types

    from hasten.profile.inject.rows_at_once import rewrite_rows
    fixed = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    if not rewrite_rows(fixed):
        applied["error"] = f"{fn.__name__}() has no per-row comprehension to gather at once"
        return None
    return fixed


def install(is_on) -> None:
    """Patch what the fix needs (``is_on()``: whether the current step is in a fix block)."""
    if not supported(APPLY):
        applied["error"] = f"the benchmark does not apply {APPLY!r}"
        return
    if workers_of(APPLY) is not None:
        DataLoader.__init__ = _recording_init
    if APPLY == "autocast":
        torch.nn.Module.__call__ = autocast_call(is_on)


def report() -> dict:
    """What the run's JSON says of the fix: what it was, how often it acted, why it could not."""
    error = applied["error"]
    if error is None and not applied["uses"]:
        error = {"batch_fn=rows": "the batch function was never called in a fix block"}.get(
            APPLY, "the fix never acted in a fix block (no training loader, or no module call)")
    return {"fix": APPLY, "fix_uses": applied["uses"], "fix_error": error}

