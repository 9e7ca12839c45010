"""From per-rank measurements to a verdict, its fractions, and ranked, predicted fixes.

Thresholds (one place, published in docs/profile.md): a run is input-bound when
the step waits for data at least 5% of the time (moderate) or 20% (high), and
communication-bound likewise for exposed gradient communication. A dead band of
2 points either side of 5% is reported as ``balanced``, so that noise on a
shared machine does not flip a verdict between two runs. Warm-up steps and the
first batch of each epoch never enter an average.

Predictions, each from this run's own measurements:

- more DataLoader workers: w producers overlapped with the step (workers
  prefetch), with the CPU shared fairly among all runnable processes (the load
  average says how many others there are), plus the measured cost of receiving a
  batch from a worker;
- batch echoing at e <= R: step time T_p / e + T_c (synchronous loader) or
  max(T_p / e, T_c) (workers), then discounted by the extra steps echoed
  training needs to reach the same accuracy (``BATCH_ECHO_STEPS``);
- the device-resident loader: the step-alone time (the batch is already there);
- bf16 gradient compression: replayed steps with the compressing hook against
  the plain ones (the alpha-beta cost model, fitted to float32 and bfloat16
  all-reduces timed in the same run plus the casts, is given beside it: it
  cannot see how the hook's all-reduce overlaps backward);
- bf16 autocast: the step-alone time measured under autocast.

Changes the training math: no (analysis only); each recommendation says
whether its fix does.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from hasten.distributed.cost_model import fit_link

INPUT_MODERATE = 0.05  # data-wait share of the step: moderate input bottleneck
INPUT_HIGH = 0.20  # ... high
COMM_MODERATE = 0.05  # exposed-communication share: moderate
COMM_HIGH = 0.20
DEAD_BAND = 0.02  # +-2 points around the moderate threshold read as "balanced"
HOST_BUSY = 0.90  # GPU runs: the host spends >= 90% of the step launching work
WORTH_IT = 1.05  # a fix predicted below this speedup is listed as rejected
MAX_WORKERS = 8

# Steps to the target accuracy with batch echoing at factor e, relative to no
# echoing: the earlier echo sweep (CIFAR-10-JPEG, small CNN, 3 seeds; group "a" of
# benchmarks/results/echo_sweep.json at commit 8b1ade8: 156.7, 233.3, 383.3, 743.3
# steps). An echoed step is worth less than a fresh one; this is by how much. The
# current sweep (docs/results/echo.md) also finds batch echoing the weakest variant.
BATCH_ECHO_STEPS = ((1.0, 1.0), (2.0, 233.3 / 156.7), (4.0, 383.3 / 156.7), (6.0, 743.3 / 156.7))
ECHO_SOURCE = "benchmarks/results/echo_sweep.json at commit 8b1ade8 (batch echoing, CIFAR-10 small CNN, 3 seeds)"


@dataclass
class Recommendation:
    fix: str
    how: str  # the snippet or flag that applies it
    predicted_speedup: float  # wall time to the same result
    basis: str  # what the prediction is computed from
    changes_math: bool
    apply: str | None = None  # HASTEN_PROFILE_APPLY value for --verify; None: needs a code change
    step_rate_factor: float = 1.0  # predicted_speedup / step-rate speedup (echo's data efficiency)
    verified_speedup: float | None = None  # measured by a re-run with the fix applied (wall clock)
    verified_step_s: float | None = None


@dataclass
class Analysis:
    verdict: str
    severity: str | None
    step_time_s: float
    own_step_s: float  # step time less run-queue waits (other jobs' load); predictions use it
    data_wait_fraction: float
    compute_fraction: float
    comm_fraction: float
    upstream_ratio: float | None
    loader_batch_s: float | None
    step_alone_s: float
    comm_s: float
    ranks: int
    device: str
    num_workers: int
    steps: int
    warmup: int
    recommendations: list[Recommendation] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    per_step: list[dict] = field(default_factory=list)  # rank 0's measured steps, for the timeline

    def as_dict(self) -> dict:
        return asdict(self)


def _mean(xs):
    return sum(xs) / len(xs) if xs else math.nan


def _probe_median(recs: list[dict], key: str = "own_s") -> float | None:
    # The first step of a probe pays for the switch (a new autocast cache, a new hook): drop it.
    # "own_s": the step's wall time less its run-queue waits (other jobs' load).
    vals = [r.get(key, r["work_s"]) for r in recs[1:]] or [r.get(key, r["work_s"]) for r in recs]
    return statistics.median(vals) if vals else None


@dataclass(frozen=True)
class RankSummary:
    rank: int
    step_s: float
    own_step_s: float  # the same less run-queue waits: what predictions compare against
    wait_s: float
    work_s: float
    step_alone_s: float | None
    step_alone_cpu_s: float | None
    comm_off_s: float | None
    comm_bf16_s: float | None
    autocast_s: float | None
    host_fraction: float | None
    loader_batch_s: float | None
    loader_cpu_s: float | None
    handoff_s: float | None


def summarise_rank(d: dict) -> RankSummary:
    measured = d["records"]["measure"]
    alone = d["records"].get("step_alone", [])
    lp = d.get("loader_probe") or {}
    cpu = lp.get("worker_cpu_s") if d.get("num_workers") else lp.get("main_cpu_s")
    host = None
    if d.get("device") == "cuda" and alone and "host_s" in alone[0]:
        host = _probe_median(alone, "host_s") / _probe_median(alone, "work_s")
    return RankSummary(
        rank=d["rank"], step_s=_mean([r["wait_s"] + r["work_s"] for r in measured]),
        own_step_s=_mean([r.get("own_wait_s", r["wait_s"]) + r.get("own_s", r["work_s"]) for r in measured]),
        wait_s=_mean([r["wait_s"] for r in measured]), work_s=_mean([r["work_s"] for r in measured]),
        step_alone_s=_probe_median(alone), step_alone_cpu_s=_probe_median(alone, "cpu_s"),
        comm_off_s=_probe_median(d["records"].get("comm_off", [])),
        comm_bf16_s=_probe_median(d["records"].get("comm_bf16", [])),
        autocast_s=_probe_median(d["records"].get("autocast", [])),
        host_fraction=host, loader_batch_s=lp.get("batch_s"), loader_cpu_s=cpu, handoff_s=lp.get("handoff_s"))


def classify(wait: float, comm: float, host_fraction: float | None = None) -> tuple[str, str | None]:
    """The verdict and its severity from the data-wait and exposed-communication shares."""
    top = max(wait, comm)
    if wait >= INPUT_MODERATE + DEAD_BAND or comm >= COMM_MODERATE + DEAD_BAND:
        kind = "input-bound" if wait >= comm else "communication-bound"
        high = INPUT_HIGH if kind == "input-bound" else COMM_HIGH
        return kind, "high" if top >= high else "moderate"
    if top <= INPUT_MODERATE - DEAD_BAND:
        if host_fraction is not None and host_fraction >= HOST_BUSY:
            return "host-bound", None
        return "compute-bound", None
    return "balanced", None


def echo_steps_factor(e: float) -> float:
    """Steps to target with batch echoing at e relative to none (piecewise linear in e)."""
    pts = BATCH_ECHO_STEPS
    if e >= pts[-1][0]:
        return pts[-1][1]
    for (e0, s0), (e1, s1) in zip(pts, pts[1:]):
        if e0 <= e <= e1:
            return s0 + (s1 - s0) * (e - e0) / (e1 - e0)
    return 1.0


def _input_fixes(a: Analysis, s: RankSummary, cpu_count: int, load: float, batch_bytes: int,
                 dataset_len: int | None, batch_size: int | None, memory_bytes: float) -> list[Recommendation]:
    recs = []
    t, tc, tp = a.own_step_s, a.step_alone_s, a.loader_batch_s
    if tp is None or tc is None or tc <= 0:
        return recs
    w0 = a.num_workers
    per_worker = tp * max(w0, 1)  # seconds one producer needs per batch
    cpu_per_batch = min(max(s.loader_cpu_s or 0.0, 0.0), per_worker)
    step_cpu = min(s.step_alone_cpu_s or tc, tc)
    main_busy = step_cpu / tc
    handoff = s.handoff_s or 0.0
    # Other jobs' runnable processes (load average less this loop): cores are shared
    # fairly among everything runnable, our workers included.
    other = max(0.0, load - main_busy)

    def step_with(w: int) -> tuple[float, float, float]:  # (step, producer, consumer) seconds
        demand = w * cpu_per_batch / per_worker  # cores the workers would keep busy
        share = min(1.0, cpu_count / max(1e-9, other + main_busy + demand))
        producer = (per_worker - cpu_per_batch + cpu_per_batch / share) / w
        consumer = tc - step_cpu + step_cpu / share + handoff
        return max(consumer, producer), producer, consumer

    if w0 < MAX_WORKERS:
        options = [(w, *step_with(w)) for w in range(max(w0 + 1, 2), MAX_WORKERS + 1)]
        # The fewest workers that keep 25% headroom over the step (a queue run at its
        # capacity waits), else the fastest option.
        w, step_new, producer, consumer = next((o for o in options if o[2] <= 0.8 * o[3]),
                                               min(options, key=lambda o: o[1]))
        recs.append(Recommendation(
            fix=f"{w} DataLoader workers", how=f"DataLoader(..., num_workers={w}, persistent_workers=True)",
            predicted_speedup=t / step_new, changes_math=False, apply=f"workers={w}",
            basis=f"per-worker batch {per_worker * 1e3:.1f} ms ({cpu_per_batch * 1e3:.1f} ms CPU), "
                  f"load {load:.1f} on {cpu_count} cores, {handoff * 1e3:.2f} ms hand-off per batch, "
                  f"producer {producer * 1e3:.1f} ms vs step {consumer * 1e3:.1f} ms per batch"))

    r = tp / tc
    if r > 1.2:
        sync = w0 == 0

        def echoed(e: float) -> float:
            step = tp / e + tc if sync else max(tp / e, tc)
            return t / step / echo_steps_factor(e)

        candidates = sorted({min(r, 6.0)} | {float(e) for e in range(2, int(min(r, 6.0)) + 1)})
        e = max(candidates, key=echoed)
        e = round(e, 1)
        rate = t / (tp / e + tc if sync else max(tp / e, tc))
        recs.append(Recommendation(
            fix=f"batch echoing e={e:g}", how=f"from hasten.echo import echo_batches; "
                                             f"for batch in echo_batches(loader, {e:g}): ...",
            predicted_speedup=rate / echo_steps_factor(e), step_rate_factor=1 / echo_steps_factor(e),
            changes_math=True, apply=f"echo={e:g}",
            basis=f"R={r:.2f}; steps x{rate:.2f} faster, each worth 1/{echo_steps_factor(e):.2f} of a fresh "
                  f"one ({ECHO_SOURCE})"))

    if dataset_len and batch_size and batch_bytes:
        data_bytes = dataset_len * batch_bytes / batch_size
        if data_bytes < 0.25 * memory_bytes:
            loader = "device_loader.GpuLoader" if a.device == "cuda" else "host_loader.HostLoader"
            recs.append(Recommendation(
                fix="device-resident loader", how=f"hasten.data.{loader}(images, labels, batch_size)"
                                                  " with the dataset decoded once into memory",
                predicted_speedup=t / tc, changes_math=False,
                basis=f"dataset {data_bytes / 2**20:.0f} MiB fits; step alone {tc * 1e3:.1f} ms"))
    return recs


def _comm_fixes(a: Analysis, d0: dict, s0: RankSummary) -> tuple[list[Recommendation], list[dict]]:
    times = d0.get("allreduce_times") or []
    k = d0.get("grad_bytes") or 0
    if len(times) < 2 or k == 0 or a.comm_s <= 0:
        return [], [{"fix": "bf16 gradient compression", "why": "no all-reduce timings to calibrate the model"}]
    link = fit_link([b for b, _ in times], [s for _, s in times])
    full = link.alpha + k * link.beta
    bf16_times = d0.get("allreduce_bf16_times") or []
    cast = d0.get("bf16_cast_s") or 0.0
    if len(bf16_times) >= 2:  # bf16 sums may run at another speed than float32 ones: fit them apart
        link16 = fit_link([b for b, _ in bf16_times], [s for _, s in bf16_times])
    else:
        link16 = link
    half = link16.alpha + k / 2 * link16.beta + cast
    modelled = a.own_step_s / (a.own_step_s - a.comm_s + a.comm_s * half / full)
    basis = (f"exposed comm {a.comm_s * 1e3:.0f} ms; cost model fitted to all-reduces of this run (float32 "
             f"{link.gbit_per_s:.1f} Gbit/s, bfloat16 {link16.gbit_per_s:.1f} Gbit/s, casts {cast * 1e3:.0f} ms) "
             f"predicts x{modelled:.2f}")
    predicted = modelled
    if s0.comm_bf16_s is not None and s0.step_alone_s:
        # The replayed steps with the compressing hook itself see what the model cannot:
        # how the hook's all-reduce overlaps backward.
        predicted = a.own_step_s / (a.own_step_s - s0.step_alone_s + s0.comm_bf16_s)
        basis += f"; replayed steps with the hook: {s0.step_alone_s * 1e3:.0f} -> {s0.comm_bf16_s * 1e3:.0f} ms"
    rec = Recommendation(
        fix="bf16 gradient compression", how="hasten.distributed.hooks.register_allreduce_hook(ddp_model, "
                                               "'native', compress='bf16')",
        predicted_speedup=predicted, changes_math=True, apply="comm=bf16", basis=basis)
    rejected = [{"fix": "hierarchical / torus hook", "why": "one node: the two-level hooks pay across nodes only"}]
    return [rec], rejected


def _compute_fixes(a: Analysis, s: RankSummary) -> list[Recommendation]:
    if s.autocast_s is None or a.step_alone_s <= 0:
        return []
    step_new = a.own_step_s - a.step_alone_s + s.autocast_s
    return [Recommendation(
        fix="bf16 autocast", how="with hasten.nn.precision.autocast(device, True): loss = ...",
        predicted_speedup=a.own_step_s / step_new, changes_math=True, apply="autocast",
        basis=f"step alone {a.step_alone_s * 1e3:.1f} ms, {s.autocast_s * 1e3:.1f} ms under bf16 autocast")]


def analyse(ranks: list[dict], memory_bytes: float = 8 * 2**30) -> Analysis:
    """Merge every rank's report into one verdict with ranked recommendations."""
    ranks = sorted(ranks, key=lambda d: d["rank"])
    sums = [summarise_rank(d) for d in ranks]
    d0, s0 = ranks[0], sums[0]
    step = max(s.step_s for s in sums)  # the slowest rank sets everyone's pace
    wait = _mean([s.wait_s / s.step_s for s in sums])
    alone = _mean([s.step_alone_s for s in sums if s.step_alone_s is not None])
    comm = _mean([max(0.0, s.step_alone_s - s.comm_off_s) for s in sums
                  if s.comm_off_s is not None and s.step_alone_s is not None]) if d0.get("ddp") else 0.0
    comm = 0.0 if math.isnan(comm) else comm
    comm_frac = min(comm / step, max(0.0, 1.0 - wait))
    loader = _mean([s.loader_batch_s for s in sums if s.loader_batch_s is not None])
    loader = None if math.isnan(loader) else loader
    r = loader / alone if loader is not None and alone > 0 else None
    verdict, severity = classify(wait, comm_frac, s0.host_fraction)
    a = Analysis(verdict=verdict, severity=severity, step_time_s=step,
                 own_step_s=max(s.own_step_s for s in sums), data_wait_fraction=wait,
                 compute_fraction=max(0.0, 1.0 - wait - comm_frac), comm_fraction=comm_frac, upstream_ratio=r,
                 loader_batch_s=loader, step_alone_s=alone, comm_s=comm, ranks=len(ranks), device=d0["device"],
                 num_workers=d0["num_workers"], steps=len(d0["records"]["measure"]), warmup=d0["warmup"],
                 per_step=d0["records"]["measure"])
    recs: list[Recommendation] = []
    if verdict in ("input-bound", "balanced"):
        recs += _input_fixes(a, s0, d0.get("cpu_count") or 1, (d0.get("loadavg") or [0.0])[0],
                             d0.get("batch_bytes") or 0, d0.get("dataset_len"), d0.get("batch_size"), memory_bytes)
    if verdict in ("communication-bound", "balanced") and d0.get("ddp") and d0["world_size"] > 1:
        comm_recs, rejected = _comm_fixes(a, d0, s0)
        recs += comm_recs
        a.rejected += rejected
    if verdict in ("compute-bound", "host-bound", "balanced"):
        recs += _compute_fixes(a, s0)
        a.rejected.append({"fix": "channels_last / torch.compile",
                           "why": "not measured: they need the model object, which a zero-code run cannot reach"})
    if verdict in ("compute-bound", "communication-bound"):
        a.notes.append(f"no input fix: the step waits for data only {wait:.0%} of the time")
    for rec in recs:
        if rec.predicted_speedup >= WORTH_IT:
            a.recommendations.append(rec)
        else:
            a.rejected.append({"fix": rec.fix, "why": f"predicted x{rec.predicted_speedup:.2f}: not worth it",
                               "basis": rec.basis, "predicted_speedup": rec.predicted_speedup,
                               "apply": rec.apply, "step_rate_factor": rec.step_rate_factor,
                               "verified_speedup": None})
    # Highest predicted gain first; on a near tie, a fix --verify can apply without code edits first.
    a.recommendations.sort(key=lambda x: (-round(x.predicted_speedup, 1), x.apply is None))
    return a
