"""The echo sweep's slow source at a given R: the step time now (``current_step_time``),
the link that makes reading a batch take R steps (``source_for``), and the loader
configuration that trains fastest under it without echoing (``best_loader``).

Used by ``hasten.recipes.echo.sweep`` and ``hasten.recipes.echo.target``. Changes the
training math: no.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from hasten.recipes.echo.budget import train_budget
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.data import IdentityStore, MemoryData, Source, fresh_keys
from hasten.stream.slow_storage import SlowStorage
from hasten.timing import interleaved


def current_step_time(cfg: SweepConfig, data: MemoryData, steps: int = 16) -> float:
    """Seconds per training step now: a short run of the real loop without evaluation.
    On a shared machine the step time drifts with other jobs' load; each timed run
    sets its link from this, so that its R is about the one asked for."""
    probe = train_budget(replace(cfg, eval_points=()), data, RunSpec(steps=steps), final_eval=False)
    return probe["step_time_s"]


def source_for(cfg: SweepConfig, data: MemoryData, ratio: float, step_s: float) -> Source:
    """The link bandwidth that makes reading one batch take ``ratio`` step times."""
    batch_bytes = cfg.batch_size * float(np.mean(data.wire_bytes))
    return Source(cfg.latency_s, batch_bytes / (ratio * step_s), cfg.request_examples)


def best_loader(cfg: SweepConfig, data: MemoryData, source: Source, step_s: float, batches: int = 8,
                seed: int = 0) -> tuple[Source, list[dict]]:
    """The fastest (in_flight, prefetch) for training without echoing under ``source``:
    each candidate reads ``batches`` batches while a consumer spends ``step_s`` per
    batch (a sleep: no CPU taken from the other candidates). Ties within 2% go to
    the smaller configuration. Returns the chosen source and every measurement."""
    n = len(data.train)
    wire = np.concatenate([data.wire_bytes] * (1 + batches * cfg.batch_size // n + 1))  # keys of later epochs
    trials = []
    grid = [(k, p) for k in cfg.in_flight_grid for p in cfg.prefetch_grid]
    for _, (k, p) in interleaved(grid, 1, seed):
        candidate = replace(source, in_flight=k, prefetch=p)
        storage = SlowStorage(IdentityStore(), latency_s=candidate.latency_s,
                              link_bytes_per_s=candidate.link_bytes_per_s, size_of=lambda part: int(wire[part].sum()))
        keys = fresh_keys(n, seed, storage, candidate)
        t0 = time.perf_counter()
        for i in range(1, batches * cfg.batch_size + 1):
            next(keys)
            if i % cfg.batch_size == 0:
                time.sleep(step_s)
        elapsed = time.perf_counter() - t0
        keys.close()
        trials.append({"in_flight": k, "prefetch": p, "s_per_batch": elapsed / batches})
    fastest = min(t["s_per_batch"] for t in trials)
    good = [t for t in trials if t["s_per_batch"] <= 1.02 * fastest]
    pick = min(good, key=lambda t: (t["in_flight"] + t["prefetch"], t["s_per_batch"]))
    return replace(source, in_flight=pick["in_flight"], prefetch=pick["prefetch"]), trials
