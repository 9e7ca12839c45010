"""The "prepare the data once" fix of a loop without a DataLoader, where it fits the script.

Issue 32 (item 5): never advise what the script does already, and say when a fix changes
the math. The fix is left out where the batch function reads data made once already (a
memmap, nanoGPT's ``get_batch()``; a tensor of its module's, ng-video-lecture's
``train_data``): its cost is elsewhere (a loop per row, :func:`hasten.profile.per_row.per_row_fix`).
What the function does is read from its source when its calls are timed
(:func:`hasten.profile.inject.batch_shape.function_shape`).

No verification run can prepare a script's data for it, so that prediction is the most the
measurements allow, with a low end from the data share's interval: a fix ``--verify`` can
apply that reaches that low end ranks above it (:func:`hasten.profile.ranking.rerank`).

Where the function draws its values from a random generator each call (pytorch/examples'
regression: ``torch.randn`` features), a set made once is other data: the fix is a fixed
set of batches handed out in turn (:func:`fixed_set`), worded with how many distinct batches
it keeps and marked as changing the math. It can be verified (``batch_fn=pool:N``,
:func:`hasten.profile.inject.batch_fn.pooled`), and it is predicted as what it does, not as
data made free (issue 43: predicted x1.26, the data-free bound, verified x0.91):

- the set is small enough to be reused: where the command ended on its own after S steps, at
  most a quarter of its calls (a set of 1024 in a run of 529 steps is never used twice);
- each step hands out a kept batch instead of making one: a fresh copy of its tensors and the
  wrapper's call, measured in the profiled process (:func:`hasten.profile.inject.probes.handout`);
  where that costs as much as making the batch, the fix is not recommended, and where it was not
  measured, not predicted (as the DataLoader-workers fix and its hand-off);
- making the set is paid once: shared over the S steps where S is known (the step-rate factor
  that --verify's steady-state steps are multiplied by: its runs make the set in a warm-up step),
  else left out of a prediction said to be the steady state.

Changes the training math: no (analysis only); the fix says whether it does.
"""

from __future__ import annotations

from hasten.profile.input_model import InputModel
from hasten.profile.loop_kind import words_for
from hasten.profile.resident_fix import MEMORY_SHARE

CPU_MOST = 0.5  # the batch's making is CPU in the loop for at least this share of its time
POOL = 1024  # batches in the fixed set at most: a dataset of its own, drawn once (32k examples at regression's 32)
REUSE = 4  # in a run of known length, each kept batch used at least this many times ...
MIN_POOL = 8  # ... in a set of at least this many batches (fewer would be training on a handful)


def _ms(s: float) -> str:
    """A time as the basis prints it: hundredths of a millisecond for a fast step's parts, seconds for a set."""
    if s >= 1:
        return f"{s:.1f} s"
    return f"{s * 1e3:.{3 if s < 1e-3 else 2 if s < 0.01 else 1}f} ms"


def prepare_once(d0: dict, lines: list[dict], m: InputModel, bound: float, share_lo: float, fn: str,
                 handout_s: float | None = None, memory_bytes: float = 8 * 2**30) -> dict | None:
    """The fix's fields (for :class:`hasten.profile.records.Recommendation`), or None where it does not fit.

    ``m``: the run's input model (``m.data`` the time making the batch per step, ``m.data_cpu`` its CPU,
    ``m.free`` the step with the data made free), ``bound`` the most any data fix gives, ``share_lo`` the
    low end of the data share's interval, ``fn`` the batch function as the report names it, ``handout_s``
    a kept batch's hand-out per call (measured; None: not)."""
    shape = d0.get("batch_fn") or {}
    d = m.data
    if m.data_cpu <= CPU_MOST * d or any(x.get("prepared") for x in lines) or shape.get("in_memory"):
        return None
    low = min(bound, 1 / max(1e-9, 1 - share_lo))
    basis = (f"{_ms(m.data_cpu)} of the {_ms(d)} spent making the batch is CPU in the loop; at best "
             f"the step with data made free, {_ms(m.free)} (x{low:.2f} at the low end of the data share's "
             "interval)")
    if shape.get("draws_values"):
        return fixed_set(d0, m, bound, share_lo, fn, handout_s, memory_bytes, basis)
    w = words_for(d0.get("batch_layout"))
    return {"fix": f"prepare the data once ({w.prepare})",
            "how": f"{w.once}   # once, before training; then {fn} only indexes it",
            "predicted_speedup": bound, "changes_math": False, "bound": bound, "low": low, "basis": basis}


def pool_size(calls: int | None, batch_bytes: int | None, memory_bytes: float) -> int:
    """Batches in the fixed set: :data:`POOL`, at most a :data:`REUSE`-th of a run's ``calls`` where known (at
    least :data:`MIN_POOL`), and within the memory share a resident dataset may take."""
    n = POOL if not calls else max(MIN_POOL, min(POOL, calls // REUSE))
    if batch_bytes:
        n = min(n, max(1, int(MEMORY_SHARE * memory_bytes // batch_bytes)))
    return n


def fixed_set(d0: dict, m: InputModel, bound: float, share_lo: float, fn: str, handout_s: float | None,
              memory_bytes: float, basis: str) -> dict:
    """A fixed set of batches made once and handed out in turn, for a batch function that draws its data
    (see the module): its size, its prediction over the run (or its steady state), and why it may not pay."""
    k = m.batches_per_step
    d = m.data
    steps = d0.get("steps_seen") if d0.get("ended_early") else None  # the command's whole run, where it ended
    calls = round(steps * k) if steps else None
    n = pool_size(calls, (d0.get("loader_probe") or {}).get("batch_fn_bytes"), memory_bytes)
    name = (d0.get("batch_fn") or {}).get("name", "the batch function")
    used = f", each used about {calls / n:.0f} times in the run's {steps} steps" if calls else ""
    words = {"fix": f"make a fixed set of {n} distinct batches once{used} (its data is drawn fresh each call)",
             "how": f"batches = [{fn} for _ in range({n})]   # once, before training; then "
                    f"x, y = batches[step % {n}]",
             "changes_math": True, "apply": f"batch_fn=pool:{n}",  # hasten.profile.inject.batch_fn.pooled
             "math_note": f"trains on {n} distinct batches, handed out in turn, where each call drew new data"}
    basis += f"; {name}() draws random values each call: a fixed set trains on other data"
    if handout_s is None:
        return {**words, "predicted_speedup": 1.0, "basis": basis,
                "unpredicted": (f"not predicted: what handing out a kept batch costs (a fresh copy of its tensors, "
                                f"each step) was not measured (the loader probe did not run), and on a step of "
                                f"{_ms(m.step)} whose batch takes {_ms(d)} to make, it may cost as much as it saves")}
    h = handout_s * k
    steady = m.free + h  # each step hands out a kept batch where it made one
    fill = n * (d / k) / steps if steps else 0.0  # making the set, shared over the run's steps
    d_lo = share_lo * m.step
    low = m.step / max(1e-12, m.step - d_lo + h + (n * (d_lo / k) / steps if steps else 0.0))
    basis += (f"; handing out a kept batch takes {_ms(h)} a step (measured: a fresh copy of its tensors, as --verify "
              f"hands it out) where making it took {_ms(d)}: step {_ms(steady)}")
    if steps:
        basis += (f", plus making the set ({n} batches, {_ms(n * d / k)}) shared over the run's {steps} steps (the "
                  f"command ended on its own), {_ms(fill)} a step, against {_ms(m.step)} as run")
    else:
        basis += (f" against {_ms(m.step)} as run: the steady state once the set is made (the command ran past "
                  f"hasten's window, its length unknown; making the {n} batches, {_ms(n * d / k)}, is paid once, "
                  f"and a run of few more than {n} steps gains less)")
    below = None
    if h >= d:
        below = f"handing out a kept batch takes {_ms(h)} a step (measured), at least the {_ms(d)} of making it"
    elif fill >= (d - h) / 2:
        below = f"making the set's {n} batches is paid within the run's {steps} steps"
    return {**words, "predicted_speedup": m.step / max(1e-12, steady + fill), "bound": bound, "low": min(low, bound),
            "step_rate_factor": steady / (steady + fill), "basis": basis, "below_because": below}
