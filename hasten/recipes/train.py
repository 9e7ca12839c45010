"""Large-batch data-parallel training: the run, from the data to the report.

The recipe of Goyal et al. (arXiv:1706.02677), You et al. (arXiv:1708.03888) and
Ying et al. (arXiv:1811.06992), for one process or many under torchrun:

- global batch B split evenly over W ranks (gloo on CPU, NCCL on CUDA), gradients
  averaged by DDP with one of hasten's all-reduce hooks (``hasten.distributed``);
- SGD with the linear scaling rule, or LARS (``hasten.optim.Lars``), biases and
  batch-norm parameters excluded from adaptation and weight decay (the configuration
  and the optimizer: ``hasten.recipes.train_config``);
- linear warm-up then polynomial (power 2) decay, label smoothing;
- batch norm per replica, over groups of k replicas (``GroupBatchNorm``) or over
  virtual batches inside a replica (``GhostBatchNorm2d``);
- bf16 autocast with BN, loss and gradient reduction in float32; channels_last;
- the dataset resident on the device (``GpuLoader``) or streamed from tar shards, their
  URL, an image folder or an archive (``ShardLoader``, for data larger than memory),
  sharded by rank, in an order that depends only on (seed, epoch), so a run can resume
  at any step;
- the steps of ``hasten.recipes.loop.train_loop``, the loop every hasten recipe runs,
  with the gradient noise scale measured on request (``--noise-scale``,
  ``hasten.recipes.noise_probe``);
- a metrics line at each epoch's end and atomic checkpoints every N steps
  (``hasten.recipes.train_hooks``) in a run directory derived from the
  configuration (``run_path``); ``resume`` restores model, optimizer, scheduler,
  step, random state and data position, and :func:`plan_resume` finds the newest
  complete checkpoint of the same run (``--resume auto``, and every torchrun restart;
  ``hasten.recipes.train_resume``);
- a lost peer rank (killed, or hung past the collective timeout) or torchrun's
  SIGTERM stops every surviving rank with one line naming the step and the
  checkpoint to resume from (``PeerLostError``, ``hasten.distributed.faults``; the
  lines: ``hasten.recipes.train_stops``).

Changes the training math: yes (it is a training recipe).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict

import torch

from hasten.distributed.data_parallel import init_distributed, seed_everything, shutdown, wrap_ddp
from hasten.distributed.faults import PeerLostError, peer_failure, stop_on_sigterm, stop_signal
from hasten.distributed.hooks import HOOKS  # noqa: F401 (the hooks --hook names)
from hasten.errors import StoreError
from hasten.models.resnet import build_model
from hasten.nn.ghost_bn import apply_ghost_batchnorm
from hasten.nn.group_bn import convert_batchnorm
from hasten.nn.precision import batchnorm_in_float32, cross_entropy, to_channels_last
from hasten.nn.tta import evaluate
from hasten.optim import WarmupPolyDecay
from hasten.optim.noise_scale import NoiseScale
from hasten.progress import progress, progress_interval, progress_mode, status
from hasten.recipes.loop import train_loop
from hasten.recipes.noise_probe import NoiseProbe
from hasten.recipes.train_hooks import Checkpoints, EpochMetrics, RunClock
from hasten.recipes.train_config import (DEFAULT_BASE_LR, DEFAULT_LR_SCALING, LOADERS, LR_SCALINGS,  # noqa: F401
                                         MATH_FIELDS, OPTIMIZERS, TrainConfig, build_optimizer)
from hasten.recipes.train_input import device_input, stream_input
from hasten.recipes.train_resume import (RESUME_AUTO, ResumePlan, default_run_path, load_resume,  # noqa: F401
                                         plan_resume, restore, run_identity, same_step_on_every_rank)
from hasten.recipes.train_stops import Where, lost_peer_message, store_stop_note

def train(cfg: TrainConfig, *, run_dir=None, resume: str | os.PathLike | dict | None = None,
          dataset=None, run_path: str | os.PathLike | None = None) -> dict:
    """Train per ``cfg``; returns the final report. ``run_dir``: a ``RunDir`` (rank 0)
    for config, metrics and checkpoints. ``resume``: a checkpoint path, a run
    directory, or the dict :func:`load_resume` returned. ``dataset``: an
    ``ImageDataset`` to use instead of loading ``cfg.data``. ``run_path``: the run
    directory, on ranks that hold no ``run_dir`` (named in the message if a peer is lost).

    When a peer rank is lost (a collective fails or times out after
    ``cfg.collective_timeout`` seconds) or SIGTERM arrives (torchrun stopping the
    survivors of a failed worker), raises :class:`PeerLostError` with one line:
    what was lost, at which step, the newest checkpoint and how to resume."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cfg.validate(world_size)
    state = resume if isinstance(resume, dict) or resume is None else load_resume(resume, cfg)
    with _algorithm_choice(cfg.deterministic):
        return _train_guarded(cfg, run_dir, state, dataset, run_path, world_size)


@contextlib.contextmanager
def _algorithm_choice(deterministic: bool):
    """cuDNN autotuning (``cudnn.benchmark``: the fastest convolution for each shape, timed
    on first use), or deterministic algorithms only, for the run; the caller's settings
    after it: left on, deterministic mode would slow every later op of the process
    (``torch.empty`` fills its memory, for one)."""
    before = (torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    if deterministic:
        # cuBLAS needs this before its first call to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before[0]
        torch.use_deterministic_algorithms(before[1], warn_only=before[2])


def _train_guarded(cfg: TrainConfig, run_dir, state, dataset, run_path, world_size: int) -> dict:
    """``_train`` inside the process group, with a lost peer or SIGTERM reported in one line."""
    if run_path is None and run_dir is not None:
        run_path = run_dir.path
    where = Where(step=state["step"] if state is not None else 0)
    failure, world = None, world_size
    with stop_on_sigterm() as guard:
        try:
            info = init_distributed(device=cfg.device, timeout_s=cfg.collective_timeout)
            world = info.world_size
            return _train(cfg, info, run_dir, state, dataset, where)
        except BaseException as exc:
            # An attribute store: no pending signal handler runs before it, so a
            # SIGTERM arriving from here on cannot cut the report short.
            guard.stopping = True
            failure = exc
        finally:
            if failure is None:
                shutdown()
    lost = lost_peer_message(failure, world, where.step, cfg, run_path)
    if lost is None:
        shutdown()
        if isinstance(failure, StoreError):
            # Remote shards: the store's line, with what a rerun can do about it.
            raise type(failure)(f"{failure}; {store_stop_note(failure, cfg, run_path, where.step)}") from None
        raise failure
    # No shutdown: tearing down a group whose peer is gone can block or log; the
    # process is about to exit, which frees it.
    sig = stop_signal(failure) if peer_failure(failure) is None or world == 1 else None
    raise PeerLostError(lost, exit_code=128 + sig if sig is not None else 1) from None


def _train(cfg: TrainConfig, info, run_dir, state: dict | None, dataset, where: Where) -> dict:
    device, rank, world = info.device, info.rank, info.world_size
    run_dir = run_dir if rank == 0 else None  # rank 0 writes the run's files
    seed_everything(cfg.seed)

    # --- data ---------------------------------------------------------------
    local_batch = cfg.batch_size // world
    data = (stream_input(cfg, device, rank, world, local_batch) if cfg.loader == "stream"
            else device_input(cfg, dataset, device, rank, world, local_batch))
    steps_per_epoch = data.steps_per_epoch
    total_steps = max(1, round(cfg.epochs * steps_per_epoch))
    warmup_steps = min(round(cfg.warmup_epochs * steps_per_epoch), total_steps - 1)

    # --- model, optimizer, schedule, resume -----------------------------------
    model = _model(cfg, data, device)
    optimizer = build_optimizer(cfg, model, cfg.peak_lr)
    scheduler = WarmupPolyDecay(optimizer, warmup_steps, total_steps, power=cfg.decay_power)
    # positioned: the loader itself resumes mid-epoch (else: skip the steps done).
    step, positioned = restore(state, model, optimizer, scheduler, data.position, rank, world)
    if world > 1:
        same_step_on_every_rank(step, device)
    model, ddp, noise = _data_parallel(cfg, model, state, world)

    # --- the hooks: noise scale, metrics at epoch ends, checkpoints, progress ---
    probe = NoiseProbe(noise, model, ddp, cfg, device, world, local_batch)
    clock = RunClock(device, state.get("train_time_s") if state is not None else None, step)
    checkpoints = Checkpoints(cfg, run_dir, world, steps_per_epoch, model, optimizer, scheduler, data.position,
                              noise, clock)
    if run_dir is not None:
        run_dir.write_config({**asdict(cfg), "world_size": world, "local_batch": local_batch,
                              "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
                              "warmup_steps": warmup_steps, "peak_lr": cfg.peak_lr, "dataset": data.name,
                              "resumed_from_step": step})
        if step:
            run_dir.drop_metrics_after(step)
    bar = _progress_bar(cfg, rank == 0, step, total_steps, steps_per_epoch, world)
    clock.watch.start()
    metrics = EpochMetrics(run_dir, clock, scheduler, cfg.batch_size, steps_per_epoch, total_steps, device,
                           extra=probe.metrics)

    def after_step(s) -> None:
        where.step = s.number
        probe.after_step(s)
        bar.update(1)
        metrics.after_step(s)
        checkpoints.every(s)

    # --- loop ---------------------------------------------------------------
    start_step = step
    step = train_loop(ddp, optimizer, data.batches_from(step, total_steps, positioned),
                      lambda logits, y: cross_entropy(logits, y, cfg.label_smoothing), scheduler=scheduler,
                      device=device, bf16=cfg.bf16, step=step, stop_after=total_steps,
                      before_backward=probe.before_backward if probe.micro else None, after_step=after_step)
    clock.watch.stop()
    bar.close()
    checkpoints.save(step)

    # --- evaluation and report ------------------------------------------------
    if world > 1:
        # DDP broadcasts rank 0's BN statistics before each forward, so after the
        # last step they differ; evaluate every rank with rank 0's.
        for b in model.buffers():
            torch.distributed.broadcast(b, 0)
    accuracy = evaluate(model, data.test_batches(), bf16=cfg.bf16, distributed=world > 1)
    report = _report(cfg, data, world, step, start_step, clock, accuracy, device)
    if noise is not None:
        report["noise_scale"] = probe.report(clock.watch.elapsed)
    if run_dir is not None:
        report["run_dir"] = str(run_dir.path)
        run_dir.log(step=step, test_accuracy=accuracy)
        run_dir.write_results(report)
    return report


def _progress_bar(cfg: TrainConfig, main: bool, step: int, total_steps: int, steps_per_epoch: int, world: int):
    """The run's progress bar (rank 0's), after a line that says what is to come when the
    progress goes to a log."""
    if main and progress_mode() == "lines":  # on a terminal the bar says this
        status(f"train: {total_steps - step} steps to go ({steps_per_epoch} per epoch at global batch "
               f"{cfg.batch_size}, {cfg.loader} loader, {world} process(es)); progress every "
               f"{progress_interval():g} s")
    return progress(total=total_steps, initial=step, desc="train", unit="step", **({} if main else {"disable": True}))


def _model(cfg: TrainConfig, data, device) -> torch.nn.Module:
    """The configuration's ResNet for ``data``, ghost batch norm applied, on ``device``."""
    model = build_model(cfg.model, data.num_classes, data.image_size, cfg.width)
    if cfg.ghost_batch:
        apply_ghost_batchnorm(model, cfg.ghost_batch)
    model = model.to(device)
    return to_channels_last(model) if cfg.channels_last else model


def _data_parallel(cfg: TrainConfig, model, state: dict | None, world: int):
    """(the model with its batch norm over groups of ranks, its DDP wrapper, the noise scale
    or None), after the checkpoint was loaded: group BN shares the very same parameters and
    buffers, and DDP broadcasts rank 0's weights."""
    model = convert_batchnorm(model, group_size=cfg.bn_group)
    if cfg.bf16:
        batchnorm_in_float32(model)
    # DDP regroups its gradient buckets after the first step, which moves gradients between
    # the chunks of gloo's ring and so changes the order 3 or more ranks' values are summed
    # in: a run resumed at step k would sum step k differently from one that never stopped.
    # Deterministic runs keep the first layout (find_unused_parameters turns the regrouping
    # off; it costs a graph traversal per step and one C++ warning line per rank).
    keep_buckets = cfg.deterministic and world > 2
    noise = NoiseScale() if cfg.noise_scale else None
    if noise is not None and state is not None and "noise_scale" in state:
        noise.load_state_dict(state["noise_scale"])
    ddp = wrap_ddp(model, hook=cfg.hook, compress=cfg.compress, noise_scale=noise, noise_scale_batch=cfg.batch_size,
                   **({"find_unused_parameters": True} if keep_buckets else {}))
    return model, ddp, noise


def _report(cfg: TrainConfig, data, world: int, step: int, start_step: int, clock: RunClock, accuracy: float,
            device) -> dict:
    train_time = clock.seconds
    images = (step - clock.base_step) * cfg.batch_size
    return {
        "accuracy": accuracy,
        "steps": step,
        "epochs": step / data.steps_per_epoch,
        "global_batch": cfg.batch_size,
        "local_batch": cfg.batch_size // world,
        "world_size": world,
        "time_s": train_time,
        "images_per_s": images / train_time if train_time > 0 else math.nan,
        "resumed_from_step": start_step,
        # Whether time_s and images_per_s cover every step (False: resumed from a checkpoint that
        # did not keep the time before it, so they cover this session's steps only).
        "time_of_all_steps": clock.of_all_steps,
        "dataset": data.name,
        "images_per_epoch": data.steps_per_epoch * cfg.batch_size,
        "loader": cfg.loader,
        "model": cfg.model,
        "optimizer": cfg.optimizer,
        "peak_lr": cfg.peak_lr,
        "bn_group": cfg.bn_group,
        "ghost_batch": cfg.ghost_batch,
        "bf16": cfg.bf16,
        "device": str(device),
    }
