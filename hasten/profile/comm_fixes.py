"""The communication fixes of a data-parallel (DDP) run, predicted from its own measurements.

- bf16 gradient compression (hasten's all-reduce hook, :mod:`hasten.distributed.hooks`): the
  replayed steps with the compressing hook against the plain ones; beside it, in its basis, the
  alpha-beta cost model (Hockney) fitted to float32 and bfloat16 all-reduces timed in the same
  run plus the casts, which cannot see how the hook's all-reduce overlaps backward;
- more micro-batches per all-reduce (gradient accumulation with ``no_sync``): one exposed
  all-reduce per optimizer step, shared by twice the micro-batches.

Changes the training math: no (analysis only); both fixes do, and say so.
"""

from __future__ import annotations

from hasten.distributed.cost_model import fit_link
from hasten.profile.records import COMMUNICATION, Analysis, RankSummary, Recommendation


def comm_fixes(a: Analysis, d0: dict, s0: RankSummary) -> tuple[list[Recommendation], list[dict]]:
    """The fixes, and the ones left out with why."""
    times = d0.get("allreduce_times") or []
    grad_bytes = d0.get("grad_bytes") or 0
    if len(times) < 2 or grad_bytes == 0 or a.comm_s <= 0:
        return [], [{"fix": "bf16 gradient compression", "why": "no all-reduce timings to calibrate the model"}]
    step, comm = a.own_step_s, a.comm_s
    link = fit_link([b for b, _ in times], [s for _, s in times])
    full = link.alpha + grad_bytes * link.beta
    bf16_times = d0.get("allreduce_bf16_times") or []
    cast = d0.get("bf16_cast_s") or 0.0
    link16 = fit_link([b for b, _ in bf16_times], [s for _, s in bf16_times]) if len(bf16_times) >= 2 else link
    half = link16.alpha + grad_bytes / 2 * link16.beta + cast
    modelled = step / (step - comm + comm * half / full)
    basis = (f"exposed comm {comm * 1e3:.0f} ms per optimizer step; cost model fitted to all-reduces of this run "
             f"(float32 {link.gbit_per_s:.1f} Gbit/s, bfloat16 {link16.gbit_per_s:.1f} Gbit/s, casts "
             f"{cast * 1e3:.0f} ms) predicts x{modelled:.2f}")
    predicted = modelled
    if s0.comm_bf16_s is not None and s0.step_alone_s:
        predicted = step / max(1e-9, step - s0.step_alone_s + s0.comm_bf16_s)
        basis += f"; replayed steps with the hook: {s0.step_alone_s * 1e3:.0f} -> {s0.comm_bf16_s * 1e3:.0f} ms"
    recs = [Recommendation(
        fix="bf16 gradient compression",
        how="hasten.distributed.hooks.register_allreduce_hook(ddp_model, 'native', compress='bf16')",
        predicted_speedup=predicted, changes_math=True, apply="comm=bf16", basis=basis, kind=COMMUNICATION,
        math_note="gradients averaged in bfloat16")]
    if a.micro_batches >= 1:
        m = a.micro_batches
        # One all-reduce per optimizer step: twice the micro-batches halve its share per sample.
        recs.append(Recommendation(
            fix=f"accumulate {2 * m:g} micro-batches per optimizer step (no_sync on all but the last)",
            how="with ddp_model.no_sync(): loss.backward()   # for all micro-batches but the last of each step; "
                "scale the loss by 1/micro-batches",
            predicted_speedup=step / ((step - comm) + comm / 2), changes_math=True, apply=None,
            kind=COMMUNICATION, math_note="a larger effective batch",
            basis=f"one all-reduce ({comm * 1e3:.0f} ms exposed) per optimizer step, now over {m:g} "
                  f"micro-batch(es); twice as many halve its cost per sample (a larger effective batch)"))
    rejected = [{"fix": "hierarchical / torus hook", "why": "one node: the two-level hooks pay across nodes only"}]
    return recs, rejected
