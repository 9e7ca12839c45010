"""From per-rank measurements to a verdict, its fractions, and ranked, predicted fixes.

Thresholds (one place, published in docs/profile.md): a run is input-bound when
the step waits for data at least 5% of the time (moderate) or 20% (high), and
communication-bound likewise for exposed gradient communication. A dead band of
2 points either side of 5% is reported as ``balanced``, so that noise on a
shared machine does not flip a verdict between two runs. Warm-up steps and the
first batch of each epoch never enter an average.

A step is an optimizer step; its time T splits into data wait D, exposed
communication and compute. Predictions, each from this run's own measurements,
and none above what the measurements allow: a data fix at most T / (T - D), a
communication fix at most T / (T - comm) (Amdahl: the rest of the step stays):

- more DataLoader workers (or, for a loop without a DataLoader, moving the batch
  function into one): the step becomes max(T - D + hand-off, P / w, (c + m) / C),
  with P one producer's time per step's batches, c their measured CPU (workers'
  /proc times, or the main process's CPU outside compute), m the main process's
  other CPU per step and C the CPU cores measured available to the job (affinity,
  cgroup quota and a short busy probe: :func:`cpu_available`);
- batch echoing at e <= R: the same with P / e and c / e (workers) or D / e + T - D
  (synchronous), then discounted by the extra steps echoed training needs to reach
  the same accuracy (``BATCH_ECHO_STEPS``);
- the device-resident loader: T - D (the batch is already there);
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
from hasten.profile import attribution
from hasten.profile.cores import cores_for_run, cpu_available
from hasten.profile.inject.fixes import echo_apply, echo_code
from hasten.profile.loop_kind import resident_code
from hasten.profile.prepare_once import prepare_once
from hasten.profile.shares import STALL, stalled, sum_interval, undecided, widened

INPUT_MODERATE = 0.05  # data-wait share of the step: moderate input bottleneck
INPUT_HIGH = 0.20  # ... high
COMM_MODERATE = 0.05  # exposed-communication share: moderate
COMM_HIGH = 0.20
DEAD_BAND = 0.02  # +-2 points around the moderate threshold read as "balanced"
HOST_BUSY = 0.90  # GPU runs: the host spends >= 90% of the step launching work
WORTH_IT = 1.05  # a fix predicted below this speedup is listed as rejected
MAX_WORKERS = 8

# Steps to the target accuracy with batch echoing at factor e, relative to no
# echoing, measured: means over 3 seeds of 156.7 steps without echoing and 233.3,
# 383.3 and 743.3 at e = 2, 4 and 6 (a small CNN on CIFAR-10-JPEG at 16x16, batch 64,
# learning rate 0.05, to 40% accuracy on 1,000 test images). An echoed step is worth
# less than a fresh one; this is by how much. The echo sweep (docs/results/echo.md)
# also finds batch echoing the weakest variant.
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
    bound: float | None = None  # the most the measurements allow (Amdahl)
    promoted: bool = False  # rejected by its prediction, recommended by its verification
    verification: dict | None = None  # --verify's measurement: interval, n, cost, whether it decides (verify.py)
    low: float | None = None  # the prediction at the low end of the data share's interval (rerank)

    @property
    def prediction_error(self) -> float | None:
        if self.verified_speedup is None or not self.predicted_speedup:
            return None
        return self.predicted_speedup / self.verified_speedup - 1


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
    loader_driven: bool = True  # a DataLoader feeds the training steps
    micro_batches: float = 1.0  # training forwards per optimizer step (gradient accumulation)
    excluded: list[dict] = field(default_factory=list)  # steps left out: validation passes, worker start-up
    loaders: list[dict] = field(default_factory=list)  # every DataLoader seen, training or not
    cpu: dict = field(default_factory=dict)  # measured CPU: cores available, per step and per batch
    where: list[dict] = field(default_factory=list)  # where the main thread spent its time (sampled)
    where_data: list[dict] = field(default_factory=list)  # ... when outside compute inside a step
    cost: dict = field(default_factory=dict)  # the profile's own wall time, and per verified fix
    dropped: list[dict] = field(default_factory=list)  # probes that failed and were dropped: probe, why, ranks
    probes_off: list[str] = field(default_factory=list)  # probes turned off (--no-probe)
    steps_from: str = "optimizer"  # what ends a step: "optimizer" steps, or "backward" calls (no optimizer built)
    # The share of the step that data costs, as the verdict weighs it: the data wait, or where the data
    # path's CPU competes with the step for the cores, its share of that CPU (input_kind "cpu").
    data_share: float = 0.0
    data_interval: tuple[float, float] = (0.0, 0.0)  # about 95%, from the steps' spread and the samples
    input_kind: str = "wait"  # "wait": the step waits for data; "cpu": the data path takes the step's cores
    near: float | None = None  # the threshold the deciding share's interval straddles (verdict "balanced")
    other_fraction: float = 0.0  # neither data, compute nor communication: where it went is in `other_where`
    other_where: list[dict] = field(default_factory=list)  # {"at": "train.py:211", "code", "function", "share"}
    data_free_step_s: float | None = None  # the step with data made free (the data-free counterfactual)
    threads: dict = field(default_factory=dict)  # torch's intra-op and inter-op threads as the script ran
    extended: int = 0  # times the measured window doubled because its shares could not decide yet
    ended_early: bool = False  # the command ended on its own inside the measured window: its steps so far

    def as_dict(self) -> dict:
        d = asdict(self)
        for rec, r in zip(d["recommendations"], self.recommendations):
            rec["prediction_error"] = r.prediction_error
        return d


def _mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


def _g(r: dict, key: str, default=None):
    if key in r:
        return r[key]
    if key == "span_s":
        return r["wait_s"] + r["work_s"]
    if key == "own_s":
        return r["work_s"]
    return default


def _probe_median(recs: list[dict], key: str = "own_s") -> float | None:
    # The first step of a probe pays for the switch (a new autocast cache, a new hook): drop it.
    # "own_s": the step's time less its data wait and its run-queue waits (other jobs' load).
    recs = [r for r in recs if not r.get("excluded")] or recs
    vals = [_g(r, key, r["work_s"]) for r in recs[1:]] or [_g(r, key, r["work_s"]) for r in recs]
    return statistics.median(vals) if vals else None


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


@dataclass(frozen=True)
class RankSummary:
    rank: int
    step_s: float
    own_step_s: float
    wait_s: float
    work_s: float
    comm_direct_s: float  # time in torch.distributed collectives the script calls itself
    micro: float
    cpu_s: float | None  # main process CPU per step
    data_cpu_s: float | None  # main process CPU per step spent on data (loader next / outside compute)
    step_alone_s: float | None
    step_alone_cpu_s: float | None
    comm_off_s: float | None
    comm_bf16_s: float | None
    step_alone_wall_s: float | None
    comm_off_wall_s: float | None
    autocast_s: float | None
    host_fraction: float | None
    loader_batch_s: float | None
    worker_cpu_per_batch_s: float | None
    handoff_s: float | None
    excluded: dict
    data_s: float = 0.0  # the data wait per step: the loader's, or the time making the batch (no DataLoader)
    data_lo: float = 0.0  # ... its share of the step, about 95% interval
    data_hi: float = 1.0
    other_s: float = 0.0  # per step, neither data, compute nor communication
    batch_found: bool = True  # without a DataLoader: the lines that make the batch were found
    work_median_s: float | None = None  # the median measured step less its data wait (set against the replay's)
    # the replayed step least disturbed (the first left out): its wall time and CPU. The workers go on making
    # the batches they were asked for ahead (workers x prefetch) into the replay's first steps, on its cores.
    calm_alone: tuple[float, float] | None = None
    worker_batches: int = 0  # batches drawn from the workers over the window ...
    in_flight: int = 0  # ... give or take the batches they may hold made ahead (workers x prefetch)
    cpu_steps: tuple[float, ...] = ()  # each measured step's main-process CPU and wall time (contention.py) ...
    span_steps: tuple[float, ...] = ()
    own_cpu_steps: tuple[float, ...] = ()  # ... and the same less receiving batches
    work_steps: tuple[float, ...] = ()
    window_steps: int = 0  # every step of the measured window, left out or not (the window's /proc totals)


def summarise_rank(d: dict) -> RankSummary:
    measured, excluded = clean_steps(d["records"]["measure"])
    if not measured:
        measured = d["records"]["measure"]
    alone = d["records"].get("step_alone", [])
    lp = d.get("loader_probe") or {}
    wc = d.get("worker_cpu") or {}
    per_batch = None
    if wc.get("cpu_s") is not None and wc.get("batches"):
        per_batch = wc["cpu_s"] / wc["batches"]
    elif lp.get("worker_cpu_s") is not None:
        per_batch = lp["worker_cpu_s"]
    host = None
    if d.get("device") == "cuda" and alone and "host_s" in alone[0]:
        host = _probe_median(alone, "host_s") / _probe_median(alone, "span_s")
    cpu = [r["cpu_s"] for r in measured if r.get("cpu_s") is not None]
    dcpu = [r["data_cpu_s"] for r in measured if r.get("data_cpu_s") is not None]
    split = attribution.data_split(d, measured)
    if wc.get("cpu_s") is not None and wc.get("batches"):
        split.update(worker_batches=wc["batches"], in_flight=wc.get("in_flight") or 0)
    calm = min(alone[1:] or alone, key=lambda r: r["work_s"]) if alone else None
    own = [r for r in measured if r.get("cpu_s") is not None]
    return RankSummary(**split, work_median_s=statistics.median(r["work_s"] for r in measured),
        cpu_steps=tuple(r["cpu_s"] for r in own), span_steps=tuple(_g(r, "span_s") for r in own),
        own_cpu_steps=tuple(r["cpu_s"] - (r.get("data_cpu_s") or 0.0) for r in own),
        work_steps=tuple(r["work_s"] for r in own), window_steps=len(d["records"]["measure"]),
        calm_alone=(calm["work_s"], calm.get("compute_cpu_s", calm.get("cpu_s"))) if calm else None,
        rank=d["rank"], step_s=_mean(_g(r, "span_s") for r in measured),
        own_step_s=_mean(r.get("own_wait_s", r["wait_s"]) + _g(r, "own_s") for r in measured),
        wait_s=_mean(r["wait_s"] for r in measured), work_s=_mean(r["work_s"] for r in measured),
        comm_direct_s=_mean(r.get("comm_s", 0.0) for r in measured),
        micro=statistics.median([r.get("micro") or 1 for r in measured]),
        cpu_s=_mean(cpu) if cpu else None, data_cpu_s=_mean(dcpu) if dcpu else None,
        step_alone_s=_probe_median(alone), step_alone_cpu_s=_probe_median(alone, "compute_cpu_s")
        if alone and "compute_cpu_s" in alone[0] else _probe_median(alone, "cpu_s") if alone else None,
        comm_off_s=_probe_median(d["records"].get("comm_off", [])),
        step_alone_wall_s=_probe_median(alone, "work_s") if alone else None,
        comm_off_wall_s=_probe_median(d["records"]["comm_off"], "work_s") if d["records"].get("comm_off") else None,
        comm_bf16_s=_probe_median(d["records"].get("comm_bf16", [])),
        autocast_s=_probe_median(d["records"].get("autocast", [])),
        host_fraction=host, loader_batch_s=lp.get("batch_s"), worker_cpu_per_batch_s=per_batch,
        handoff_s=lp.get("handoff_s"), excluded=excluded)


def classify(wait: float, comm: float, host_fraction: float | None = None,
             wait_interval: tuple[float, float] | None = None,
             comm_interval: tuple[float, float] | None = None) -> tuple[str, str | None]:
    """The verdict and its severity from the data and exposed-communication shares and their intervals.

    A share counts above a threshold only when its interval, widened to the dead band either
    side, is clear of it: input-bound when the data share's lower end is at least 5%,
    compute-bound when both shares' upper ends are below 5%, balanced in between. Severity:
    high when the lower end is at least 20%, moderate when the upper end is below it, and
    "moderate to high" when the interval holds 20%."""
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


def echo_steps_factor(e: float) -> float:
    """Steps to target with batch echoing at e relative to none (piecewise linear in e)."""
    pts = BATCH_ECHO_STEPS
    if e >= pts[-1][0]:
        return pts[-1][1]
    for (e0, s0), (e1, s1) in zip(pts, pts[1:]):
        if e0 <= e <= e1:
            return s0 + (s1 - s0) * (e - e0) / (e1 - e0)
    return 1.0


def _amdahl(t: float, removable: float) -> float:
    """The most any fix of a part taking ``removable`` of a step ``t`` can give."""
    rest = t - removable
    return t / rest if rest > 1e-12 else math.inf


def _input_fixes(a: Analysis, s: RankSummary, d0: dict, memory_bytes: float) -> list[Recommendation]:
    recs = []
    t = a.step_time_s
    d = a.data_wait_fraction * t
    contended = bool(a.cpu.get("contended"))
    # the step with its data made free: no data fix goes below it
    rest = a.data_free_step_s if a.data_free_step_s is not None else t - d
    if t - rest <= 0:
        return recs
    bound = _amdahl(t, t - rest)
    k = max(1.0, s.micro)
    w0 = a.num_workers if a.loader_driven else 0
    cores = a.cpu.get("available") or 1.0
    if a.loader_driven and w0 and a.loader_batch_s:
        producer = a.loader_batch_s * w0 * k  # one worker's time for one step's batches
        data_cpu = (s.worker_cpu_per_batch_s or 0.0) * k
    else:
        producer = d  # made in the loop: the wait is the production time
        # the loop's CPU outside compute, in the share of that time spent making the batch
        data_cpu = min((s.data_cpu_s or 0.0) * d / max(d + a.other_fraction * t, 1e-12), d)
    data_cpu = min(data_cpu, producer)
    main_cpu = max(0.0, (s.cpu_s or 0.0) - (0.0 if w0 else data_cpu))
    # With workers: the loop's CPU taking each batch from them (its time in the loader, where they are
    # ahead), and what their CPU on the step's own cores costs it (attribution.cpu_use). Both go with
    # the batches: more workers keep them, fewer batches (echoing) divide them, none removes them.
    receive = min(s.data_cpu_s or 0.0, d) if w0 else 0.0
    delay = a.cpu.get("data_cpu_delay_s", 0.0) if w0 else 0.0
    if w0 and a.cpu.get("step_cpu_per_step_s") is not None:
        # the step's own CPU from its replay: the measured steps' counts threads spinning at barriers
        main_cpu = a.cpu["step_cpu_per_step_s"] + receive
    handoff = (s.handoff_s or 0.0) * k if not w0 else 0.0
    a.cpu.update(producer_s=producer, data_cpu_s=data_cpu, main_cpu_s=main_cpu)

    def step_with(w: int, e: float = 1.0) -> tuple[float, str]:
        if w == 0:  # made in the loop: its making (at most the workers' CPU for it, at the rate the loop's
            # thread gets a core: attribution.cpu_use), no hand-off
            return rest + data_cpu / e / a.cpu.get("thread_rate", 1.0), "making the batches in the loop"
        parts = {"rest of the step": rest + handoff + (receive + delay) / e, "producers": producer / e / w,
                 "CPU": (data_cpu / e + main_cpu) / cores}
        key = max(parts, key=parts.get)
        return parts[key], key

    # Where the CPU the model adds up is more than the step took, the model's step as run is the
    # reference: a fix gains what it changes in the model, not the gap between the model and the clock.
    now = max(t, step_with(w0)[0]) if contended and w0 else t

    def speedup(step: float) -> float:
        return min(now / max(step, 1e-12), bound)

    def basis(w, e=1.0):
        step, limit = step_with(w, e)
        against = (f"against {now * 1e3:.1f} ms as run in the same model (the CPU is contended)" if now != t
                   else f"against {t * 1e3:.1f} ms as run")
        return (f"one producer makes a step's {k:g} batch(es) in {producer * 1e3:.1f} ms ({data_cpu * 1e3:.1f} ms CPU), "
                f"main process {main_cpu * 1e3:.1f} ms CPU per step, {cores:.2f} cores available (measured), "
                f"{handoff * 1e3:.2f} ms hand-off; step {step * 1e3:.1f} ms, set by {limit}, {against}; "
                f"bound x{bound:.2f} (the step with data made free: {rest * 1e3:.1f} of {t * 1e3:.1f} ms)")

    # Never more workers than the cores the process may use: PyTorch warns above that that the DataLoader
    # "might get running slow or even freeze" (issue 43: 3 workers on 2 cores, promoted on one run, x0.97).
    most = min(MAX_WORKERS, usable_cores(a.cpu))
    if max(w0 + 1, min(2, most)) <= most:
        options = [(w, step_with(w)[0]) for w in range(max(w0 + 1, min(2, most)), most + 1)]
        best = min(o[1] for o in options)
        w = next(w for w, st in options if st <= best * 1.02)
        pred = speedup(step_with(w)[0])
        train = [ld for ld in a.loaders if ld.get("training")]
        per_step_iter = per_step_iter_of(a, d0)
        # An IterableDataset yields every item in every worker unless it splits them by worker,
        # which its workers' first batches showed when it had workers (loader._check_workers).
        dup = train[0].get("worker_duplicates") if train else None
        split = bool(dup) and dup["distinct"] == dup["workers"]
        shard = ("\n     # an IterableDataset: split its items by worker (torch.utils.data.get_worker_info()), "
                 "or each worker yields all of them" if train and train[0].get("iterable") and not split else "")
        if a.loader_driven and per_step_iter:  # next(iter(loader)) every step: a new pass (and workers) each time
            recs.append(Recommendation(
                fix=f"one iterator, {w} DataLoader workers",
                how=f"it = iter(DataLoader(..., num_workers={w}, persistent_workers=True))   # once; then "
                    "x, y = next(it) each step (a new iter() at StopIteration)" + shard,
                predicted_speedup=pred, changes_math=False, apply=f"workers={w},keep_iter", basis=basis(w),
                bound=bound))
        elif a.loader_driven:
            recs.append(Recommendation(
                fix=f"{w} DataLoader workers", how=f"DataLoader(..., num_workers={w}, persistent_workers=True)" + shard,
                predicted_speedup=pred, changes_math=False, apply=f"workers={w}", basis=basis(w), bound=bound))
        else:
            fn = _batch_function(a)
            recs.append(Recommendation(
                fix=f"make batches in a DataLoader with {w} workers",
                how=("class Batches(torch.utils.data.IterableDataset):\n"
                     f"         def __iter__(self):\n             while True:\n                 yield {fn}\n"
                     f"     batches = iter(DataLoader(Batches(), batch_size=None, num_workers={w}, "
                     "persistent_workers=True))\n"
                     "     # in the loop: x, y = next(batches)   (seed each worker: torch.utils.data.get_worker_info())"),
                predicted_speedup=pred, changes_math=False, apply=f"batch_fn=workers:{w}", basis=basis(w),
                bound=bound))

    if a.loader_driven and w0 and data_cpu > 0 and not per_step_iter_of(a, d0):
        # Receiving a batch from a worker costs the loop CPU, and the workers' CPU may take the
        # step's cores: where making a batch costs less than that, the loop is faster making it.
        recs.append(Recommendation(
            fix="make the batches in the loop (num_workers=0)", how="DataLoader(..., num_workers=0)",
            predicted_speedup=speedup(step_with(0)[0]), changes_math=False, apply="workers=0",
            basis=f"the loop takes {receive * 1e3:.1f} ms a step receiving batches from {w0} workers, and their CPU "
                  f"on the step's cores costs it {delay * 1e3:.1f} ms; making a step's batches costs at most "
                  f"their {data_cpu * 1e3:.1f} ms of CPU: step {step_with(0)[0] * 1e3:.1f} ms against "
                  f"{now * 1e3:.1f} ms as run",
            bound=bound))

    r = a.upstream_ratio
    if r is not None and r > 1.2:
        def echoed_step(e: float) -> float:
            if w0:
                return step_with(w0, e)[0]
            return d / e + rest

        # Whole factors only: each batch is used e times, and "1.3 times" is no way to use one.
        candidates = [float(e) for e in range(2, max(2, int(min(r, 6.0))) + 1)]
        e = max(candidates, key=lambda e: speedup(echoed_step(e)) / echo_steps_factor(e))
        rate = speedup(echoed_step(e))
        pred = rate / echo_steps_factor(e)
        # Under gradient accumulation a step's micro-batches are echoed together: copies of one
        # micro-batch inside a step would make its gradient one micro-batch's (issue 34).
        group = max(1, round(k))
        if a.loader_driven:
            apply = echo_apply(e, group)
            how = echo_code(apply)  # the call --verify makes (hasten.profile.inject.fixes.echoed)
        elif group == 1:
            how = (f"if step % {round(e):d} == 0: x, y = {_batch_function(a)}   "
                   f"# reuse each batch for {round(e):d} steps")
            apply = f"batch_fn=echo:{round(e):d}"  # hasten.profile.inject.batch_fn
        else:
            how = (f"if step % {round(e):d} == 0: batches = [{_batch_function(a)} for _ in range({group})]   "
                   f"# reuse each step's {group} micro-batches for {round(e):d} steps")
            apply = None
        recs.append(Recommendation(
            fix=f"batch echoing e={e:g}{' of whole steps' if group > 1 else ''}", how=how, predicted_speedup=pred,
            step_rate_factor=1 / echo_steps_factor(e),
            changes_math=True, apply=apply, bound=bound,
            basis=f"R={r:.2f}; steps x{rate:.2f} faster, each worth 1/{echo_steps_factor(e):.2f} of a fresh "
                  f"one ({ECHO_SOURCE})"))

    dataset_len, batch_size, batch_bytes = d0.get("dataset_len"), d0.get("batch_size"), d0.get("batch_bytes") or 0
    if a.loader_driven and dataset_len and batch_size and batch_bytes:
        data_bytes = dataset_len * batch_bytes / batch_size
        if data_bytes < 0.25 * memory_bytes:
            recs.append(Recommendation(
                fix="device-resident loader", how=resident_code(d0.get("batch_layout"), a.device),
                predicted_speedup=bound, changes_math=False, bound=bound, apply="resident",
                basis=f"dataset {data_bytes / 2**20:.0f} MiB fits; the step with data made free "
                      f"{rest * 1e3:.1f} ms"))
    elif not a.loader_driven:
        lines = ((d0.get("outside") or {}).get("lines") or {}).get("batch", [])
        per_row = _per_row_fix(a, lines, d, t, bound)
        if per_row is not None:
            recs.append(per_row)
        once = prepare_once(d0, lines, data_cpu, d, rest, bound, a.data_interval[0], _batch_function(a))
        if once is not None and per_row is None:
            recs.append(Recommendation(**once))
    return recs


PER_ROW_MOST = 0.5  # the per-row lines hold at least this share of the batch's samples to be its cost


def _per_row_fix(a: Analysis, lines: list[dict], d: float, t: float, bound: float) -> Recommendation | None:
    """Where the batch is made row by row in a Python comprehension (sampled on the lines that make it,
    :func:`hasten.profile.inject.batch_source.line_shape`), one operation over every row at once: the
    statements rewritten where they stack windows of one array (nanoGPT's ``get_batch()``), else named.

    Predicted from the samples: the share of the batch's time on those lines, at best all of it saved
    (one index of every row costs a small part of a loop over them); never above the bound."""
    total = sum(x["samples"] for x in lines)
    rows = [x for x in lines if x.get("per_row")]
    share = sum(x["samples"] for x in rows) / total if total else 0.0
    if not rows or share < PER_ROW_MOST:
        return None
    saved = d * share
    pred = min(t / max(t - saved, 1e-12), bound)
    rewritten = [x["rows_at_once"] for x in rows if x.get("rows_at_once")]
    where = ", ".join(f"{x['at']} ({x.get('function', '?')})" for x in rows[:2])
    if rewritten:
        how = "\n     ".join(rewritten) + "   # every row in one index, as the comprehension made them"
    else:
        how = (f"# {rows[0]['at']} makes the batch one row at a time in Python: `{rows[0].get('code', '')}`;"
               "\n     # make every row in one tensor operation (an index of all rows, a batched transform)")
    return Recommendation(
        fix=f"make the batch's rows at once, not in a Python loop per row ({where})", how=how,
        predicted_speedup=pred, changes_math=False, bound=bound, apply="batch_fn=rows" if rewritten else None,
        basis=f"{share:.0%} of the samples making the batch are on lines that loop over its rows in Python "
              f"({saved * 1e3:.1f} of its {d * 1e3:.1f} ms a step); at best all of that saved")


def per_step_iter_of(a: Analysis, d0: dict) -> bool:
    """Whether the loop starts a new pass of its training loader every step (``next(iter(loader))``)."""
    train = [ld for ld in a.loaders if ld.get("training")]
    return bool(train) and train[0].get("iterators", 0) >= 0.5 * max(1, d0.get("steps_seen", 0))


def _batch_function(a: Analysis) -> str:
    for w in a.where_data:
        at = w.get("at", "")
        if ":" in at and not at.endswith(("<module>", "main")):
            return at.split(":", 1)[1] + "(...)"
    return "get_batch(...)"


def _comm_fixes(a: Analysis, d0: dict, s0: RankSummary) -> tuple[list[Recommendation], list[dict]]:
    times = d0.get("allreduce_times") or []
    k = d0.get("grad_bytes") or 0
    if len(times) < 2 or k == 0 or a.comm_s <= 0:
        return [], [{"fix": "bf16 gradient compression", "why": "no all-reduce timings to calibrate the model"}]
    bound = _amdahl(a.own_step_s, a.comm_s)
    link = fit_link([b for b, _ in times], [s for _, s in times])
    full = link.alpha + k * link.beta
    bf16_times = d0.get("allreduce_bf16_times") or []
    cast = d0.get("bf16_cast_s") or 0.0
    if len(bf16_times) >= 2:
        link16 = fit_link([b for b, _ in bf16_times], [s for _, s in bf16_times])
    else:
        link16 = link
    half = link16.alpha + k / 2 * link16.beta + cast
    modelled = a.own_step_s / (a.own_step_s - a.comm_s + a.comm_s * half / full)
    basis = (f"exposed comm {a.comm_s * 1e3:.0f} ms per optimizer step; cost model fitted to all-reduces of this run "
             f"(float32 {link.gbit_per_s:.1f} Gbit/s, bfloat16 {link16.gbit_per_s:.1f} Gbit/s, casts "
             f"{cast * 1e3:.0f} ms) predicts x{modelled:.2f}")
    predicted = modelled
    if s0.comm_bf16_s is not None and s0.step_alone_s:
        predicted = a.own_step_s / max(1e-9, a.own_step_s - s0.step_alone_s + s0.comm_bf16_s)
        basis += f"; replayed steps with the hook: {s0.step_alone_s * 1e3:.0f} -> {s0.comm_bf16_s * 1e3:.0f} ms"
    rec = Recommendation(
        fix="bf16 gradient compression", how="hasten.distributed.hooks.register_allreduce_hook(ddp_model, "
                                               "'native', compress='bf16')",
        predicted_speedup=min(predicted, bound), changes_math=True, apply="comm=bf16", basis=basis, bound=bound)
    recs = [rec]
    if a.micro_batches >= 1 and a.comm_s > 0:
        m = a.micro_batches
        # One all-reduce per optimizer step: twice the micro-batches halve its share per sample.
        per_sample_new = (a.own_step_s - a.comm_s) + a.comm_s / 2
        pred = min(a.own_step_s / per_sample_new, bound)
        recs.append(Recommendation(
            fix=f"accumulate {2 * m:g} micro-batches per optimizer step (no_sync on all but the last)",
            how="with ddp_model.no_sync(): loss.backward()   # for all micro-batches but the last of each step; "
                "scale the loss by 1/micro-batches",
            predicted_speedup=pred, changes_math=True, apply=None, bound=bound,
            basis=f"one all-reduce ({a.comm_s * 1e3:.0f} ms exposed) per optimizer step, now over {m:g} "
                  f"micro-batch(es); twice as many halve its cost per sample (a larger effective batch)"))
    rejected = [{"fix": "hierarchical / torus hook", "why": "one node: the two-level hooks pay across nodes only"}]
    return recs, rejected


def _compute_fixes(a: Analysis, s: RankSummary) -> list[Recommendation]:
    if s.autocast_s is None or a.step_alone_s <= 0:
        return []
    # The replayed steps give the ratio (both measured alike, interleaved); it scales the
    # in-loop compute, so that the prediction stays within what the loop itself measured.
    ratio = max(0.25, s.autocast_s / a.step_alone_s)
    t = a.step_time_s
    compute = t * a.compute_fraction
    step_new = t - compute + compute * ratio
    return [Recommendation(
        fix="bf16 autocast", how="with hasten.nn.precision.autocast(device, True): loss = ...",
        predicted_speedup=t / max(step_new, 1e-9), changes_math=True, apply="autocast",
        bound=_amdahl(t, compute),
        basis=f"step alone {a.step_alone_s * 1e3:.1f} ms, {s.autocast_s * 1e3:.1f} ms under bf16 autocast")]


def analyse(ranks: list[dict], memory_bytes: float = 8 * 2**30, cpus: dict | None = None) -> Analysis:
    """Merge every rank's report into one verdict with ranked recommendations."""
    ranks = sorted(ranks, key=lambda d: d["rank"])
    sums = [summarise_rank(d) for d in ranks]
    d0, s0 = ranks[0], sums[0]
    step = max(s.step_s for s in sums)  # the slowest rank sets everyone's pace
    wait = _mean(s.data_s / s.step_s for s in sums)
    w_lo, w_hi = _mean(s.data_lo for s in sums), _mean(s.data_hi for s in sums)
    other = _mean(s.other_s / s.step_s for s in sums)
    loader_driven = d0.get("loader_driven", True)
    alone = _mean(s.step_alone_s for s in sums if s.step_alone_s is not None)
    if math.isnan(alone):
        alone = _mean(s.work_s for s in sums)
    if not loader_driven:  # the replayed step leaves out all the loop's time outside compute; the rest stays
        alone += _mean(s.other_s for s in sums)
    comm = 0.0
    if d0.get("ddp"):
        # Wall time, as the step itself is measured: waiting for a slower peer is exposed communication too.
        c = _mean(max(0.0, s.step_alone_wall_s - s.comm_off_wall_s) for s in sums
                  if s.comm_off_wall_s is not None and s.step_alone_wall_s is not None)
        comm = 0.0 if math.isnan(c) else c
    comm = max(comm, _mean(s.comm_direct_s for s in sums))  # collectives the script calls itself
    comm_frac = min(comm / step, max(0.0, 1.0 - wait - other))
    micro = s0.micro
    loader = _mean(s.loader_batch_s for s in sums if s.loader_batch_s is not None)
    if math.isnan(loader):
        loader = None
    if loader is not None and loader_driven:
        produce = loader * micro  # a step's batches, made alone
    elif not loader_driven:
        produce = _mean(s.data_s for s in sums)  # made in the loop: its time there is the production time
    else:
        produce = None
    r = produce / alone if produce is not None and alone > 0 else None
    cores = cores_for_run(cpus or cpu_available(probe_s=0), d0.get("cpu_window"))
    cpu_use = attribution.cpu_use(s0, alone, cores["available"], micro, loader_driven,
                                  threads=(d0.get("threads") or {}).get("intra_op") or 1, window=d0.get("cpu_window"))
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
                 compute_fraction=max(0.0, 1.0 - wait - comm_frac - other), comm_fraction=comm_frac, upstream_ratio=r,
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
    a.data_free_step_s = attribution.data_free_step(a, s0, cpu_use)
    if not loader_driven and not s0.batch_found:
        a.notes.append(f"no line making the model's input was found (no source to read): the "
                       f"{(wait + other):.0%} of the step outside compute is not counted as data")
    if not clean:
        a.notes.append("every measured step was marked for exclusion; all are used")
    if a.steps_from == "backward":
        a.notes.append("no torch.optim optimizer was built: a step is counted at each backward() call; the "
                       "weight update by hand is outside compute (" + ("in the step's work" if loader_driven else
                                                                       "in the data wait, without a DataLoader") + ")")
    if not d0.get("model_found", True):
        a.notes.append("no module with parameters was called in training mode: compute is backward and the "
                       "optimizer only")
    recs: list[Recommendation] = []
    if verdict in ("input-bound", "balanced"):
        recs += _input_fixes(a, s0, d0, memory_bytes)
    if verdict in ("communication-bound", "balanced") and d0.get("ddp") and d0["world_size"] > 1:
        comm_recs, rejected = _comm_fixes(a, d0, s0)
        recs += comm_recs
        a.rejected += rejected
    if verdict in ("compute-bound", "host-bound", "balanced"):
        recs += _compute_fixes(a, s0)
        a.rejected.append({"fix": "channels_last / torch.compile",
                           "why": "not measured: they need the model object, which a zero-code run cannot reach"})
    if verdict in ("compute-bound", "communication-bound"):
        a.notes.append(f"no input fix: the step waits for data only {wait:.0%} of the time" +
                       (f", and its workers' CPU on the step's cores adds {cpu_use['data_cpu_share']:.0%}"
                        if cpu_use.get("data_cpu_share") else ""))
    for rec in recs:
        if rec.predicted_speedup >= WORTH_IT:
            a.recommendations.append(rec)
        else:
            a.rejected.append(_as_rejected(rec, f"predicted x{rec.predicted_speedup:.2f}: not worth it"))
    rerank(a)
    return a


def usable_cores(cpu: dict) -> int:
    """The whole cores the job may run on: its affinity, capped by the cgroup quota and the cores its
    measured window saw (at least 1)."""
    caps = [x for x in (cpu.get("affinity"), cpu.get("quota"), cpu.get("window_cores")) if x]
    return max(1, math.floor(min(caps))) if caps else MAX_WORKERS


def _dropped(ranks: list[dict]) -> list[dict]:
    """The probes each rank dropped, one entry per probe and reason, with the ranks that dropped it."""
    out: dict[tuple[str, str], dict] = {}
    for d in ranks:
        for x in d.get("dropped", []):
            out.setdefault((x["probe"], x["why"]), {"probe": x["probe"], "why": x["why"], "ranks": []})["ranks"].append(
                d["rank"])
    return list(out.values())


def _as_rejected(rec: Recommendation, why: str) -> dict:
    return {"fix": rec.fix, "why": why, "basis": rec.basis, "how": rec.how, "predicted_speedup": rec.predicted_speedup,
            "apply": rec.apply, "step_rate_factor": rec.step_rate_factor, "changes_math": rec.changes_math,
            "verified_speedup": rec.verified_speedup, "verified_step_s": rec.verified_step_s, "bound": rec.bound,
            "verification": rec.verification}


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
            a.rejected.append(_as_rejected(rec, f"verified x{rec.verified_speedup:.2f} (predicted "
                                                f"x{rec.predicted_speedup:.2f}): "
                                                f"{'slower' if rec.verified_speedup < 1 else 'not worth it'}"))
        else:
            keep.append(rec)
    still = []
    for r in a.rejected:
        v = r.get("verified_speedup")
        if (_decides(v, r.get("verification")) and v >= WORTH_IT and r.get("predicted_speedup") is not None
                and "verified x" not in r["why"]):
            keep.append(Recommendation(fix=r["fix"], how=r.get("how", ""), predicted_speedup=r["predicted_speedup"],
                                       basis=r.get("basis", ""), changes_math=r.get("changes_math", False),
                                       apply=r.get("apply"), step_rate_factor=r.get("step_rate_factor", 1.0),
                                       verified_speedup=v, verified_step_s=r.get("verified_step_s"),
                                       bound=r.get("bound"), promoted=True, verification=r.get("verification")))
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
