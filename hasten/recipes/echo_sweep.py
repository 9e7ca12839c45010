"""Data echoing experiments (Choi et al., 2019): one comparison, or the paper's two sweeps.

Every run is ``hasten.recipes.echo.train_to_target``: real training through the
streaming pipeline behind simulated slow storage, to a target accuracy.

- Comparison (default): no echoing against the requested factor and variant, both
  behind the same storage delay (given, or R step times per batch with R measured
  from this machine's step time).
- Sweep: the paper's two findings. (a) Fresh examples to the target against e for
  each variant (no storage delay: counts do not depend on speed). (b) Wall-time
  speedup against e at R about 2, 4 and 6, with AutoEcho beside the fixed factors,
  and AutoEcho against no echoing where the step outlasts the pipeline (R < 1: it
  should switch itself off and cost nothing).

Runs are interleaved over ``repeats`` seeds so that a slow spell of a shared
machine hits every configuration alike. ``run(config)`` returns the JSON-able
report: every run's measurements and, per configuration, their mean and spread
with the speedup over no echoing in the same group.

Changes the training math: yes with echoing, as hasten.recipes.echo says.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np
import torch

from hasten.echo import VARIANTS
from hasten.errors import ConfigError
from hasten.progress import progress
from hasten.recipes.echo import EchoRunConfig, EvalSet, measure_step_time, train_to_target
from hasten.stream.records import open_records

SWEEP_FACTORS = (2.0, 4.0, 6.0)
SWEEP_RATIOS = (2.0, 4.0, 6.0)
NOT_INPUT_BOUND_WIDTH = 48  # R < 1 group: a 3x wider SmallNet, whose step outlasts decoding a batch
SUMMARY_FIELDS = ("fresh_examples_to_target", "steps_to_target", "wall_time_to_target_s", "final_accuracy",
                  "idle_fraction", "upstream_ratio", "storage_ratio", "mean_echo_factor")


@dataclass(frozen=True)
class EchoSweepConfig:
    """``base``: the run every configuration starts from (data, device, hyperparameters,
    and for the comparison the echo factor, variant and storage delay).
    ``upstream_ratio``: for the comparison, set the delay to R step times per batch;
    None keeps ``base.upstream_delay_s``. The sweep sets its own delays."""
    base: EchoRunConfig
    sweep: bool = False
    repeats: int = 1  # runs (seeds 0 .. repeats-1) per configuration
    upstream_ratio: float | None = 4.0

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1; got {self.repeats}")
        if self.upstream_ratio is not None and not (math.isfinite(self.upstream_ratio) and self.upstream_ratio >= 0):
            raise ConfigError(f"upstream ratio must be >= 0; got {self.upstream_ratio}")


@dataclass(frozen=True)
class EchoJob:
    group: str  # runs compared with each other: the same storage delay and network
    config: EchoRunConfig


# ----------------------------------------------------------------------------- Plans
def comparison_jobs(base: EchoRunConfig, step_s: float, upstream_ratio: float | None) -> list[EchoJob]:
    """No echoing, then ``base``'s echoing (unless it is none), behind one storage delay."""
    if upstream_ratio is not None:
        base = replace(base, upstream_delay_s=upstream_ratio * step_s / base.batch_size)
    group = f"delay={base.upstream_delay_s * 1e3:.3f}ms"
    jobs = [EchoJob(group, replace(base, echo=1.0))]
    if base.echo != 1.0:
        jobs.append(EchoJob(group, base))
    return jobs


def sweep_a_jobs(base: EchoRunConfig) -> list[EchoJob]:
    """(a): e = 1 and each variant at each factor, without storage delay."""
    jobs = [EchoJob("a", replace(base, echo=1.0, upstream_delay_s=0.0))]
    for variant in VARIANTS:
        jobs += [EchoJob("a", replace(base, variant=variant, echo=e, upstream_delay_s=0.0)) for e in SWEEP_FACTORS]
    return jobs


def sweep_b_jobs(base: EchoRunConfig, step_s: float) -> list[EchoJob]:
    """(b): e = 1, each factor and AutoEcho at each R (the delay is R step times per
    batch); e = 1 and AutoEcho at R < 1 (no delay, a network whose step outlasts decoding)."""
    jobs = []
    for ratio in SWEEP_RATIOS:
        delay = ratio * step_s / base.batch_size
        jobs += [EchoJob(f"R={ratio:g}", replace(base, variant="example-before", echo=e, upstream_delay_s=delay))
                 for e in (1.0, *SWEEP_FACTORS, "auto")]
    jobs += [EchoJob("R<1", replace(base, variant="example-before", echo=e, upstream_delay_s=0.0,
                                    width=NOT_INPUT_BOUND_WIDTH))
             for e in (1.0, "auto")]
    return jobs


# ----------------------------------------------------------------------------- Running
def run(cfg: EchoSweepConfig, *, log: Callable[..., None] | None = None) -> dict:
    """Every job of the comparison or the sweep, ``cfg.repeats`` times interleaved; the report.

    ``log(**record)`` receives each evaluation (with its group and echo factor), each
    finished run (``event="run"``) and the step time the delays derive from
    (``event="step_time"``).
    """
    log = log or (lambda **record: None)
    base = cfg.base
    eval_set = EvalSet(open_records(base.data, "test"), base.image_size, base.device)
    entries: list[dict] = []

    def run_jobs(jobs: list[EchoJob], seed: int) -> None:
        for job in jobs:
            run_cfg = replace(job.config, seed=seed)
            result = train_to_target(run_cfg, eval_set=eval_set,
                                     log=lambda **r: log(group=job.group, echo_cfg=str(run_cfg.echo), **r))
            result["group"] = job.group
            if run_cfg.echo != 1.0:
                # R is measured by the run without echoing of the same group and seed (run first).
                base_run = next((e for e in reversed(entries) if e["group"] == job.group and e["seed"] == seed
                                 and e["echo_factor"] == 1.0), None)
                result["upstream_ratio"] = base_run["upstream_ratio"] if base_run else None
            entries.append(result)
            log(event="run", **{k: v for k, v in result.items() if k != "config"})
            bar.update(1)

    if cfg.sweep:
        jobs_a = sweep_a_jobs(base)
        bar = progress(total=(len(jobs_a) + len(sweep_b_jobs(base, 0.0))) * cfg.repeats, desc="echo runs")
        for seed in range(cfg.repeats):
            run_jobs(jobs_a, seed)
            if seed == 0:
                # The delay for R comes from the step times of the (a) runs just made: hundreds
                # of steps under the same load, steadier than a separate short measurement.
                step_s = float(np.median([e["step_time_s"] for e in entries]))
                jobs_b = sweep_b_jobs(base, step_s)
                log(event="step_time", step_time_s=step_s, source="median of the (a) runs")
            run_jobs(jobs_b, seed)
    else:
        step_s = measure_step_time(base, eval_set=eval_set)
        log(event="step_time", step_time_s=step_s, source="a 40-step run without delay")
        jobs = comparison_jobs(base, step_s, cfg.upstream_ratio)
        bar = progress(total=len(jobs) * cfg.repeats, desc="echo runs")
        for seed in range(cfg.repeats):
            run_jobs(jobs, seed)
    bar.close()
    return {
        "torch": torch.__version__,
        "dataset": "CIFAR-10-JPEG" if "cifar10-jpeg" in os.path.basename(base.data) else base.data,
        "step_time_s": step_s,
        "repeats": cfg.repeats,
        "config": asdict(cfg),
        "baseline": [e for e in entries if e["echo_factor"] == 1.0],
        "results": entries,
        "summary": summarize(entries),
    }


# ----------------------------------------------------------------------------- Statistics
def stats(values) -> dict:
    """Mean, sample standard deviation (0 for one value) and count, ignoring None."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
            "n": len(vals)}


def _config_key(entry: dict) -> tuple[str, str, str]:
    """(group, variant, echo factor); no echoing is one configuration whatever its variant."""
    echo = entry["echo_factor"]
    return entry["group"], entry["variant"] if echo != 1.0 else "none", str(echo)


def summarize(entries: list[dict]) -> list[dict]:
    """Mean and spread per (group, variant, echo), with speedups over e = 1 of the same group."""
    runs_by_key: dict[tuple[str, str, str], list[dict]] = {}
    for e in entries:
        runs_by_key.setdefault(_config_key(e), []).append(e)
    rows = []
    for (group, variant, echo), runs in runs_by_key.items():
        row = {"group": group, "variant": variant, "echo_factor": echo, "n": len(runs),
               "reached": sum(r["reached_target"] for r in runs)}
        row.update({field: stats([r[field] for r in runs]) for field in SUMMARY_FIELDS})
        rows.append(row)
    for row in rows:
        base = next(r for r in rows if r["group"] == row["group"] and r["echo_factor"] == "1.0")
        b, w = base["wall_time_to_target_s"]["mean"], row["wall_time_to_target_s"]["mean"]
        row["speedup"] = b / w if b and w else None
        bf, f = base["fresh_examples_to_target"]["mean"], row["fresh_examples_to_target"]["mean"]
        row["fresh_ratio"] = f / bf if bf and f else None
    return rows


def _fmt(stat: dict, scale: float = 1.0, digits: int = 0) -> str:
    if stat["mean"] is None:
        return "-"
    s = f"{stat['mean'] * scale:.{digits}f}"
    if stat["n"] > 1:
        s += f"±{stat['std'] * scale:.{digits}f}"
    return s


def format_table(rows: list[dict]) -> str:
    g = max([5] + [len(r["group"]) for r in rows])
    head = (f"{'group':{g}} {'variant':15} {'e':>5} {'n':>2} {'R meas':>8} {'fresh':>12} {'steps':>10} "
            f"{'wall s':>11} {'speedup':>7} {'final acc':>11} {'idle':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        e = r["echo_factor"] if r["echo_factor"] != "auto" else f"a{r['mean_echo_factor']['mean']:.1f}"
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        lines.append(
            f"{r['group']:{g}} {r['variant']:15} {e:>5} {r['n']:>2} {_fmt(r['upstream_ratio'], 1, 1):>8} "
            f"{_fmt(r['fresh_examples_to_target']):>12} {_fmt(r['steps_to_target']):>10} "
            f"{_fmt(r['wall_time_to_target_s'], 1, 1):>11} {speedup:>7} "
            f"{_fmt(r['final_accuracy'], 100, 1):>11} {_fmt(r['idle_fraction'], 100, 0):>5}"
        )
    return "\n".join(lines)


def write_plots(rows: list[dict], directory: str | os.PathLike) -> list[str]:
    """The sweep's two PNG plots (hasten.plots) in ``directory``; their paths."""
    from hasten.plots import plot_echo_fresh_examples, plot_echo_speedup

    return [str(plot_echo_fresh_examples(rows, os.path.join(directory, "echo_fresh_examples.png"))),
            str(plot_echo_speedup(rows, os.path.join(directory, "echo_speedup.png")))]
