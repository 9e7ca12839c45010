"""One rank's report reduced to per-step figures: the steps that count, and the probes' medians.

Warm-up steps never enter an average; steps left out (another loader's batches, an evaluation,
a stall, a worker start-up) are counted by reason. The probes' medians drop each kind's first
step, which pays for the switch (a new autocast cache, a new hook).

Changes the training math: no (analysis only).
"""

from __future__ import annotations

import statistics

from hasten.profile import attribution
from hasten.profile.records import RankSummary
from hasten.profile.shares import STALL, stalled
from hasten.stats import mean


def span_of(r: dict) -> float:
    """A step's wall time: data wait and work (older reports have no ``span_s``)."""
    return r["span_s"] if "span_s" in r else r["wait_s"] + r["work_s"]


def own_of(r: dict) -> float:
    """A step's time less its data wait and its run-queue waits (older reports: its work)."""
    return r.get("own_s", r["work_s"])


def probe_median(recs: list[dict], value=own_of) -> float | None:
    """The median of ``value`` over a probe's steps, its first step left out (it pays for the switch)."""
    recs = [r for r in recs if not r.get("excluded")] or recs
    vals = [value(r) for r in recs[1:]] or [value(r) for r in recs]
    return statistics.median(vals) if vals else None


def _field(key: str):
    """A probe step's ``key`` (its work where a step lacks it)."""
    return lambda r: r.get(key, r["work_s"])


def clean_steps(records: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """The measured steps that count, and how many were left out for what.

    Left out: steps that drew batches from another loader or ran an evaluation
    (named by the injector), steps whose compute stalled (:func:`hasten.profile.shares.stalled`),
    and steps holding the first batch of a loader with workers (start-up is not steady state),
    unless most steps do (a new iterator per step is how this loop runs)."""
    excluded: dict[str, int] = {}
    keep = []
    for r in records:
        if r.get("excluded"):
            reason = r["excluded"]
            excluded[reason] = excluded.get(reason, 0) + 1
        else:
            keep.append(r)
    stall = stalled(keep)
    if any(stall):
        excluded[f"a stall: compute over {STALL:g}x the median step's (the cores held by other jobs, most "
                 "likely)"] = sum(stall)
        keep = [r for r, s in zip(keep, stall) if not s]
    starts = [r for r in keep if r.get("epoch_start")]
    if starts and len(starts) < len(keep) / 2:
        keep = [r for r in keep if not r.get("epoch_start")]
        excluded["worker start-up (first batch of an epoch)"] = len(starts)
    return keep, excluded


def summarise_rank(d: dict) -> RankSummary:
    """A rank's report (the injector's JSON) as a :class:`~hasten.profile.records.RankSummary`."""
    measured, excluded = clean_steps(d["records"]["measure"])
    if not measured:
        measured = d["records"]["measure"]
    records = d["records"]
    alone = records.get("step_alone", [])
    loader_probe = d.get("loader_probe") or {}
    workers = d.get("worker_cpu") or {}
    per_batch = None
    if workers.get("cpu_s") is not None and workers.get("batches"):
        per_batch = workers["cpu_s"] / workers["batches"]
    elif loader_probe.get("worker_cpu_s") is not None:
        per_batch = loader_probe["worker_cpu_s"]
    host = None
    if d.get("device") == "cuda" and alone and "host_s" in alone[0]:
        host = probe_median(alone, _field("host_s")) / probe_median(alone, span_of)
    cpu = [r["cpu_s"] for r in measured if r.get("cpu_s") is not None]
    data_cpu = [r["data_cpu_s"] for r in measured if r.get("data_cpu_s") is not None]
    split = attribution.data_split(d, measured)
    if workers.get("cpu_s") is not None and workers.get("batches"):
        split.update(worker_batches=workers["batches"], in_flight=workers.get("in_flight") or 0)
    calm = min(alone[1:] or alone, key=lambda r: r["work_s"]) if alone else None
    with_cpu = [r for r in measured if r.get("cpu_s") is not None]
    alone_cpu = None
    if alone:
        alone_cpu = probe_median(alone, _field("compute_cpu_s" if "compute_cpu_s" in alone[0] else "cpu_s"))
    comm_off = records.get("comm_off", [])
    return RankSummary(
        **split, work_median_s=statistics.median(r["work_s"] for r in measured),
        cpu_steps=tuple(r["cpu_s"] for r in with_cpu), span_steps=tuple(span_of(r) for r in with_cpu),
        own_cpu_steps=tuple(r["cpu_s"] - (r.get("data_cpu_s") or 0.0) for r in with_cpu),
        work_steps=tuple(r["work_s"] for r in with_cpu), window_steps=len(records["measure"]),
        queued_steps=tuple(max(0.0, r["work_s"] - r["own_s"]) for r in with_cpu if "own_s" in r),
        own_work_s=mean(r["own_s"] for r in measured) if all("own_s" in r for r in measured) else None,
        calm_alone=(calm["work_s"], calm.get("compute_cpu_s", calm.get("cpu_s"))) if calm else None,
        rank=d["rank"], step_s=mean(span_of(r) for r in measured),
        own_step_s=mean(r.get("own_wait_s", r["wait_s"]) + own_of(r) for r in measured),
        wait_s=mean(r["wait_s"] for r in measured), work_s=mean(r["work_s"] for r in measured),
        comm_direct_s=mean(r.get("comm_s", 0.0) for r in measured),
        micro=statistics.median([r.get("micro") or 1 for r in measured]),
        cpu_s=mean(cpu) if cpu else None, data_cpu_s=mean(data_cpu) if data_cpu else None,
        step_alone_s=probe_median(alone), step_alone_cpu_s=alone_cpu,
        comm_off_s=probe_median(comm_off),
        step_alone_wall_s=probe_median(alone, _field("work_s")) if alone else None,
        comm_off_wall_s=probe_median(comm_off, _field("work_s")) if comm_off else None,
        comm_bf16_s=probe_median(records.get("comm_bf16", [])),
        autocast_s=probe_median(records.get("autocast", [])),
        host_fraction=host, loader_batch_s=loader_probe.get("batch_s"), worker_cpu_per_batch_s=per_batch,
        handoff_s=loader_probe.get("handoff_s"), handout_s=loader_probe.get("handout_s"), excluded=excluded)
