"""The truth for ``profile_real_scripts.py``: a script's optimizer steps as run against the same with its data made free.

    python benchmarks/_real_script_truth.py SCRIPT [ARGS...]

with ``REAL_TRUTH_OUT`` (the JSON written), ``REAL_TRUTH_WARMUP`` (steps), ``REAL_TRUTH_BLOCK``
(measured steps per block), ``REAL_TRUTH_PAIRS`` (pairs of blocks) and, for a loop without a
DataLoader, ``REAL_TRUTH_DATA_FN`` (the name of the script's function that makes a batch). With
``REAL_TRUTH_FIX`` (a fix's ``apply``, as hasten's recommendation names it) the other condition
is the script with that fix applied instead of its data made free (``_real_script_fix.py``: the
fix truth), and ``REAL_TRUTH_ORDER`` may give the blocks' order (``0`` as run, ``1`` the fix; one
character per block). It runs the script unchanged, as ``python SCRIPT ARGS`` would (``runpy``, ``__main__``, its folder
first on ``sys.path``), with nothing of hasten imported.

**Alternating in one process.** On a shared machine the load drifts within seconds (two runs
of the same script a few seconds apart differed by 2x here), so the two conditions are
measured in alternating blocks of steps in the same process: as run, data free, as run, data
free, ... Each block starts with ``P`` steps that are not counted, ``P`` the batches the
DataLoader workers can hold made ahead (workers x prefetch factor; 0 without workers): in a
data-free block the workers first fill their queues, and an as-run block first eats the
batches made during the data-free one. The truth is the mean step of the counted as-run steps
against that of the counted data-free steps. A fix truth's warm-up alternates the two conditions
(both warm before the first block: bf16 kernels, the fix's own workers), and its blocks follow
``REAL_TRUTH_ORDER`` (``profile_real_scripts.py`` shuffles each pair's two).

- **A step** ends when the first optimizer that steps (a global step post-hook: a GAN's first
  optimizer sets the pace) finishes ``step()``; a script that builds no ``torch.optim``
  optimizer (weights updated by hand) has its steps end at each ``torch.autograd.backward``.
  After the last block the JSON is written and the process exits (``os._exit(0)``), so an
  endless script is fine; one that ends first writes what it had.
- **Data made free**: in a data-free block, every DataLoader iterator hands out a copy of its
  first batch instead of its next one (the real iterator is left where it was, so its workers
  make nothing more once their queues are full); without a DataLoader, the function named by
  ``REAL_TRUTH_DATA_FN`` in the script's globals, wrapped after its first call, returns a copy
  of its first result per argument kind (ints ignored, tensors by shape: nanoGPT's
  ``get_batch('train')`` and ``get_batch('val')`` keep apart).

Limits: the replayed batch is the same every step, so a step whose cost depends on the batch
(variable lengths) is timed on the first; data made anywhere else (a batch built inline in
the loop, an environment stepped by the policy, a dataset's own cache) is not made free, and
the case has no truth (``profile_real_scripts.py`` marks it not measured); time between steps
that is not data (logging, a sleep) stays in both conditions, as it should.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader

import _real_script_fix as fix
from _real_script_fix import copy_batch as _copy

OUT = os.environ["REAL_TRUTH_OUT"]
WARMUP = int(os.environ.get("REAL_TRUTH_WARMUP", "8"))
BLOCK = int(os.environ.get("REAL_TRUTH_BLOCK", "4"))
PAIRS = int(os.environ.get("REAL_TRUTH_PAIRS", "5"))
DATA_FN = os.environ.get("REAL_TRUTH_DATA_FN") or None
ORDER = os.environ.get("REAL_TRUTH_ORDER") or "01" * PAIRS   # per block: 1 the other condition

_marks = {"optimizer": [], "backward": []}
_state = {"pace": None, "optimizers": 0, "written": False, "replaced": None, "free": False, "ahead": 0,
          "block_start": None, "block": 0}
_steps: list[dict] = []          # counted steps: {"free": bool, "s": seconds, "block": int}
# "free": the step is in a block of the other condition (data free; with REAL_TRUTH_FIX, the fix on)
_first_batches: dict[int, object] = {}


def _write(complete: bool) -> None:
    if _state["written"]:
        return
    _state["written"] = True
    asrun = [s["s"] for s in _steps if not s["free"]]
    free = [s["s"] for s in _steps if s["free"]]
    mean = (lambda xs: sum(xs) / len(xs) if xs else None)
    out = {"steps_from": "optimizer" if _state["optimizers"] else "backward", "complete": complete,
           "asrun_s": mean(asrun), "asrun_steps": asrun, "skipped_per_block": _state["ahead"],
           "threads": torch.get_num_threads()}
    if fix.APPLY:
        out.update(fix_s=mean(free), fix_steps=free, order=ORDER, **fix.report(),
                   asrun_blocks=[s["block"] for s in _steps if not s["free"]],
                   fix_blocks=[s["block"] for s in _steps if s["free"]])
    else:
        out.update(datafree_s=mean(free), datafree_steps=free, data_fn_replaced=_state["replaced"],
                   loaders_replayed=len(_first_batches))
    with open(OUT, "w") as f:
        json.dump(out, f)


def _mark(kind: str) -> None:
    if (kind == "optimizer") != bool(_state["optimizers"]):
        return
    t = time.perf_counter()
    marks = _marks[kind]
    marks.append(t)
    n = len(marks)
    if n < WARMUP:
        _state["free"] = bool(fix.APPLY) and n % 2 == 1  # a fix truth warms both conditions
        return
    if n == WARMUP:                                   # the first block starts
        _state["block_start"] = n
        _state["free"] = ORDER[0] == "1"
        return
    in_block = n - _state["block_start"]              # steps done in this block
    if in_block > _state["ahead"]:
        _steps.append({"free": _state["free"], "s": t - marks[-2], "block": _state["block"]})
    if in_block >= _state["ahead"] + BLOCK:           # the block is done: switch
        _state["block"] += 1
        if _state["block"] >= len(ORDER):
            _write(True)
            sys.stdout.flush()
            os._exit(0)
        _state["free"] = ORDER[_state["block"]] == "1"
        _state["block_start"] = n


def _step_hook(optimizer, args, kwargs) -> None:
    if _state["pace"] is None:
        _state["pace"] = id(optimizer)
    if id(optimizer) == _state["pace"]:
        _mark("optimizer")


_opt_init = torch.optim.Optimizer.__init__


def _counting_init(self, *args, **kwargs):
    _state["optimizers"] += 1
    _opt_init(self, *args, **kwargs)


_backward = torch.autograd.backward


def _marking_backward(*args, **kwargs):
    out = _backward(*args, **kwargs)
    _mark("backward")
    return out


_loader_iter = DataLoader.__iter__


class _Alternating:
    """A DataLoader iterator that hands out copies of the loader's first batch in data-free blocks."""

    def __init__(self, loader, it):
        self.loader, self.it, self.handed = loader, it, 0
        self.fix = fix.for_loader(loader, it) if fix.APPLY else None   # a fix truth: the fix's batches

    def __iter__(self):
        return self

    def __next__(self):
        key = id(self.loader)
        self.handed += 1
        if fix.APPLY:
            if self._over():
                raise StopIteration
            return self.fix.draw(_state["free"]) if self.fix else next(self.it)
        if key not in _first_batches:
            _first_batches[key] = next(self.it)
            return _copy(_first_batches[key])
        # A pass ends after as many batches as the loader has, replayed or real: an evaluation loop over
        # the whole of a validation loader in a data-free block would otherwise never end (Pytorch-UNet),
        # and real batches after replayed ones would run past len(loader), which loops trust (timm's
        # gradient-accumulation arithmetic divides by zero there).
        if self._over():
            raise StopIteration
        if not _state["free"]:
            return next(self.it)
        return _copy(_first_batches[key])

    def _over(self) -> bool:
        try:
            return self.handed > len(self.it)
        except TypeError:  # an iterable dataset of unknown length: the pass goes on, as the loop asks
            return False

    def __len__(self):
        return len(self.it)

    def __getattr__(self, name):
        return getattr(self.it, name)


def _alternating_iter(self):
    it = _Alternating(self, _loader_iter(self))
    ahead = self.num_workers * (self.prefetch_factor or 2) if self.num_workers else 0
    _state["ahead"] = max(_state["ahead"], ahead, fix.ahead(self))
    return it


def _key(args, kwargs):
    def k(a):
        if isinstance(a, torch.Tensor):
            return ("tensor", tuple(a.shape), str(a.dtype))
        return None if isinstance(a, int) and not isinstance(a, bool) else repr(a)
    return tuple(k(a) for a in args), tuple(sorted((n, k(v)) for n, v in kwargs.items()))


def _replayed(fn):
    if fix.APPLY:
        return _fixed(fn)
    first = {}

    def maybe_replay(*args, **kwargs):
        key = _key(args, kwargs)
        if key not in first:
            first[key] = fn(*args, **kwargs)
            return _copy(first[key])
        return _copy(first[key]) if _state["free"] else fn(*args, **kwargs)
    return maybe_replay


def _fixed(fn):
    fixed = fix.rows_rewritten(fn) if fix.APPLY == "batch_fn=rows" else None
    if fixed is None:
        return fn

    def maybe_fixed(*args, **kwargs):
        if _state["free"]:
            fix.applied["uses"] += 1
            return fixed(*args, **kwargs)
        return fn(*args, **kwargs)
    return maybe_fixed


def _wrap_on_first_call(frame, event, arg):
    # The script's function is wrapped in its own globals once it has been defined and called,
    # so the script's calls after that go through the wrapper; the profile hook then goes away.
    if event == "call" and frame.f_code.co_name == DATA_FN and frame.f_globals.get("__name__") == "__main__":
        g = frame.f_globals
        if callable(g.get(DATA_FN)):
            g[DATA_FN] = _replayed(g[DATA_FN])
            _state["replaced"] = f"{os.path.basename(frame.f_code.co_filename)}:{DATA_FN}"
            sys.setprofile(None)


def main() -> None:
    script, *args = sys.argv[1:]
    register_optimizer_step_post_hook(_step_hook)
    torch.optim.Optimizer.__init__ = _counting_init
    torch.autograd.backward = _marking_backward
    if fix.APPLY:
        fix.install(lambda: _state["free"])
    DataLoader.__iter__ = _alternating_iter
    if DATA_FN:
        sys.setprofile(_wrap_on_first_call)
    atexit.register(_write, False)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))   # as `python SCRIPT` has it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
