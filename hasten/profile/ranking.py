"""Which predicted fixes the report shows, in what order, and where verification moves them.

Every prediction passes through :func:`admit`, the one place that holds it to the most the
measurements allow (:func:`hasten.profile.bounds.gain_bound`: Amdahl's law over the run's
measured shares), whatever module predicted it. Then:

- a fix of the kind the verdict names (input fixes for an input-bound run, ...; every kind for a
  ``balanced`` one) is shown when predicted at :data:`~hasten.profile.thresholds.WORTH_IT` or more;
- the best fix of each other kind is shown too when its prediction beats the best of those: the
  verdict names where the time goes, not which fix pays most (issue 43: "the biggest fix hidden");
- the others are listed as not recommended (below ``WORTH_IT``) or left out (another kind's, smaller).

:func:`rerank` orders them by what is known once ``--verify`` has run.

Changes the training math: no (analysis only).
"""

from __future__ import annotations

from hasten.profile.bounds import gain_bound
from hasten.profile.records import COMMUNICATION, COMPUTE, INPUT, Analysis, Recommendation
from hasten.profile.thresholds import WORTH_IT

# The kind of fix each verdict is about
VERDICT_KINDS = {"input-bound": (INPUT,), "communication-bound": (COMMUNICATION,), "compute-bound": (COMPUTE,),
                 "host-bound": (COMPUTE,), "balanced": (INPUT, COMPUTE, COMMUNICATION)}


def admit(a: Analysis, recs: list[Recommendation]) -> None:
    """Hold every prediction to its bound, then put the fixes worth showing in ``a.recommendations`` and
    those predicted below ``WORTH_IT`` in ``a.rejected`` (see the module), ranked by :func:`rerank`."""
    for rec in [r for r in recs if r.unpredicted]:  # a fix whose gain was not measurable: listed, never ranked
        a.rejected.append({**as_rejected(rec, rec.unpredicted), "predicted_speedup": None})
    recs = [r for r in recs if not r.unpredicted]
    for rec in recs:
        bound = gain_bound(a, rec.kind)
        rec.bound = bound if rec.bound is None else min(rec.bound, bound)
        rec.predicted_speedup = min(rec.predicted_speedup, rec.bound)
        if rec.low is not None:
            rec.low = min(rec.low, rec.bound)
    kinds = VERDICT_KINDS[a.verdict]
    named = [r for r in recs if r.kind in kinds]
    best = max((r.predicted_speedup for r in named), default=1.0)
    for kind in (INPUT, COMPUTE, COMMUNICATION):
        if kind in kinds:
            continue
        others = [r for r in recs if r.kind == kind]
        top = max(others, key=lambda r: r.predicted_speedup, default=None)
        if top is not None and top.predicted_speedup > best:
            named.append(top)
    for rec in named:
        if rec.predicted_speedup >= WORTH_IT:
            a.recommendations.append(rec)
        else:
            a.rejected.append(as_rejected(rec, f"predicted x{rec.predicted_speedup:.2f}: "
                                               f"{rec.below_because or 'not worth it'}"))
    rerank(a)


def as_rejected(rec: Recommendation, why: str) -> dict:
    return {"fix": rec.fix, "why": why, "basis": rec.basis, "how": rec.how, "predicted_speedup": rec.predicted_speedup,
            "apply": rec.apply, "step_rate_factor": rec.step_rate_factor, "changes_math": rec.changes_math,
            "verified_speedup": rec.verified_speedup, "verified_step_s": rec.verified_step_s, "bound": rec.bound,
            "kind": rec.kind, "math_note": rec.math_note, "verification": rec.verification}


def _promoted(r: dict) -> Recommendation:
    return Recommendation(fix=r["fix"], how=r.get("how", ""), predicted_speedup=r["predicted_speedup"],
                          basis=r.get("basis", ""), changes_math=r.get("changes_math", False), apply=r.get("apply"),
                          step_rate_factor=r.get("step_rate_factor", 1.0), verified_speedup=r["verified_speedup"],
                          verified_step_s=r.get("verified_step_s"), bound=r.get("bound"), promoted=True,
                          kind=r.get("kind", INPUT), math_note=r.get("math_note"), verification=r.get("verification"))


def _decides(verified: float | None, verification: dict | None) -> bool:
    """Whether a verified speed-up may move its fix: measured, and (with an interval) clear of 1."""
    return verified is not None and (verification is None or verification.get("decides", False))


def rerank(a: Analysis) -> None:
    """Order the fixes by what is known: verified speedups first, best first, then unverified by prediction.

    A fix verified below ``WORTH_IT`` (x1.05) is moved to the rejected list, whatever its
    prediction; a rejected fix that verified at ``WORTH_IT`` or better is promoted. A
    verification whose interval holds 1 (or that was a measurement anomaly: hasten.profile.verify)
    moves nothing: its fix stays where its prediction puts it."""
    keep = []
    for rec in a.recommendations:
        if _decides(rec.verified_speedup, rec.verification) and rec.verified_speedup < WORTH_IT:
            a.rejected.append(as_rejected(rec, f"verified x{rec.verified_speedup:.2f} (predicted "
                                               f"x{rec.predicted_speedup:.2f}): "
                                               f"{'slower' if rec.verified_speedup < 1 else 'not worth it'}"))
        else:
            keep.append(rec)
    still = []
    for r in a.rejected:
        v = r.get("verified_speedup")
        if (_decides(v, r.get("verification")) and v >= WORTH_IT and r.get("predicted_speedup") is not None
                and "verified x" not in r["why"]):
            keep.append(_promoted(r))
        else:
            still.append(r)
    a.rejected = still
    # Verified first (by what was measured), then unverified (by prediction); on a near tie of
    # predictions, a fix --verify can apply without code edits first.
    keep.sort(key=lambda x: (not _decides(x.verified_speedup, x.verification),
                             -round(x.verified_speedup if _decides(x.verified_speedup, x.verification) else 0.0, 2),
                             -round(x.predicted_speedup, 1), x.apply is None))
    # A code change nothing verifies ranks below a fix --verify can apply whose prediction reaches the low end
    # of its own (the data share's interval): within what is known, the one that can be measured goes first.
    for i, rec in enumerate(keep):
        if rec.verified_speedup is None and rec.apply is None and rec.low is not None:
            j = next((j for j in range(i + 1, len(keep)) if keep[j].apply and keep[j].verified_speedup is None
                      and keep[j].predicted_speedup >= rec.low), None)
            if j is not None:
                keep.insert(i, keep.pop(j))
                keep[i].basis += (f"; ranked above '{rec.fix}' (x{rec.predicted_speedup:.2f}, x{rec.low:.2f} at the "
                                  "low end): within its uncertainty, and --verify can measure this one")
    a.recommendations = keep
