"""The "prepare the data once" fix of a loop without a DataLoader, where it fits the script.

Issue 32 (item 5): never advise what the script does already, and say when a fix changes
the math. The fix is left out where the batch function reads data made once already (a
memmap, nanoGPT's ``get_batch()``; a tensor of its module's, ng-video-lecture's
``train_data``): its cost is elsewhere (a loop per row, :func:`hasten.profile.per_row.per_row_fix`).
Where the function draws its values from a random generator each call (pytorch/examples'
regression: ``torch.randn`` features), a set made once is other data: the fix is worded as
a fixed set of batches and marked as changing the math. What the function does is read from
its source when its calls are timed (:func:`hasten.profile.inject.batch_shape.function_shape`).

No verification run can prepare a script's data for it, so that prediction is the most the
measurements allow, with a low end from the data share's interval: a fix ``--verify`` can
apply that reaches that low end ranks above it (:func:`hasten.profile.ranking.rerank`). The
fixed set of batches can be verified: its first batches made once and handed out in turn
(``batch_fn=pool:N``, :func:`hasten.profile.inject.batch_fn.pooled`).

Changes the training math: no (analysis only); the fix says whether it does.
"""

from __future__ import annotations

from hasten.profile.loop_kind import words_for

CPU_MOST = 0.5  # the batch's making is CPU in the loop for at least this share of its time
POOL = 1024  # batches in the fixed set: a dataset of its own, drawn once (32k examples at regression's 32)


def prepare_once(d0: dict, lines: list[dict], data_cpu: float, d: float, rest: float, bound: float,
                 share_lo: float, fn: str) -> dict | None:
    """The fix's fields (for :class:`hasten.profile.records.Recommendation`), or None where it does not fit.

    ``d``: the time making the batch per step, ``data_cpu`` its CPU, ``rest`` the step with the
    data made free, ``bound`` the most any data fix gives, ``share_lo`` the low end of the data
    share's interval, ``fn`` the batch function as the report names it."""
    shape = d0.get("batch_fn") or {}
    if data_cpu <= CPU_MOST * d or any(x.get("prepared") for x in lines) or shape.get("in_memory"):
        return None
    low = min(bound, 1 / max(1e-9, 1 - share_lo))
    basis = (f"{data_cpu * 1e3:.1f} ms of the {d * 1e3:.1f} ms spent making the batch is CPU in the loop; at best "
             f"the step with data made free, {rest * 1e3:.1f} ms (x{low:.2f} at the low end of the data share's "
             "interval)")
    if shape.get("draws_values"):
        return {"fix": f"make a fixed set of {POOL} batches once (its data is drawn fresh each call)",
                "how": f"batches = [{fn} for _ in range({POOL})]   # once, before training; then "
                       f"x, y = batches[step % {POOL}]",
                "predicted_speedup": bound, "changes_math": True, "bound": bound, "low": low,
                "apply": f"batch_fn=pool:{POOL}",  # hasten.profile.inject.batch_fn.pooled
                "basis": basis + f"; {shape.get('name', 'the batch function')}() draws random values each call: a "
                                 "fixed set trains on other data"}
    w = words_for(d0.get("batch_layout"))
    return {"fix": f"prepare the data once ({w.prepare})",
            "how": f"{w.once}   # once, before training; then {fn} only indexes it",
            "predicted_speedup": bound, "changes_math": False, "bound": bound, "low": low, "basis": basis}
