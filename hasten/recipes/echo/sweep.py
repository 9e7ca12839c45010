"""Data echoing in the paper's regime (Choi et al., 2019, arXiv:1907.05550).

The paper trains to completion: a fixed budget with a learning-rate schedule, a
target that the baseline reliably reaches (here: the mean minus one standard
deviation of its accuracy over seeds at the end of its budget), hyperparameters
tuned per setting, and data read over a network. This module stages that on a
CPU:

- **Data.** A fixed class-balanced subset of CIFAR-10-JPEG, decoded once at the
  training resolution into host memory: what the paper's pipeline holds after
  reading and decoding. The echo stage sits after that point, so nothing of the
  math is missing; the upstream's *time* comes from the slow source.
- **A slow source.** ``hasten.stream.slow_storage.SlowStorage``: per-request
  latency (a request is a byte-range read of ``request_examples`` JPEGs), many
  requests in flight, one shared link whose bandwidth sets R. Sleep-based, so any
  R costs no CPU. R is measured as the baseline's (wait + step) / step.
- **A tuned baseline.** No echoing, with the loader configuration (requests in
  flight, records read ahead) that trains fastest under that source, found by a
  search; the learning rate tuned on a grid.
- **Echoing tuned as the paper did.** The learning rate (and, when no grid value
  reaches the target, a longer budget in steps) tuned per variant and factor.
- **The comparisons.** (a) Fresh examples to the target against e for
  example-before, example-after and batch echoing (no delay: counts do not depend
  on speed); the shuffle-buffer size against the within-batch duplicate share and
  its cost in steps; (b) wall time to the target at R of about 2, 4, 6 and 8 for
  fixed factors and AutoEcho, interleaved over seeds (``hasten.timing.interleaved``);
  AutoEcho against no echoing where the source is faster than the step (R < 1);
  final accuracy on the full test set at the full budget with and without echoing.

The data, the slow source's description and the input pipeline are in
``hasten.recipes.echo.data``, the sweep's configuration (``SweepConfig``, ``RunSpec``)
in ``hasten.recipes.echo.config``. Every run is ``hasten.recipes.echo.budget.train_budget``;
the loader search is ``hasten.recipes.echo.loader_search``, the tuning
``hasten.recipes.echo.tune`` and the journal that lets a stopped sweep resume
``hasten.recipes.echo.journal`` (their names are handed on here).

Changes the training math: yes with echoing (repeated examples); e = 1 is plain
training.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, replace
from typing import Callable

import numpy as np
import torch

from hasten.echo import expected_duplicate_rate
from hasten.echo.auto import REPEAT_VALUE
from hasten.progress import progress
from hasten.recipes.echo.budget import lr_at, sweep_model, train_budget  # noqa: F401 (hasten.recipes.echo.sweep's names)
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.data import MemoryData, Source, load_data  # noqa: F401
from hasten.recipes.echo.journal import (add_journal_arguments, auto_settings, journal_settings,  # noqa: F401
                                         open_journal)
from hasten.recipes.echo.loader_search import best_loader, current_step_time, source_for
from hasten.recipes.echo.report import goals, summarize
from hasten.recipes.echo.tune import _brief, _rank, tune  # noqa: F401
from hasten.rundir import RunJournal
from hasten.timing import interleaved


def run(cfg: SweepConfig, *, log: Callable[..., None] | None = None, journal: RunJournal | None = None) -> dict:
    """Everything in the module docstring; the JSON-able report.

    ``journal``: a :class:`hasten.rundir.RunJournal` made with ``asdict(cfg)``; each
    training run and loader search is written to it as it finishes, and a rerun
    takes the finished ones from it (the sweep resumes where it stopped)."""
    log = log or (lambda **record: None)
    journal = journal if journal is not None else RunJournal(None, asdict(cfg))
    t_start = time.perf_counter()
    data = load_data(cfg)

    def budget(phase: str, spec: RunSpec, **kw) -> dict:
        """One training run, through the journal: the key is what decides its result."""
        key = json.dumps({"phase": phase, "spec": asdict(spec), **kw, **auto_settings(cfg, spec)}, sort_keys=True)
        return journal.run(key, lambda: train_budget(cfg, data, spec, **kw))
    entries: list[dict] = []
    timed_jobs = _timed_jobs(cfg)
    other = [(v, e) for v in ("example-after", "batch") for e in cfg.other_factors]
    total = (len(cfg.lr_grid) + cfg.seeds - 1 + (len(cfg.factors) + len(other)) * (len(cfg.lr_grid) + cfg.seeds - 1)
             + len(cfg.buffer_sizes) + 1 + len(timed_jobs) * cfg.seeds)
    bar = progress(total=total, desc="echo sweep runs", unit="run")

    def record(result: dict, group: str) -> dict:
        result["group"] = group
        entries.append(result)
        log(event="run", **_brief(result))
        bar.update(1)
        return result

    # (1) The baseline: learning rate tuned on seed 0 by end accuracy, then every seed.
    base_spec = RunSpec(lr=cfg.lr, steps=cfg.steps, e_max=cfg.e_max)
    trials = [budget("baseline", replace(base_spec, lr=cfg.lr * m)) for m in cfg.lr_grid]
    for t in trials:
        bar.update(1)
        log(event="tune", **_brief(t))
    best = max(trials, key=lambda t: t["end_accuracy"])
    base_spec = replace(base_spec, lr=best["lr"])
    record(best, "a")
    for seed in range(1, cfg.seeds):
        record(budget("baseline", replace(base_spec, seed=seed)), "a")
    ends = [e["end_accuracy"] for e in entries]
    target = float(np.mean(ends) - (np.std(ends, ddof=1) if len(ends) > 1 else 0.0))
    for e in entries:  # the baseline's own crossings, now that the target is known
        _cross(e, target)
    step_s = float(np.median([t["step_time_s"] for t in trials + entries]))
    log(event="target", target=target, step_time_s=step_s, baseline_lr=base_spec.lr)
    tuning = {"baseline": {"lr": base_spec.lr, "steps": base_spec.steps,
                           "trials": [_trial(t) for t in trials]}}

    # (2) Echo settings, tuned on seed 0 (the tuning run counts as that seed), then every seed.
    tuned: dict[tuple[str, float], RunSpec] = {}
    for variant, e in [("example-before", e) for e in cfg.factors] + other:
        spec, trials = tune(cfg, data, replace(base_spec, variant=variant, echo=e), target, log, budget)
        bar.update(len(cfg.lr_grid) - 1)
        tuned[(variant, e)] = spec
        tuning[f"{variant} e={e:g}"] = {"lr": spec.lr, "steps": spec.steps, "trials": [_trial(t) for t in trials]}
        record(next(t for t in trials if t["lr"] == spec.lr and t["budget_steps"] == spec.steps), "a")
        for seed in range(1, cfg.seeds):
            record(budget("seeds", replace(spec, seed=seed), target=target), "a")

    # (3) The shuffle buffer: duplicates and their cost at one factor, seed 0.
    spec = tuned.get(("example-before", cfg.buffer_factor)) or replace(base_spec, echo=cfg.buffer_factor)
    for size in (*cfg.buffer_sizes, None):
        result = budget("buffer", replace(spec, shuffle_buffer=size, seed=0), target=target)
        result["predicted_duplicate_rate"] = expected_duplicate_rate(result["shuffle_buffer"], spec.echo,
                                                                     cfg.batch_size)
        record(result, "buffer")

    # (4) The slow source at each R, with the best loader without echoing; timed runs interleaved.
    loaders, loader_report = {}, {}
    for ratio in (*cfg.ratios, cfg.not_bound_ratio):
        # The loader search runs once per R; each timed run then sets the link from its
        # own step-time measurement (current_step_time), keeping the chosen loader.
        def search(ratio=ratio) -> dict:
            chosen, trials = best_loader(cfg, data, source_for(cfg, data, ratio, step_s), step_s)
            return {"chosen": asdict(chosen), "trials": trials}
        found = journal.run(f"loader R={ratio!r}", search)
        src, trials = Source(**found["chosen"]), found["trials"]
        loaders[ratio] = src
        loader_report[f"R={ratio:g}"] = {"chosen": asdict(src), "trials": trials}
        log(event="loader", ratio=ratio, chosen=asdict(src), trials=trials)
    for job, (seed_idx, (ratio, echo)) in enumerate(interleaved(timed_jobs, cfg.seeds, seed=0)):
        if echo == 1.0:
            spec = base_spec
        elif echo == "auto":
            spec = replace(base_spec, echo="auto")  # AutoEcho: the baseline's settings, no tuning of its own
        else:
            spec = tuned[("example-before", echo)]
        group = f"R={ratio:g}" if ratio >= 1 else "R<1"

        def timed(spec=spec, ratio=ratio, seed_idx=seed_idx) -> dict:
            now = current_step_time(cfg, data)
            source = replace(loaders[ratio], link_bytes_per_s=source_for(cfg, data, ratio, now).link_bytes_per_s)
            result = train_budget(cfg, data, replace(spec, seed=seed_idx), source=source, target=target,
                                  stop_at_target=True)
            return {**result, "nominal_ratio": ratio, "calibration_step_s": now}
        # The link is set from the step time measured just before the run, so the key holds R, not the link.
        # The job's place in the interleaved order too: two jobs with the same settings are two runs.
        key = json.dumps({"phase": f"timed R={ratio!r}", "job": job, "spec": asdict(replace(spec, seed=seed_idx)),
                          "target": target, **auto_settings(cfg, spec)}, sort_keys=True)
        record(journal.run(key, timed), group)
    bar.close()
    # R of an echoed run is the one measured without echoing at the same R and seed.
    for e in entries:
        if e["group"].startswith("R") and e["echo_factor"] != 1.0:
            base_run = next((b for b in entries if b["group"] == e["group"] and b["seed"] == e["seed"]
                             and b["echo_factor"] == 1.0), None)
            e["upstream_ratio"] = base_run["upstream_ratio"] if base_run else None
    rows = summarize(entries)
    return {
        "dataset": "CIFAR-10-JPEG" if "cifar10-jpeg" in os.path.basename(cfg.data) else cfg.data,
        "torch": torch.__version__, "config": asdict(cfg), "budget_steps": cfg.steps, "target": target,
        "step_time_s": step_s, "tuning": tuning, "loader": loader_report,
        "autoecho": {"e_max": cfg.e_max, "repeat_value_prior": REPEAT_VALUE,
                     "value_measured_every": cfg.value_every},  # 0: the prior throughout
        "baseline": [e for e in entries if e["echo_factor"] == 1.0],
        "results": entries, "summary": rows, "goals": goals(rows, cfg.ratios),
        "sweep_wall_s": time.perf_counter() - t_start,
        "journal": {"path": None if journal.path is None else str(journal.path), "runs": len(journal),
                    "resumed": journal.resumed, "torn_lines": journal.torn},
    }


def _timed_jobs(cfg: SweepConfig) -> list[tuple[float, float | str]]:
    """(R, e) pairs: e = 1, the fixed factors from R/2 to 2R, AutoEcho; and e = 1 vs AutoEcho at R < 1."""
    jobs = []
    for ratio in cfg.ratios:
        # Fixed factors from R / 2 to 2R: far below R they leave most of the waiting, far above
        # they only add steps (e = 2 at R = 8 would be the slowest run of the sweep).
        jobs += [(ratio, 1.0)] + [(ratio, e) for e in cfg.factors if ratio / 2 <= e <= 2 * ratio] + [(ratio, "auto")]
    return jobs + [(cfg.not_bound_ratio, 1.0), (cfg.not_bound_ratio, "auto")]


def _cross(entry: dict, target: float) -> None:
    """Fill a run's to-target counts from its evaluation curve once the target is known."""
    hit = next((point for point in entry["curve"] if point[1] >= target), None)
    entry["target"] = target
    entry["reached_target"] = hit is not None
    if hit is not None:
        entry["steps_to_target"], entry["fresh_examples_to_target"] = hit[0], hit[2]


def _trial(t: dict) -> dict:
    return {k: t[k] for k in ("lr", "budget_steps", "reached_target", "fresh_examples_to_target",
                              "steps_to_target", "end_accuracy")}
