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
in ``hasten.recipes.echo.config``. Every run is ``train_budget``. Evaluations (a fixed
set of ``test_images`` test images at ``eval_points`` fractions of the budget) stop the
run's clock, the slow source's clock and AutoEcho's measurement.

Changes the training math: yes with echoing (repeated examples); e = 1 is plain
training.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from hasten.data.host_augment import keyed_crop_flip
from hasten.data.normalize import normalize
from hasten.echo import AutoEcho, EchoCounters, auto_shuffle_buffer, default_shuffle_buffer, expected_duplicate_rate
from hasten.echo.auto import LATER_REPEAT_VALUE, REPEAT_DECAY, REPEAT_VALUE, rule_digest
from hasten.echo.repeat_value import gradient_dots, observe_repeat_losses
from hasten.echo.stages import check_variant
from hasten.errors import DataError
from hasten.nn.tta import evaluate
from hasten.progress import progress
from hasten.recipes.echo.clock import ModelledClocks
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.data import (IdentityStore, MemoryData, Source, fresh_keys, load_data, pipeline,
                                      test_batches)
from hasten.recipes.echo.report import goals, summarize
from hasten.recipes.echo.run import MEAN, STD, SmallNet
from hasten.recipes.echo.shard_source import ShardSource
from hasten.rundir import RunJournal
from hasten.stream.echo_stage import EchoStage
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.slow_storage import SlowStorage
from hasten.timing import Stopwatch, interleaved


# ----------------------------------------------------------------------------- One run
def lr_at(step: float, steps: int, peak: float, warmup: float) -> float:
    """Linear warm-up over ``warmup`` of the budget, then linear decay to 0 at ``steps``.
    ``step`` may be fractional: AutoEcho's runs pass their progress in effective examples
    times ``steps`` (``hasten.echo.auto``), which is the step count when e = 1."""
    w = max(1, round(warmup * steps))
    return peak * (step + 1) / w if step < w else peak * max(0.0, (steps - step) / max(1, steps - w))


def train_budget(cfg: SweepConfig, data: MemoryData, spec: RunSpec, *, source: Source | None = None,
                 target: float | None = None, stop_at_target: bool = False, final_eval: bool = True,
                 clocks: ModelledClocks | None = None, upstream: ShardSource | None = None,
                 stream: Callable[[int], ShardLoader] | None = None, log=None) -> dict:
    """Train ``spec.steps`` steps with the schedule; evaluate at ``cfg.eval_points``.

    With ``target``: the first evaluation at or above it gives the fresh examples,
    steps and wall seconds to the target; ``stop_at_target`` ends the run there
    (timed runs), otherwise it runs the full budget and reports the final accuracy
    on the whole test set.

    With AutoEcho (``spec.echo == "auto"``) the budget is ``spec.steps`` x batch
    *effective examples* (``AutoEcho.count``/``progress``): the schedule, the
    evaluation points and the end follow its progress, so the run takes as many
    steps as its repeats' value asks (more than ``spec.steps`` when it echoes).

    With ``clocks`` (``hasten.recipes.echo.clock``; instead of ``source``): fresh examples
    come at full speed and each clock adds the waits of its modelled upstream to the
    measured time; the result's ``clock_*`` lists hold each clock's wall time, waits and
    wall time to the target. AutoEcho is told the first clock's waits.

    With ``upstream`` (``hasten.recipes.echo.shard_source.ShardSource``; instead of
    both): fresh examples are read from shards in a store, over whatever link is
    between, and decoded as they arrive; every second is measured, nothing modelled.

    With ``stream`` (instead of all three): the whole input pipeline is hasten's own, as a
    user's loop has it: ``stream(seed)`` gives the run's ``ShardLoader`` (``crop="pad-crop"``,
    ``with_keys=True``), and the run trains on ``EchoStage(loader, e, with_copies=True)``,
    epoch after epoch; the stage reports each batch to AutoEcho and counts the fresh
    examples. Every second is measured.
    """
    check_variant(spec.variant)
    if sum(x is not None for x in (source, clocks, upstream, stream)) > 1:
        raise ValueError("train_budget: a run's upstream is one of a slow source, modelled clocks, a shard "
                         "source or a stream")
    if spec.echo == "auto" and clocks is not None and len(clocks.per_example_s) > 1:
        raise ValueError("train_budget: AutoEcho decides from one clock's waits; give it one clock, not "
                         f"{len(clocks.per_example_s)}")
    dev = torch.device(cfg.device)
    n = len(data.train)
    auto = None
    if spec.echo == "auto":
        auto = AutoEcho(e_max=spec.e_max, interval=4 * cfg.batch_size if spec.variant != "batch" else 4,
                        value_every=cfg.value_every)
    factor = auto if auto is not None else float(spec.echo)
    if spec.variant == "batch" or (auto is None and factor == 1.0):
        buffer = 0  # no copies inside a batch to spread apart
    elif spec.shuffle_buffer is not None:
        buffer = spec.shuffle_buffer
    elif auto is not None:
        buffer = auto_shuffle_buffer(auto, cfg.batch_size)  # grows with e
    else:
        buffer = default_shuffle_buffer(factor, cfg.batch_size)
    storage = None
    if source is not None:
        storage = SlowStorage(IdentityStore(), latency_s=source.latency_s, link_bytes_per_s=source.link_bytes_per_s,
                              size_of=lambda part: int(data.wire_bytes[part % n].sum()))
    torch.manual_seed(spec.seed)
    model = sweep_model(cfg, data).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9, nesterov=True,
                          weight_decay=cfg.weight_decay)
    mean, std = torch.tensor(MEAN, device=dev), torch.tensor(STD, device=dev)
    labels = torch.from_numpy(data.train_labels)
    eval_steps = sorted({min(spec.steps, max(1, round(f * spec.steps))) for f in cfg.eval_points})
    eval_fractions = sorted(set(cfg.eval_points))  # AutoEcho: evaluated when its progress passes these
    # AutoEcho's budget in effective items: the baseline's examples (batches, for batch echoing).
    per_step = 1 if spec.variant == "batch" else cfg.batch_size
    budget = spec.steps * per_step
    # A bound that no schedule reaches: a copy is worth > 0, so e_max x steps is never needed in full.
    max_steps = spec.steps if auto is None else math.ceil(spec.e_max * spec.steps) + 1

    def position() -> float:  # where in the schedule the run is, in the baseline's steps
        return steps if auto is None else min(auto.progress(budget), 1.0) * spec.steps
    counters = EchoCounters()
    waiting, stepping = Stopwatch(), Stopwatch()
    value_rng = torch.Generator().manual_seed(spec.seed)

    def smoothed_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, y, label_smoothing=cfg.label_smoothing)
    steps, factors, reached, curve = 0, [], None, []
    stage = None
    if stream is not None:
        # (AutoEcho's buffer follows e inside the stage, as auto_shuffle_buffer does here.)
        stage = EchoStage(stream(spec.seed), factor, variant=spec.variant, with_copies=True,
                          shuffle_buffer=None if callable(buffer) else buffer)
        counters = stage.counters
        batches = _epochs(stage)
    else:
        fresh = upstream.keys(spec.seed) if upstream is not None else fresh_keys(n, spec.seed, storage, source)
        train_images = upstream.images if upstream is not None else data.train  # (the arrived pixels)
        batches = pipeline(clocks.items(fresh) if clocks is not None else fresh, spec, factor, buffer,
                           cfg.batch_size, counters, clock=clocks.time if clocks is not None else None)
    clock_reached = None
    if auto is not None and stage is None:
        auto.expect_step_reports()  # the loop reports each step: windows before the first wait for it
    try:
        while steps < max_steps and position() < spec.steps:
            waiting.start()
            before = clocks.waited[0] if clocks is not None else 0.0
            batch = next(batches)
            waited = waiting.stop()
            stepping.start()
            if stage is not None:  # augmented by the stage (example-before) or the loader
                images, y, keys, numbers = batch
                x, y, keys, numbers = normalize(images.to(dev), mean, std), y.to(dev), keys.numpy(), numbers.numpy()
            else:
                keys, copies, numbers = batch
                counters.record_batch(keys.tolist())
                idx = keys % n
                images = keyed_crop_flip(train_images[idx], keys, seed=spec.seed, copies=copies, pad=cfg.pad)
                x = normalize(torch.from_numpy(images).permute(0, 3, 1, 2).to(dev), mean, std)
                y = labels[torch.from_numpy(idx)].to(dev)
            modelled_wait = clocks.waited[0] - before if clocks is not None else 0.0
            for g in opt.param_groups:
                g["lr"] = lr_at(position(), spec.steps, spec.lr, cfg.warmup)
            losses = F.cross_entropy(model(x), y, label_smoothing=cfg.label_smoothing, reduction="none")
            opt.zero_grad(set_to_none=True)
            losses.mean().backward()
            if auto is not None and spec.variant != "batch" and auto.value_due():
                # What a repeat is worth on this task (hasten.echo.repeat_value), at the step's weights.
                dots = gradient_dots(model, smoothed_loss, x, y, torch.from_numpy(numbers), generator=value_rng)
                if dots is not None:
                    auto.report_repeat_gradients(*dots)
            opt.step()
            if auto is not None and spec.variant != "batch":
                observe_repeat_losses(auto, losses, torch.from_numpy(numbers))  # the value of repeats
            stepped = stepping.stop()
            if clocks is not None:
                clocks.advance(waited + stepped)  # the pipeline's own time and the step, both measured
            if auto is not None and stage is None:  # (the stage reports its batches itself)
                auto.record_step(waited + modelled_wait, stepped, len(keys))
                auto.count(per_step)
            steps += 1
            factors.append(auto.factor if auto is not None else float(spec.echo))
            passed = [f for f in eval_fractions if position() >= f * spec.steps]
            eval_fractions = eval_fractions[len(passed):]
            if steps in eval_steps if auto is None else passed:
                with (storage.paused() if storage is not None else nullcontext()), \
                        (auto.paused() if auto is not None else nullcontext()):
                    accuracy = evaluate(model, test_batches(data, cfg.test_images, dev))
                wall = waiting.elapsed + stepping.elapsed
                curve.append((steps, accuracy, counters.fresh_examples, wall, *([list(clocks.now)] if clocks else [])))
                if log is not None:
                    log(step=steps, fresh=counters.fresh_examples, accuracy=accuracy, wall_s=wall, echo=factors[-1])
                if target is not None and reached is None and accuracy >= target:
                    reached = (counters.fresh_examples, steps, wall)
                    clock_reached = list(clocks.now) if clocks is not None else None
                    if stop_at_target:
                        break
    finally:
        batches.close()  # ends the reads in flight (outside the clocks)
        if upstream is not None:
            fresh.close()  # (the stages hold it until they are freed): its reader stops now, not later
    wait_s, step_s = waiting.elapsed, stepping.elapsed
    full = position() >= spec.steps
    measured = source is not None or upstream is not None or stream is not None  # (wall times that mean something)
    return {
        "variant": spec.variant, "echo_factor": spec.echo, "lr": spec.lr, "budget_steps": spec.steps,
        "seed": spec.seed, "shuffle_buffer": buffer if isinstance(buffer, int) else "auto",
        "mean_echo_factor": float(np.mean(factors)) if factors else 1.0,
        "source": asdict(source) if source is not None else None,
        # Without echoing an input-bound loop runs at the upstream's pace: (wait + step) / step is R.
        "upstream_ratio": ((wait_s + step_s) / step_s if spec.echo == 1.0 and measured else None),
        "reached_target": reached is not None, "target": target,
        "fresh_examples_to_target": reached[0] if reached else None,
        "steps_to_target": reached[1] if reached else None,
        "wall_time_to_target_s": reached[2] if reached and measured else None,
        "fresh_examples": counters.fresh_examples, "steps": steps, "wall_time_s": wait_s + step_s,
        "end_accuracy": curve[-1][1] if full and curve else None,
        "final_accuracy": evaluate(model, test_batches(data, None, dev)) if full and final_eval else None,
        "curve": curve, "idle_fraction": wait_s / (wait_s + step_s) if steps else 0.0,
        "step_time_s": step_s / max(steps, 1), "duplicate_rate": counters.duplicate_rate,
        "autoecho_cap": auto.cap if auto is not None else None,
        "effective_examples": auto.effective_examples if auto is not None else None,
        "repeat_value_measured": auto.value_history if auto is not None else None,
        # AutoEcho's windows: (e in force, the window's R or None where it did not wait).
        "autoecho_windows": [[e, None if math.isnan(r) else r] for e, r in auto.history] if auto is not None else None,
        **({} if upstream is None else {"upstream_decoded": upstream.arrived, "upstream_skipped": upstream.skipped[:20],
                                         "upstream_skipped_count": len(upstream.skipped)}),
        **({} if stage is None else {"upstream_skipped": stage.skipped[:20],
                                      "upstream_skipped_count": len(stage.skipped)}),
        **({} if clocks is None else {
            "clock_per_example_s": clocks.per_example_s, "clock_lead": clocks.lead, "clock_wall_s": list(clocks.now),
            "clock_waited_s": list(clocks.waited), "clock_wall_to_target_s": clock_reached}),
    }


def _epochs(stage: EchoStage):
    """The stage's batches, epoch after epoch (each pass moves its loader to the next epoch)."""
    while True:
        before = stage.counters.batches_emitted
        yield from stage
        if stage.counters.batches_emitted == before:
            raise DataError(f"an epoch of the stream gave no batch ({len(stage.skipped)} unreadable images)")


def sweep_model(cfg: SweepConfig, data: MemoryData) -> torch.nn.Module:
    """SmallNet, or the speedrun network (``hasten.models.speedrun_net``) with ``cfg.net_widths``;
    its 2x2 whitening conv's weight set from 5,000 training images spread evenly over the
    subset (which is in class order) and frozen, as airbench does; its bias trains."""
    classes = len(data.classes) or 10
    if cfg.net_widths is None:
        return SmallNet(cfg.width, classes)
    from hasten.models.speedrun_net import NetConfig, SpeedrunNet
    from hasten.nn.whitening import init_whitening_conv

    model = SpeedrunNet(NetConfig(widths=tuple(cfg.net_widths), num_classes=classes))
    sample = torch.from_numpy(data.train[::max(1, len(data.train) // 5000)][:5000]).permute(0, 3, 1, 2).float()
    init_whitening_conv(model.whiten, normalize(sample, torch.tensor(MEAN), torch.tensor(STD)))
    return model


# ----------------------------------------------------------------------------- The slow source and its best loader
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


# ----------------------------------------------------------------------------- Tuning
def _rank(result: dict) -> tuple:
    """Tuning order: reached the target, then fewest fresh examples, fewest steps, best end accuracy."""
    return (not result["reached_target"], result["fresh_examples_to_target"] or math.inf,
            result["steps_to_target"] or math.inf, -(result["end_accuracy"] or 0.0))


def tune(cfg: SweepConfig, data: MemoryData, spec: RunSpec, target: float, log,
         budget: Callable[..., dict] | None = None) -> tuple[RunSpec, list[dict]]:
    """The learning rate (and if needed a longer budget) for ``spec`` on seed 0: the grid
    value that reaches ``target`` with the fewest fresh examples. ``budget(phase, spec,
    **kw)`` runs one training run (default: ``train_budget``; the sweep's goes through
    its journal)."""
    if budget is None:
        def budget(phase: str, spec: RunSpec, **kw) -> dict:
            return train_budget(cfg, data, spec, **kw)
    trials = [budget("tune", replace(spec, lr=cfg.lr * m, seed=0), target=target) for m in cfg.lr_grid]
    for t in trials:
        log(event="tune", **_brief(t))
    best = min(trials, key=_rank)
    if not best["reached_target"] and cfg.extra_budget > 1:
        longer = budget("tune", replace(spec, lr=best["lr"], seed=0, steps=round(spec.steps * cfg.extra_budget)),
                        target=target)
        log(event="tune", **_brief(longer))
        trials.append(longer)
        best = min(trials, key=_rank)
    return replace(spec, lr=best["lr"], steps=best["budget_steps"]), trials


def _brief(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "curve"}


# ----------------------------------------------------------------------------- The sweep
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
        "autoecho": {"e_max": cfg.e_max, "repeat_value": REPEAT_VALUE, "later_repeat_value": LATER_REPEAT_VALUE,
                     "repeat_decay": REPEAT_DECAY,
                     "value_measured_every": cfg.value_every},  # 0: the fixed values above throughout
        "baseline": [e for e in entries if e["echo_factor"] == 1.0],
        "results": entries, "summary": rows, "goals": goals(rows, cfg.ratios),
        "sweep_wall_s": time.perf_counter() - t_start,
        "journal": {"path": None if journal.path is None else str(journal.path), "runs": len(journal),
                    "resumed": journal.resumed, "torn_lines": journal.torn},
    }


def journal_settings(cfg: SweepConfig) -> dict:
    """What a journal's finished runs depend on besides the code: the sweep's settings (the
    data as an absolute path), the hardware and torch's threads (the wall times)."""
    from hasten.environment import cpu_name

    settings = asdict(cfg)
    # Only AutoEcho's runs read it: it goes in their keys (auto_settings), so that the runs
    # without AutoEcho of a journal stay valid when it changes.
    del settings["value_every"]
    if cfg.net_widths is None and cfg.target is None and cfg.lead_batches == 2:
        # The paper-regime sweep, which reads none of these fields: its journals from before
        # they existed keep their digest (and `hasten echo --sweep` its run directory).
        for name in ("net_widths", "target", "lead_batches"):
            del settings[name]
    return {**settings, "data": os.path.abspath(cfg.data), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}


def auto_settings(cfg: SweepConfig, spec: RunSpec) -> dict:
    """What an AutoEcho run's result depends on beyond its spec, for its journal key (the
    journal's digest leaves it out, see journal_settings): how often it measures a repeat's
    value and the source of its rule (``hasten.echo.auto.rule_digest``: a changed rule reruns
    AutoEcho's runs, not the others); nothing for other runs."""
    return {"value_every": cfg.value_every, "autoecho_rule": rule_digest()} if spec.echo == "auto" else {}


def add_journal_arguments(parser, out_default: str) -> None:
    """The sweep benchmarks' output and resume flags: --out, --journal, --fresh, --markdown."""
    parser.add_argument("--out", default=out_default, help="results JSON (default %(default)s)")
    parser.add_argument("--journal", help="finished runs, for resuming (default: the JSON's name with .runs.jsonl)")
    parser.add_argument("--fresh", action="store_true", help="start over: ignore (and replace) the journal")
    parser.add_argument("--markdown", metavar="JSON", help="print the results page's tables from a results JSON "
                                                           "and stop")


def open_journal(args, cfg: SweepConfig) -> RunJournal:
    """The journal the flags of :func:`add_journal_arguments` name, for ``cfg``: emptied with
    --fresh; when it holds finished runs, a line saying so, and a warning if other code
    (another commit) made some of them."""
    from pathlib import Path

    from hasten.environment import describe_environment

    path = Path(args.journal or Path(args.out).with_suffix(".runs.jsonl"))
    if args.fresh:
        path.unlink(missing_ok=True)
    commit = describe_environment()["git_commit"]
    journal = RunJournal(path, journal_settings(cfg), meta={"git_commit": commit})
    if len(journal):
        print(f"resuming: {len(journal)} finished runs in {path}", flush=True)
        older = sorted({str(m.get("git_commit")) for m in journal.replayed_meta} - {str(commit)})
        if older:
            print(f"warning: some finished runs were made by other code (commits {', '.join(older)}); "
                  "--fresh starts over", flush=True)
    return journal


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
