"""One echo comparison, as ``hasten echo`` runs it: no echoing against a configured
echoing, both behind one storage delay set from the measured step time, each run to
the target through the streaming pipeline (``hasten.recipes.echo.run``), interleaved.

Changes the training math: yes for the echoed runs (see hasten.echo.stages).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable

import torch

from hasten.errors import ConfigError
from hasten.progress import progress
from hasten.recipes.echo.report import summarize
from hasten.recipes.echo.run import EchoRunConfig, EvalSet, measure_step_time, train_to_target
from hasten.timing import interleaved


@dataclass(frozen=True)
class ComparisonConfig:
    """No echoing against ``base``'s echoing, both behind one storage delay, each run to
    ``base.target`` through the streaming pipeline (``hasten.recipes.echo.run``).
    ``upstream_ratio``: set the delay to R step times per batch (the step time measured
    first); None keeps ``base.upstream_delay_s``."""
    base: EchoRunConfig
    repeats: int = 1  # runs (seeds 0 .. repeats-1) per configuration
    upstream_ratio: float | None = 4.0

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1; got {self.repeats}")
        if self.upstream_ratio is not None and not (math.isfinite(self.upstream_ratio) and self.upstream_ratio >= 0):
            raise ConfigError(f"upstream ratio must be >= 0; got {self.upstream_ratio}")


def comparison_jobs(base: EchoRunConfig, step_s: float, upstream_ratio: float | None) -> list[tuple[str, EchoRunConfig]]:
    """(group, config): no echoing, then ``base``'s echoing (unless it is none), behind one storage delay."""
    if upstream_ratio is not None:
        base = replace(base, upstream_delay_s=upstream_ratio * step_s / base.batch_size)
    group = f"delay={base.upstream_delay_s * 1e3:.3f}ms"
    jobs = [(group, replace(base, echo=1.0))]
    if base.echo != 1.0:
        jobs.append((group, base))
    return jobs


def compare(cfg: ComparisonConfig, *, log: Callable[..., None] | None = None) -> dict:
    """Every comparison job ``cfg.repeats`` times, interleaved; the JSON-able report.

    ``log(**record)`` receives each evaluation, each finished run (``event="run"``)
    and the step time the delay derives from (``event="step_time"``).
    """
    log = log or (lambda **record: None)
    base = cfg.base
    eval_set = EvalSet.of(base.data, base.image_size, base.device)
    step_s = measure_step_time(base, eval_set=eval_set)
    log(event="step_time", step_time_s=step_s, source="a 40-step run without delay")
    jobs = comparison_jobs(base, step_s, cfg.upstream_ratio)
    entries = []
    for seed, (group, job) in progress(list(interleaved(jobs, cfg.repeats, seed=0)), desc="echo runs",
                                            unit="run"):
        run_cfg = replace(job, seed=seed)
        result = train_to_target(run_cfg, eval_set=eval_set,
                                 log=lambda **r: log(group=group, echo_cfg=str(run_cfg.echo), **r))
        result["group"] = group
        entries.append(result)
        log(event="run", **{k: v for k, v in result.items() if k != "config"})
    for e in entries:  # R is measured by the run without echoing of the same seed
        if e["echo_factor"] != 1.0:
            b = next((x for x in entries if x["seed"] == e["seed"] and x["echo_factor"] == 1.0), None)
            e["upstream_ratio"] = b["upstream_ratio"] if b else None
    return {"torch": torch.__version__, "step_time_s": step_s, "repeats": cfg.repeats, "config": asdict(cfg),
            "baseline": [e for e in entries if e["echo_factor"] == 1.0], "results": entries,
            "summary": summarize(entries)}
