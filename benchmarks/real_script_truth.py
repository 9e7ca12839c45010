"""The truth for ``profile_real_scripts.py``: a script's optimizer steps timed as run, or with its data made free.

    python benchmarks/real_script_truth.py SCRIPT [ARGS...]

with ``REAL_TRUTH_MODE`` (``asrun`` or ``datafree``), ``REAL_TRUTH_OUT`` (the JSON written),
``REAL_TRUTH_WARMUP`` and ``REAL_TRUTH_STEPS``, and for a loop without a DataLoader
``REAL_TRUTH_DATA_FN`` (the name of the script's function that makes a batch). It runs the
script unchanged, as ``python SCRIPT ARGS`` would (``runpy``, ``__main__``, its folder first
on ``sys.path``), with nothing of hasten imported.

- **A step** ends when the first optimizer that steps (a global step post-hook: GANs' first
  optimizer sets the pace) finishes ``step()``; a script that builds no ``torch.optim``
  optimizer (weights updated by hand) has its steps end at each ``torch.autograd.backward``.
  After ``warmup + steps`` steps the mean of the last ``steps`` is written and the process
  exits (``os._exit(0)``), so an endless script is fine; one that ends first writes what it had.
- **Data made free**, ``datafree``: each ``DataLoader``'s iterator hands out copies of its
  first batch, as many as the loader has (endless for an ``IterableDataset``), so neither the
  workers nor the main process make any batch after the first. Without a DataLoader, the
  function named by ``REAL_TRUTH_DATA_FN`` in the script's globals is replaced after its first
  call by one returning a copy of its first result per argument kind (ints ignored, tensors by
  shape; nanoGPT's ``get_batch('train')`` and ``get_batch('val')`` keep apart).

Limits: the replayed batch is the same every step, so a step whose cost depends on the batch
(variable lengths, padding) is timed on the first; data made anywhere else (a batch built
inline in the loop, a generator, a dataset's own cache) is not made free, and the case then
has no truth (``profile_real_scripts.py`` marks it not measured); a loop that sleeps or logs
between steps keeps that time in both modes, as it should (it is not data).
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

MODE = os.environ.get("REAL_TRUTH_MODE", "asrun")
OUT = os.environ["REAL_TRUTH_OUT"]
WARMUP = int(os.environ.get("REAL_TRUTH_WARMUP", "8"))
STEPS = int(os.environ.get("REAL_TRUTH_STEPS", "12"))
DATA_FN = os.environ.get("REAL_TRUTH_DATA_FN") or None

_marks = {"optimizer": [], "backward": []}
_state = {"pace": None, "optimizers": 0, "written": False, "replaced": None}


def _write(complete: bool) -> None:
    if _state["written"]:
        return
    _state["written"] = True
    kind = "optimizer" if _state["optimizers"] else "backward"
    t = _marks[kind]
    measured = t[WARMUP:WARMUP + STEPS + 1]
    step_s = (measured[-1] - measured[0]) / (len(measured) - 1) if len(measured) > 1 else None
    with open(OUT, "w") as f:
        json.dump({"mode": MODE, "steps_from": kind, "steps_seen": len(t), "complete": complete,
                   "step_s": step_s, "per_step_s": [b - a for a, b in zip(measured, measured[1:])],
                   "data_fn_replaced": _state["replaced"], "loaders_replayed": len(_first_batches),
                   "threads": torch.get_num_threads()}, f)


def _mark(kind: str) -> None:
    _marks[kind].append(time.perf_counter())
    if len(_marks[kind]) >= WARMUP + STEPS + 1 and (kind == "optimizer") == bool(_state["optimizers"]):
        _write(True)
        sys.stdout.flush()
        os._exit(0)


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
    if not _state["optimizers"]:
        _mark("backward")
    return out


def _copy(batch):
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(_copy(b) for b in batch)
    if isinstance(batch, dict):
        return type(batch)((k, _copy(v)) for k, v in batch.items())
    return batch


_loader_iter = DataLoader.__iter__
_first_batches: dict[int, object] = {}


class _Replay:
    def __init__(self, batch, n):
        self.batch, self.left = batch, n

    def __iter__(self):
        return self

    def __next__(self):
        if self.left is not None:
            if self.left <= 0:
                raise StopIteration
            self.left -= 1
        return _copy(self.batch)

    def __len__(self):
        return self.left


def _replaying_iter(self):
    if id(self) not in _first_batches:
        it = _loader_iter(self)
        _first_batches[id(self)] = next(it)
        del it                                  # its workers stop: they make nothing more
    try:
        n = len(self)
    except TypeError:
        n = None
    return _Replay(_first_batches[id(self)], n)


def _key(args, kwargs):
    def k(a):
        if isinstance(a, torch.Tensor):
            return ("tensor", tuple(a.shape), str(a.dtype))
        return None if isinstance(a, int) and not isinstance(a, bool) else repr(a)
    return tuple(k(a) for a in args), tuple(sorted((n, k(v)) for n, v in kwargs.items()))


def _replayed(fn):
    first = {}

    def replay(*args, **kwargs):
        key = _key(args, kwargs)
        if key not in first:
            first[key] = fn(*args, **kwargs)
        return _copy(first[key])
    return replay


def _swap_on_first_call(frame, event, arg):
    # The script's function is replaced in its own globals once it has been defined and called,
    # so the script's calls after that go to the replay; the profile hook then goes away.
    if event == "call" and frame.f_code.co_name == DATA_FN and frame.f_globals.get("__name__") == "__main__":
        g = frame.f_globals
        if callable(g.get(DATA_FN)):
            g[DATA_FN] = _replayed(g[DATA_FN])
            _state["replaced"] = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{DATA_FN}"
            sys.setprofile(None)


def main() -> None:
    script, *args = sys.argv[1:]
    register_optimizer_step_post_hook(_step_hook)
    torch.optim.Optimizer.__init__ = _counting_init
    torch.autograd.backward = _marking_backward
    if MODE == "datafree":
        DataLoader.__iter__ = _replaying_iter
        if DATA_FN:
            sys.setprofile(_swap_on_first_call)
    atexit.register(_write, False)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))   # as `python SCRIPT` has it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
