"""The fix truth of ``profile_real_scripts.py``: what the #1 fix hasten verified really gives, measured by the benchmark.

Issue 43 asks for "the #1 fix verified ... within 15% of the truth". The truth of a fix is its own
effect, not the data-free ceiling (as run / data free: the most any data fix can give, which
overstates every partial fix and says nothing of a compute fix). So for each run whose #1 fix
``hasten profile --verify`` verified, the benchmark applies that fix itself
(``_real_script_fix.py``, from the recommendation's ``apply``) and times it against the script as
run, in :data:`PAIRS` pairs of blocks in one process (``_real_script_truth.py``; a block at least
:data:`BLOCK_S` long, :func:`block_steps`), each pair's two blocks in a shuffled order (:func:`hasten.timing.interleaved`, seeded and recorded). A pair's
sample is its as-run block's median step over its fix block's; the truth is their geometric mean
with Student's t interval on the logs (:func:`hasten.stats.mean_ci`), n = the pairs. No floor is
added to the interval: it is the measurement's own.

A run is within 15% when |verified / fix truth - 1| <= 0.15 (:func:`distance`).

Changes the training math: no (measurement only).
"""

from __future__ import annotations

import math
import re
import statistics

from hasten.stats import mean_ci
from hasten.timing import interleaved

PAIRS = 6        # pairs of blocks at least (a case's own truth_pairs when more)
BLOCK_S = 0.5    # a block's counted steps span about this much as run at least: a block of four 1 ms steps
#                  is timer and scheduler noise (ng-video-lecture's bigram), not a sample of the step
MAX_BLOCK = 100  # steps per block at most (a script's own run may end first: it has max_iters)
WITHIN = 0.15    # issue 43: the verified speed-up within 15% of the truth

# hasten's fix names (hasten/profile/input_fixes.py, resident_fix.py, per_row.py, compute_fixes.py) to
# their apply strings, for runs recorded before the benchmark kept each #1 fix's ``apply``
_BY_NAME = ((re.compile(r"bf16 autocast$"), lambda m: "autocast"),
            (re.compile(r"device-resident loader$"), lambda m: "resident"),
            (re.compile(r"make the batch's rows at once"), lambda m: "batch_fn=rows"),
            (re.compile(r"make the batches in the loop \(num_workers=0\)$"), lambda m: "workers=0"),
            (re.compile(r"one iterator, (\d+) DataLoader workers$"), lambda m: f"workers={m[1]},keep_iter"),
            (re.compile(r"(\d+) DataLoader workers$"), lambda m: f"workers={m[1]}"))


def apply_of(fix: dict) -> str | None:
    """The ``apply`` of a run's #1 fix: as the profile gave it, else from its name; None when neither
    says (a fix that needs a code change, or a name not known here)."""
    if fix.get("apply"):
        return fix["apply"]
    name = str(fix.get("fix") or "")
    for pattern, apply in _BY_NAME:
        m = pattern.match(name)
        if m:
            return apply(m)
    return None


def block_steps(case_block: int, asrun_s: float | None) -> int:
    """Counted steps per block: the case's own, or more where its as-run step is short (:data:`BLOCK_S`)."""
    if not asrun_s or asrun_s <= 0:
        return case_block
    return max(case_block, min(MAX_BLOCK, math.ceil(BLOCK_S / asrun_s)))


def order(pairs: int, seed: int) -> str:
    """The blocks' order, one character per block (``0`` as run, ``1`` the fix): each pair's two shuffled."""
    return "".join("1" if on else "0" for _, on in interleaved((False, True), pairs, seed=seed))


def ratio(t: dict) -> dict:
    """as run / fix from a fix-truth run's steps (their blocks): per pair of blocks, the as-run block's
    median step over the fix block's; their geometric mean, its 95% interval (t on the logs) and n.
    Fewer than two pairs give no interval."""
    logs = []
    for p in range(len(t.get("order") or "") // 2):
        a = [s for s, b in zip(t["asrun_steps"], t["asrun_blocks"]) if b // 2 == p]
        f = [s for s, b in zip(t["fix_steps"], t["fix_blocks"]) if b // 2 == p]
        if a and f and min(a) > 0 and min(f) > 0:
            logs.append(math.log(statistics.median(a) / statistics.median(f)))
    ci = mean_ci(logs)
    if ci["n"] < 2:
        return {"ratio": math.exp(ci["mean"]) if logs else None, "interval": None, "n": ci["n"]}
    return {"ratio": math.exp(ci["mean"]), "interval": [math.exp(ci["mean"] - ci["ci95"]),
                                                        math.exp(ci["mean"] + ci["ci95"])], "n": ci["n"]}


def distance(verified: float, fix_truth: dict | None) -> float | None:
    """|verified / fix truth - 1|; None where the run has no fix truth."""
    if not fix_truth or not fix_truth.get("ratio"):
        return None
    return abs(verified / fix_truth["ratio"] - 1)
