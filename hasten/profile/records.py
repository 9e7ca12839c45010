"""The records the profile's analysis passes along: a rank's measured summary, a fix, the analysis.

Below every module that fills or reads them (:mod:`hasten.profile.rank_summary`,
:mod:`hasten.profile.attribution`, the fix modules, :mod:`hasten.profile.verdict`,
:mod:`hasten.profile.report`), so that none of those imports another to name a type.

Changes the training math: no (records only).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

INPUT, COMPUTE, COMMUNICATION = "input", "compute", "communication"  # the kinds of fix (Recommendation.kind)


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
    bound: float | None = None  # the most the measurements allow (Amdahl): set by ranking.admit
    promoted: bool = False  # rejected by its prediction, recommended by its verification
    verification: dict | None = None  # --verify's measurement: interval, n, cost, whether it decides (verify.py)
    low: float | None = None  # the prediction at the low end of the data share's interval (rerank)
    kind: str = INPUT  # what the fix removes time from: INPUT, COMPUTE or COMMUNICATION
    math_note: str | None = None  # how it changes the training math, where that is not plain from its name
    unpredicted: str | None = None  # why no speed-up is predicted (ranking.admit lists it as not recommended)
    below_because: str | None = None  # why the prediction is below WORTH_IT, said where ranking.admit rejects it

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
    # What making the data free could gain at most (Amdahl, 1 / (1 - share)), at the share and its interval's ends
    data_gain: tuple[float, float, float] = (1.0, 1.0, 1.0)
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


@dataclass(frozen=True)
class RankSummary:
    """One rank's measured steps and probes, reduced to per-step figures (:mod:`hasten.profile.rank_summary`)."""
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
    handout_s: float | None = None  # a batch kept in a fixed set, handed out again (probes.handout)
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
    queued_steps: tuple[float, ...] = ()  # ... and the loop thread's run-queue wait in its work (where read)
    window_steps: int = 0  # every step of the measured window, left out or not (the window's /proc totals)
    own_work_s: float | None = None  # the steps' work less the loop thread's run-queue waits (None: not measured)
