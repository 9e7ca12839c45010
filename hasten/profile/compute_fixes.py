"""The compute fixes of a run: bf16 autocast, predicted from the replayed step under autocast.

The replayed steps give the ratio (the step alone, and the same under ``torch.autocast`` in
bfloat16, interleaved step by step); it scales the in-loop compute, so that the prediction stays
within what the loop itself measured. channels_last and ``torch.compile`` need the model object,
which a run of an unmodified command cannot reach: named, not predicted.

Changes the training math: no (analysis only); autocast does (bf16 matmuls), and says so.
"""

from __future__ import annotations

from hasten.profile.records import COMPUTE, Analysis, RankSummary, Recommendation

NOT_MEASURED = {"fix": "channels_last / torch.compile",
                "why": "not measured: they need the model object, which a zero-code run cannot reach"}


def compute_fixes(a: Analysis, s: RankSummary) -> list[Recommendation]:
    if s.autocast_s is None or a.step_alone_s <= 0:
        return []
    ratio = max(0.25, s.autocast_s / a.step_alone_s)
    t = a.step_time_s
    compute = t * a.compute_fraction
    return [Recommendation(
        fix="bf16 autocast", how="with hasten.nn.precision.autocast(device, True): loss = ...",
        predicted_speedup=t / max(t - compute + compute * ratio, 1e-9), changes_math=True, apply="autocast",
        kind=COMPUTE, math_note="matmuls and convolutions in bfloat16",
        basis=f"step alone {a.step_alone_s * 1e3:.1f} ms, {s.autocast_s * 1e3:.1f} ms under bf16 autocast")]
