"""From per-rank measurements to a verdict, its shares, and ranked, predicted fixes.

A step is an optimizer step; its time T splits into data D (the wait, or without a
DataLoader the time making the batch), exposed communication, compute and the rest
(neither: named by line). The verdict weighs the data share (D, plus what the loader's
workers' CPU on the step's cores costs it: :func:`hasten.profile.attribution.cpu_use`) and
the exposed-communication share against the thresholds of :mod:`hasten.profile.thresholds`,
each by its interval (:func:`classify`). Every rank reports; the slowest rank sets the step.

The fixes come from :mod:`hasten.profile.input_fixes`, :mod:`hasten.profile.comm_fixes` and
:mod:`hasten.profile.compute_fixes`, each from this run's own numbers; every one of them is
then held to the most the measured shares allow and ranked by :mod:`hasten.profile.ranking`.

Changes the training math: no (analysis only); each recommendation says whether its fix does.
"""

from __future__ import annotations

from hasten.cores import cores_for_run, cpu_available
from hasten.profile import attribution
from hasten.profile.bounds import data_gain
from hasten.profile.comm_fixes import comm_fixes
from hasten.profile.compute_fixes import NOT_MEASURED, compute_fixes
from hasten.profile.input_fixes import input_fixes
from hasten.profile.rank_summary import clean_steps, summarise_rank
from hasten.profile.ranking import admit, rerank
from hasten.profile.records import INPUT, Analysis, Recommendation
from hasten.profile.shares import sum_interval, undecided, widened
from hasten.profile.thresholds import (COMM_HIGH, COMM_MODERATE, DEAD_BAND, HOST_BUSY, INPUT_HIGH,
                                       INPUT_MODERATE)
from hasten.stats import mean

# Analysis, Recommendation and rerank are named here too for the launcher and the library mode, which
# take the whole analysis from this module.
__all__ = ["Analysis", "Recommendation", "analyse", "classify", "rerank"]


def classify(wait: float, comm: float, host_fraction: float | None = None,
             wait_interval: tuple[float, float] | None = None,
             comm_interval: tuple[float, float] | None = None) -> tuple[str, str | None]:
    """The verdict and its severity from the data and exposed-communication shares and their intervals.

    A share counts above a threshold only when its interval, widened to the dead band either
    side, is clear of it: input-bound when the data share's lower end is at least
    ``INPUT_MODERATE`` (10%), compute-bound when both shares' upper ends are below their
    moderate thresholds, balanced in between. Severity: high when the lower end is at least
    20%, moderate when the upper end is below it, and "moderate to high" when the interval
    holds 20%."""
    w_lo, w_hi = widened(wait, *(wait_interval or (wait, wait)), DEAD_BAND)
    c_lo, c_hi = widened(comm, *(comm_interval or (comm, comm)), DEAD_BAND)
    if w_lo >= INPUT_MODERATE or c_lo >= COMM_MODERATE:
        input_wins = wait >= comm if (w_lo >= INPUT_MODERATE) == (c_lo >= COMM_MODERATE) else w_lo >= INPUT_MODERATE
        kind = "input-bound" if input_wins else "communication-bound"
        lo, hi, high = (w_lo, w_hi, INPUT_HIGH) if input_wins else (c_lo, c_hi, COMM_HIGH)
        return kind, "high" if lo >= high else "moderate" if hi < high else "moderate to high"
    if w_hi < INPUT_MODERATE and c_hi < COMM_MODERATE:
        if host_fraction is not None and host_fraction >= HOST_BUSY:
            return "host-bound", None
        return "compute-bound", None
    return "balanced", None


def _exposed_comm(d0: dict, sums: list) -> float:
    comm = 0.0
    if d0.get("ddp"):
        # Wall time, as the step itself is measured: waiting for a slower peer is exposed communication too.
        c = mean(max(0.0, s.step_alone_wall_s - s.comm_off_wall_s) for s in sums
                 if s.comm_off_wall_s is not None and s.step_alone_wall_s is not None)
        comm = 0.0 if c is None else c
    return max(comm, mean(s.comm_direct_s for s in sums))  # collectives the script calls itself


def analyse(ranks: list[dict], memory_bytes: float = 8 * 2**30, cpus: dict | None = None) -> Analysis:
    """Merge every rank's report into one verdict with ranked recommendations."""
    ranks = sorted(ranks, key=lambda d: d["rank"])
    sums = [summarise_rank(d) for d in ranks]
    d0, s0 = ranks[0], sums[0]
    step = max(s.step_s for s in sums)  # the slowest rank sets everyone's pace
    wait = mean(s.data_s / s.step_s for s in sums)
    w_lo, w_hi = mean(s.data_lo for s in sums), mean(s.data_hi for s in sums)
    other = mean(s.other_s / s.step_s for s in sums)
    loader_driven = d0.get("loader_driven", True)
    other *= 1 - attribution.compute_in_rest(d0, loader_driven)  # the model, a loss, backward, a step: compute
    alone = mean(s.step_alone_s for s in sums if s.step_alone_s is not None)
    if alone is None:
        alone = mean(s.work_s for s in sums)
    if not loader_driven:  # the replayed step leaves out all the loop's time outside compute; the rest stays
        alone += mean(s.other_s for s in sums)
    comm = _exposed_comm(d0, sums)
    comm_frac = min(comm / step, max(0.0, 1.0 - wait - other))
    micro = s0.micro
    loader = mean(s.loader_batch_s for s in sums if s.loader_batch_s is not None)
    if loader is not None and loader_driven:
        produce = loader * micro  # a step's batches, made alone
    elif not loader_driven:
        produce = mean(s.data_s for s in sums)  # made in the loop: its time there is the production time
    else:
        produce = None
    cores = cores_for_run(cpus or cpu_available(probe_s=0), d0.get("cpu_window"))
    threads = (d0.get("threads") or {}).get("intra_op") or 1
    cpu_use = attribution.cpu_use(s0, alone, cores["available"], micro, loader_driven, threads=threads,
                                  window=d0.get("cpu_window"))
    share, lo, hi, kind = wait, w_lo, w_hi, "wait"
    if cpu_use.get("contended"):  # the workers' CPU on the step's cores adds to the step, beside its wait
        share, lo, hi = sum_interval((wait, w_lo, w_hi),
                                     (cpu_use["data_cpu_share"], *cpu_use["data_cpu_share_interval"]))
        kind = "cpu" if cpu_use["data_cpu_share"] > wait else "wait"
    verdict, severity = classify(share, comm_frac, s0.host_fraction, (lo, hi))
    excluded = {}
    for s in sums:
        for k, v in s.excluded.items():
            excluded[k] = max(excluded.get(k, 0), v)
    clean, _ = clean_steps(d0["records"]["measure"])
    a = Analysis(verdict=verdict, severity=severity, step_time_s=step,
                 own_step_s=max(s.own_step_s for s in sums), data_wait_fraction=wait,
                 compute_fraction=max(0.0, 1.0 - wait - comm_frac - other), comm_fraction=comm_frac,
                 upstream_ratio=produce / alone if produce is not None and alone > 0 else None,
                 loader_batch_s=loader, step_alone_s=alone, comm_s=comm, ranks=len(ranks), device=d0["device"],
                 num_workers=d0["num_workers"], steps=len(clean) or len(d0["records"]["measure"]),
                 warmup=d0["warmup"], per_step=clean or d0["records"]["measure"], loader_driven=loader_driven,
                 micro_batches=micro, excluded=[{"reason": k, "steps": v} for k, v in excluded.items()],
                 loaders=d0.get("loaders", []), where=d0.get("where", []),
                 where_data=attribution.batch_where(d0) or d0.get("where_data", []), dropped=_dropped(ranks),
                 steps_from="backward" if d0.get("pace") == "backward" else "optimizer",
                 data_share=share, data_interval=(lo, hi), input_kind=kind, other_fraction=other,
                 near=undecided(share, lo, hi, (INPUT_MODERATE, INPUT_HIGH), DEAD_BAND),
                 other_where=attribution.other_where(d0, other, loader_driven), threads=d0.get("threads") or {},
                 extended=max(d.get("extended", 0) for d in ranks))
    a.cpu = cores
    a.cpu.update(main_cpu_per_step_s=s0.cpu_s, worker_cpu_per_batch_s=s0.worker_cpu_per_batch_s, **cpu_use)
    fastest = attribution.fastest_step(s0)
    a.data_free_step_s = attribution.data_free_step(step, wait * step, cpu_use.get("data_cpu_delay_s", 0.0), fastest)
    a.cpu["fastest_step_s"] = fastest
    a.data_gain = data_gain(a)
    recs = input_fixes(a, s0, d0, memory_bytes)
    if d0.get("ddp") and d0["world_size"] > 1:
        comm_recs, rejected = comm_fixes(a, d0, s0)
        recs += comm_recs
        a.rejected += rejected
    recs += compute_fixes(a, s0)
    if verdict in ("compute-bound", "host-bound", "balanced"):
        a.rejected.append(dict(NOT_MEASURED))
    admit(a, recs)
    _notes(a, d0, s0, clean, cpu_use)
    return a


def _notes(a: Analysis, d0: dict, s0, clean: list, cpu_use: dict) -> None:
    if not a.loader_driven and not s0.batch_found:
        a.notes.append(f"no line making the model's input was found (no source to read): the "
                       f"{(a.data_wait_fraction + a.other_fraction):.0%} of the step outside compute is not counted "
                       "as data")
    if not clean:
        a.notes.append("every measured step was marked for exclusion; all are used")
    if a.steps_from == "backward":
        a.notes.append("no torch.optim optimizer was built: a step is counted at each backward() call; the "
                       "weight update by hand is outside compute (" + ("in the step's work" if a.loader_driven else
                                                                       "in the data wait, without a DataLoader") + ")")
    if not d0.get("model_found", True):
        a.notes.append("no module with parameters was called in training mode: compute is backward and the "
                       "optimizer only")
    if a.verdict in ("compute-bound", "communication-bound") and not any(r.kind == INPUT for r in a.recommendations):
        a.notes.append(f"no input fix: the step waits for data only {a.data_wait_fraction:.0%} of the time" +
                       (f", and its workers' CPU on the step's cores adds {cpu_use['data_cpu_share']:.0%}"
                        if cpu_use.get("data_cpu_share") else ""))


def _dropped(ranks: list[dict]) -> list[dict]:
    """The probes each rank dropped, one entry per probe and reason, with the ranks that dropped it."""
    out: dict[tuple[str, str], dict] = {}
    for d in ranks:
        for x in d.get("dropped", []):
            out.setdefault((x["probe"], x["why"]), {"probe": x["probe"], "why": x["why"], "ranks": []})["ranks"].append(
                d["rank"])
    return list(out.values())
