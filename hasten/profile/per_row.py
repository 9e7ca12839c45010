"""The "make the batch's rows at once" fix of a loop without a DataLoader, where its batch is made
row by row in a Python comprehension (sampled on the lines that make it,
:func:`hasten.profile.inject.batch_shape.line_shape`).

One operation over every row at once: the statements rewritten where they stack windows of one
array (nanoGPT's ``get_batch()``, ``torch.stack([data[i:i + w] for i in ix])`` as one index of
all rows), else named. Predicted from the samples: the share of the batch's time on those lines,
at best all of it saved (one index of every row costs a small part of a loop over them).

Changes the training math: no (the same rows, in one operation).
"""

from __future__ import annotations

from hasten.profile.records import Recommendation

PER_ROW_MOST = 0.5  # the per-row lines hold at least this share of the batch's samples to be its cost


def per_row_fix(lines: list[dict], data: float, step: float) -> Recommendation | None:
    """The fix, or None where the per-row lines are not most of the batch's samples. ``lines``: the
    sampled lines that make the batch; ``data``: the time making it per step; ``step``: the step."""
    total = sum(x["samples"] for x in lines)
    rows = [x for x in lines if x.get("per_row")]
    share = sum(x["samples"] for x in rows) / total if total else 0.0
    if not rows or share < PER_ROW_MOST:
        return None
    saved = data * share
    rewritten = [x["rows_at_once"] for x in rows if x.get("rows_at_once")]
    where = ", ".join(f"{x['at']} ({x.get('function', '?')})" for x in rows[:2])
    if rewritten:
        how = "\n     ".join(rewritten) + "   # every row in one index, as the comprehension made them"
    else:
        how = (f"# {rows[0]['at']} makes the batch one row at a time in Python: `{rows[0].get('code', '')}`;"
               "\n     # make every row in one tensor operation (an index of all rows, a batched transform)")
    return Recommendation(
        fix=f"make the batch's rows at once, not in a Python loop per row ({where})", how=how,
        predicted_speedup=step / max(step - saved, 1e-12), changes_math=False,
        apply="batch_fn=rows" if rewritten else None,
        basis=f"{share:.0%} of the samples making the batch are on lines that loop over its rows in Python "
              f"({saved * 1e3:.1f} of its {data * 1e3:.1f} ms a step); at best all of that saved")
