"""One training run of the echo sweep (``hasten.recipes.echo.sweep``): ``train_budget``
trains a budget of steps with a warm-up and linear decay (``lr_at``), through one of the
sweep's upstreams (a slow source, modelled clocks, shards in a store, or hasten's own
stream), with or without echoing, and reports fresh examples, steps and seconds to a
target. Its evaluations (a fixed set of ``test_images`` test images at ``eval_points``
fractions of the budget) stop the run's clock, the slow source's clock and AutoEcho's
measurement. The step is ``hasten.recipes.loop.train_loop``'s, with the repeat-value
probe between backward and update (``hasten.recipes.echo.loop_hooks.RepeatValue``); the
run's parts around it: where it is in its budget (``Budget``), its evaluations
(``Evaluations``) and its input (``SweepInput``).

Changes the training math: yes with echoing (repeated examples); e = 1 is plain
training.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from functools import partial
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from hasten.data.host_augment import keyed_crop_flip
from hasten.data.normalize import normalize
from hasten.echo import AutoEcho, EchoCounters, auto_shuffle_buffer, default_shuffle_buffer
from hasten.echo.stages import check_variant
from hasten.errors import DataError
from hasten.nn.tta import evaluate
from hasten.recipes.echo.clock import ModelledClocks
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.data import IdentityStore, MemoryData, Source, fresh_keys, pipeline, test_batches
from hasten.recipes.echo.loop_hooks import InputClock, RepeatValue, paused
from hasten.recipes.echo.network import MEAN, STD, SmallNet
from hasten.recipes.echo.shard_source import ShardSource
from hasten.recipes.loop import Step, train_loop
from hasten.stream.echo_stage import EchoStage
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.slow_storage import SlowStorage


def lr_at(step: int, steps: int, peak: float, warmup: float) -> float:
    """Linear warm-up over ``warmup`` of the budget, then linear decay to 0 at ``steps``: the
    same schedule in steps for every run, AutoEcho's included (``hasten.echo.auto``)."""
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

    AutoEcho (``spec.echo == "auto"``) runs the same budget and schedule in steps as a
    fixed factor: a step counts as a step whatever share of it is repeats (issue 44).

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
    _check_upstreams(spec, source, clocks, upstream, stream)
    dev = torch.device(cfg.device)
    auto = None
    if spec.echo == "auto":
        auto = AutoEcho(e_max=spec.e_max, interval=4 * cfg.batch_size if spec.variant != "batch" else 4,
                        value_every=cfg.value_every)
    factor = auto if auto is not None else float(spec.echo)
    buffer = _shuffle_buffer(cfg, spec, auto, factor)
    torch.manual_seed(spec.seed)
    model = sweep_model(cfg, data).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9, nesterov=True,
                          weight_decay=cfg.weight_decay)
    budget = Budget(cfg, spec, auto, opt)
    clock = InputClock()
    value = RepeatValue(auto, spec.variant, model, partial(F.cross_entropy, label_smoothing=cfg.label_smoothing),
                        spec.seed)
    run_input = SweepInput(cfg, data, spec, factor, buffer, dev, source, clocks, upstream, stream)
    counters = run_input.counters
    if auto is not None and run_input.stage is None:
        auto.expect_step_reports()  # the loop reports each step: windows before the first wait for it
    evals = Evaluations(cfg, spec, data, model, dev, budget, clock, counters, clocks, (run_input.storage, auto),
                        target, stop_at_target, log)

    def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # per example: AutoEcho reads them
        return F.cross_entropy(logits, y, label_smoothing=cfg.label_smoothing, reduction="none")

    def after_step(s) -> bool:
        keys, numbers, waited, modelled_wait = s.extra
        value.observe(s.loss, torch.from_numpy(numbers))  # the value of repeats
        stepped = clock.stepping.stop()
        if clocks is not None:
            clocks.advance(waited + stepped)  # the pipeline's own time and the step, both measured
        if auto is not None and run_input.stage is None:  # (the stage reports its batches itself)
            auto.record_step(waited + modelled_wait, stepped, len(keys))
        budget.steps = s.number
        budget.factors.append(auto.factor if auto is not None else float(spec.echo))
        return evals.after_step(budget.steps, budget.factors[-1])

    try:
        train_loop(model, opt, run_input.device_batches(clock, budget.left), loss_fn, device=dev,
                   before_forward=budget.set_lr, after_step=after_step,
                   # what a repeat is worth, at the step's weights (its gradients computed, not yet applied)
                   # (on a step that waited for its batch: the measurement takes time the loop would wait)
                   before_update=lambda s: value.probe(s.x, s.y, torch.from_numpy(s.extra[1]),
                                                   s.extra[2] + s.extra[3]))
    finally:
        run_input.close()  # ends the reads in flight (outside the clocks)
    return _report(spec, source, buffer, budget, clock, evals, counters, auto, run_input, clocks, upstream, stream,
                   target, final_eval)


def _check_upstreams(spec: RunSpec, source, clocks, upstream, stream) -> None:
    check_variant(spec.variant)
    if sum(x is not None for x in (source, clocks, upstream, stream)) > 1:
        raise ValueError("train_budget: a run's upstream is one of a slow source, modelled clocks, a shard "
                         "source or a stream")
    if spec.echo == "auto" and clocks is not None and len(clocks.per_example_s) > 1:
        raise ValueError("train_budget: AutoEcho decides from one clock's waits; give it one clock, not "
                         f"{len(clocks.per_example_s)}")


def _shuffle_buffer(cfg: SweepConfig, spec: RunSpec, auto: AutoEcho | None, factor) -> int | Callable:
    """Items mixed after the echo stage: the spec's, else sized for e (with AutoEcho: growing with it)."""
    if spec.variant == "batch" or (auto is None and factor == 1.0):
        return 0  # no copies inside a batch to spread apart
    if spec.shuffle_buffer is not None:
        return spec.shuffle_buffer
    if auto is not None:
        return auto_shuffle_buffer(auto, cfg.batch_size)  # grows with e
    return default_shuffle_buffer(factor, cfg.batch_size)


class Budget:
    """Where a run is in its budget of ``spec.steps`` steps, AutoEcho's included; the schedule
    follows it (``set_lr``, the loop's ``before_forward``). Also the echo factor of each step."""

    def __init__(self, cfg: SweepConfig, spec: RunSpec, auto: AutoEcho | None, opt: torch.optim.Optimizer) -> None:
        self.cfg, self.spec, self.auto, self.opt = cfg, spec, auto, opt
        self.steps, self.factors = 0, []

    def left(self) -> bool:
        return self.steps < self.spec.steps

    def set_lr(self, s: Step) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.steps, self.spec.steps, self.spec.lr, self.cfg.warmup)


class Evaluations:
    """The run's evaluations on ``cfg.test_images`` test images at ``cfg.eval_points``
    fractions of the budget's steps, with
    ``pause`` (the slow storage, AutoEcho) standing still: the accuracy curve (step, accuracy,
    fresh examples, wall seconds, and each modelled clock's time), a ``log`` line each, and the
    first at or above ``target`` (``reached``), where ``stop_at_target`` ends the run."""

    def __init__(self, cfg: SweepConfig, spec: RunSpec, data: MemoryData, model, dev, budget: Budget,
                 clock: InputClock, counters: EchoCounters, clocks: ModelledClocks | None, pause: tuple,
                 target: float | None, stop_at_target: bool, log) -> None:
        self.cfg, self.spec, self.data, self.model, self.dev, self.budget = cfg, spec, data, model, dev, budget
        self.clock, self.counters, self.clocks, self.pause = clock, counters, clocks, pause
        self.target, self.stop_at_target, self.log = target, stop_at_target, log
        self.steps = sorted({min(spec.steps, max(1, round(f * spec.steps))) for f in cfg.eval_points})
        self.curve, self.reached, self.clock_reached = [], None, None

    def after_step(self, steps: int, factor: float) -> bool:
        """Evaluate if a point is due; returns whether the run ends here."""
        if steps not in self.steps:
            return False
        with paused(*self.pause):
            accuracy = evaluate(self.model, test_batches(self.data, self.cfg.test_images, self.dev))
        wall, clocks, fresh = self.clock.wall_s, self.clocks, self.counters.fresh_examples
        self.curve.append((steps, accuracy, fresh, wall, *([list(clocks.now)] if clocks else [])))
        if self.log is not None:
            self.log(step=steps, fresh=fresh, accuracy=accuracy, wall_s=wall, echo=factor)
        if self.target is not None and self.reached is None and accuracy >= self.target:
            self.reached = (fresh, steps, wall)
            self.clock_reached = list(clocks.now) if clocks is not None else None
            return self.stop_at_target
        return False


class SweepInput:
    """A run's batches on the device (:meth:`device_batches`) from its upstream: the in-memory
    set behind a slow source (``storage``, ``SlowStorage`` as ``source`` says) or modelled
    clocks, shards in a store (``upstream``), or a stream (``EchoStage`` over the loader
    ``stream(seed)`` gives, epoch after epoch); echoed by ``factor`` and augmented, the fresh
    examples counted (``counters``)."""

    def __init__(self, cfg: SweepConfig, data: MemoryData, spec: RunSpec, factor, buffer, dev,
                 source: Source | None, clocks: ModelledClocks | None, upstream: ShardSource | None,
                 stream: Callable[[int], ShardLoader] | None) -> None:
        self.cfg, self.data, self.spec, self.dev, self.clocks, self.upstream = cfg, data, spec, dev, clocks, upstream
        self.counters, self.stage, self.storage = EchoCounters(), None, None
        if source is not None:
            self.storage = SlowStorage(IdentityStore(), latency_s=source.latency_s,
                                       link_bytes_per_s=source.link_bytes_per_s,
                                       size_of=lambda part: int(data.wire_bytes[part % len(data.train)].sum()))
        if stream is not None:
            # (AutoEcho's buffer follows e inside the stage, as auto_shuffle_buffer does here.)
            self.stage = EchoStage(stream(spec.seed), factor, variant=spec.variant, with_copies=True,
                                   shuffle_buffer=None if callable(buffer) else buffer)
            self.counters = self.stage.counters
            self.batches = _epochs(self.stage)
        else:
            n = len(data.train)
            self.fresh = (upstream.keys(spec.seed) if upstream is not None
                          else fresh_keys(n, spec.seed, self.storage, source))
            self.train_images = upstream.images if upstream is not None else data.train  # (the arrived pixels)
            self.batches = pipeline(clocks.items(self.fresh) if clocks is not None else self.fresh, spec, factor,
                                    buffer, cfg.batch_size, self.counters,
                                    clock=clocks.time if clocks is not None else None)

    def device_batches(self, clock: InputClock, more: Callable[[], bool]):
        """Batches while ``more()``, with what the step's bookkeeping needs: (x, y, keys, copy
        numbers, seconds waited, modelled seconds waited). Fetching a batch is waiting;
        preparing it (augmentation, the copy to the device) is stepping, until the step's end."""
        dev, clocks, n = self.dev, self.clocks, len(self.data.train)
        mean, std = torch.tensor(MEAN, device=dev), torch.tensor(STD, device=dev)
        labels = torch.from_numpy(self.data.train_labels)
        while more():
            clock.waiting.start()
            before = clocks.waited[0] if clocks is not None else 0.0
            batch = next(self.batches)
            waited = clock.waiting.stop()
            clock.stepping.start()
            if self.stage is not None:  # augmented by the stage (example-before) or the loader
                images, y, keys, numbers = batch
                x, y, keys, numbers = normalize(images.to(dev), mean, std), y.to(dev), keys.numpy(), numbers.numpy()
            else:
                keys, copies, numbers = batch
                self.counters.record_batch(keys.tolist())
                idx = keys % n
                images = keyed_crop_flip(self.train_images[idx], keys, seed=self.spec.seed, copies=copies,
                                         pad=self.cfg.pad)
                x = normalize(torch.from_numpy(images).permute(0, 3, 1, 2).to(dev), mean, std)
                y = labels[torch.from_numpy(idx)].to(dev)
            modelled_wait = clocks.waited[0] - before if clocks is not None else 0.0
            yield x, y, keys, numbers, waited, modelled_wait

    def close(self) -> None:
        self.batches.close()
        if self.upstream is not None:
            self.fresh.close()  # (the stages hold it until they are freed): its reader stops now, not later


def _report(spec: RunSpec, source, buffer, budget: Budget, clock: InputClock, evals: Evaluations,
            counters: EchoCounters, auto: AutoEcho | None, run_input: SweepInput, clocks, upstream, stream,
            target, final_eval: bool) -> dict:
    wait_s, step_s = clock.waiting.elapsed, clock.stepping.elapsed
    steps, factors, reached, curve, stage = budget.steps, budget.factors, evals.reached, evals.curve, run_input.stage
    full = steps >= spec.steps
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
        "final_accuracy": (evaluate(evals.model, test_batches(evals.data, None, evals.dev))
                           if full and final_eval else None),
        "curve": curve, "idle_fraction": wait_s / (wait_s + step_s) if steps else 0.0,
        "step_time_s": step_s / max(steps, 1), "duplicate_rate": counters.duplicate_rate,
        "autoecho_cap": auto.cap if auto is not None else None,
        "repeat_value_measured": auto.value_history if auto is not None else None,
        "repeat_value_measurements": auto.value.taken if auto is not None else None,  # gradient_dots calls
        # AutoEcho's windows: (e in force, the window's R or None where it did not wait).
        "autoecho_windows": [[e, None if math.isnan(r) else r] for e, r in auto.history] if auto is not None else None,
        **({} if upstream is None else {"upstream_decoded": upstream.arrived, "upstream_skipped": upstream.skipped[:20],
                                         "upstream_skipped_count": len(upstream.skipped)}),
        **({} if stage is None else {"upstream_skipped": stage.skipped[:20],
                                      "upstream_skipped_count": len(stage.skipped)}),
        **({} if clocks is None else {
            "clock_per_example_s": clocks.per_example_s, "clock_lead": clocks.lead, "clock_wall_s": list(clocks.now),
            "clock_waited_s": list(clocks.waited), "clock_wall_to_target_s": evals.clock_reached}),
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
