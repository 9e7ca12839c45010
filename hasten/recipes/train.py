"""Large-batch data-parallel training, one file from top to bottom.

The recipe of Goyal et al. (arXiv:1706.02677), You et al. (arXiv:1708.03888) and
Ying et al. (arXiv:1811.06992), for one process or many under torchrun:

- global batch B split evenly over W ranks (gloo on CPU, NCCL on CUDA), gradients
  averaged by DDP with one of hasten's all-reduce hooks (``hasten.distributed``);
- SGD with the linear scaling rule, or LARS (``hasten.optim.Lars``), biases and
  batch-norm parameters excluded from adaptation and weight decay;
- linear warm-up then polynomial (power 2) decay, label smoothing;
- batch norm per replica, over groups of k replicas (``GroupBatchNorm``) or over
  virtual batches inside a replica (``GhostBatchNorm2d``);
- bf16 autocast with BN, loss and gradient reduction in float32; channels_last;
- the dataset resident on the device (``GpuLoader``) or streamed from tar shards, their
  URL, an image folder or an archive (``ShardLoader``, for data larger than memory),
  sharded by rank, in an order that depends only on (seed, epoch), so a run can resume
  at any step;
- atomic checkpoints every N steps in a run directory derived from the
  configuration (``run_path``); ``resume`` restores model, optimizer, scheduler,
  step, random state and data position, and :func:`plan_resume` finds the newest
  complete checkpoint of the same run (``--resume auto``, and every torchrun restart);
- a lost peer rank (killed, or hung past the collective timeout) or torchrun's
  SIGTERM stops every surviving rank with one line naming the step and the
  checkpoint to resume from (``PeerLostError``, ``hasten.distributed.faults``).

Changes the training math: yes (it is a training recipe).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from hasten.checkpoint import (CHECKPOINT_NAME, CheckpointError, load_checkpoint, newest_checkpoint, rng_state,
                               save_checkpoint, set_rng_state)
from hasten.distributed.data_parallel import DEFAULT_TIMEOUT_S, init_distributed, seed_everything, shutdown, wrap_ddp
from hasten.distributed.faults import PeerLostError, peer_failure, stop_on_sigterm, stop_signal
from hasten.distributed.hooks import HOOKS
from hasten.errors import ConfigError, StoreError, StoreUnavailable
from hasten.models.resnet import MODELS, build_model
from hasten.nn.ghost_bn import apply_ghost_batchnorm
from hasten.nn.group_bn import convert_batchnorm
from hasten.nn.precision import autocast, batchnorm_in_float32, cross_entropy, to_channels_last
from hasten.nn.tta import evaluate
from hasten.optim import Lars, WarmupPolyDecay, lars_param_groups, scaled_lr
from hasten.optim.noise_scale import NoiseScale, micro_batch_sq_norms, suggest_batch
from hasten.progress import progress, progress_interval, progress_mode, status
from hasten.recipes.step import TrainMeter, optimizer_step
from hasten.recipes.train_input import device_input, stream_input
from hasten.rundir import stable_run_path
from hasten.stream.retry import DEFAULT_RETRIES
from hasten.timing import Stopwatch

# ----------------------------------------------------------------------------
# Hyperparameters
# ----------------------------------------------------------------------------

OPTIMIZERS = ("sgd", "lars")
LR_SCALINGS = ("linear", "none")
LOADERS = ("device", "stream")
# Each optimizer's learning rate and its scaling with the batch, when not given:
DEFAULT_BASE_LR = {
    "sgd": 0.1,   # Goyal et al.: peak lr = 0.1 x B / 256
    "lars": 10.0,  # TPU ResNet-50 reference (lars_util.py): peak lr 10 for any batch < 16k
}
DEFAULT_LR_SCALING = {"sgd": "linear", "lars": "none"}


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on; derive variants with ``dataclasses.replace``.
    ``lr`` and ``lr_scaling`` are SGD's (Goyal et al.); LARS's are
    ``DEFAULT_BASE_LR["lars"]`` and ``DEFAULT_LR_SCALING["lars"]`` (what the CLI picks)."""
    data: str | None = None      # folder, archive or CIFAR-10 binary (None: load_dataset's default)
    model: str = "resnet18"
    width: int = 64              # channels of the first stage (64 = the standard ResNet)
    image_size: int | None = None
    train_subset: int = 0        # train on N random images (0 = all), for small experiments
    loader: str = "device"       # device: decode once, whole set on the device; stream: hasten.stream.shard_loader
    workers: int = 0             # decode processes per rank for --loader stream
    batch_size: int = 512        # global batch, over all ranks
    epochs: float = 10.0
    optimizer: str = "sgd"
    lr: float = DEFAULT_BASE_LR["sgd"]  # base lr (see DEFAULT_BASE_LR for LARS's)
    lr_scaling: str = DEFAULT_LR_SCALING["sgd"]  # linear: peak = lr x batch / base_batch; none: peak = lr
    base_batch: int = 256
    momentum: float = 0.9
    weight_decay: float = 5e-4
    trust_coefficient: float = 0.001
    warmup_epochs: float = 2.0
    decay_power: float = 2.0
    label_smoothing: float = 0.1
    bn_group: int = 1            # replicas sharing BN statistics (GroupBatchNorm)
    ghost_batch: int = 0         # images per virtual BN batch inside a replica (0 = off)
    bf16: bool = False
    channels_last: bool = False
    hook: str = "native"
    compress: str | None = None
    checkpoint_every: int = 0    # steps; 0 = only at the end
    collective_timeout: float = DEFAULT_TIMEOUT_S  # seconds a collective waits for a dead or hung peer
    seed: int = 0
    deterministic: bool = False
    device: str = "auto"
    noise_scale: bool = False    # estimate the gradient noise scale (hasten.optim.noise_scale)
    retries: int = DEFAULT_RETRIES  # per request to remote shards (--data URL; hasten.stream.retry)

    def validate(self, world_size: int) -> None:
        """Every check that does not need the data: fails before any work starts."""
        def bad(msg):
            raise ConfigError(msg)

        if self.model not in MODELS:
            bad(f"unknown model {self.model!r}; choose one of {sorted(MODELS)}")
        if self.optimizer not in OPTIMIZERS:
            bad(f"unknown optimizer {self.optimizer!r}; choose one of {list(OPTIMIZERS)}")
        if self.loader not in LOADERS:
            bad(f"unknown --loader {self.loader!r}; choose one of {list(LOADERS)}")
        if self.loader == "stream" and not self.data:
            bad("--loader stream needs --data PATH (a folder or archive)")
        if "://" in str(self.data or "") and self.loader != "stream":
            bad(f"--data {self.data}: shards at a URL are streamed; add --loader stream")
        if not 0 <= self.retries <= 1000:
            bad(f"--retries must be in 0..1000, got {self.retries}")
        if self.loader == "stream" and self.train_subset:
            bad("--train-subset needs --loader device (the stream reads whole splits)")
        if self.lr_scaling not in LR_SCALINGS:
            bad(f"unknown --lr-scaling {self.lr_scaling!r}; choose one of {list(LR_SCALINGS)}")
        if self.hook not in HOOKS:
            bad(f"unknown all-reduce hook {self.hook!r}; choose one of {list(HOOKS)}")
        if self.compress not in (None, "bf16"):
            bad(f"unknown gradient compression {self.compress!r}; choose bf16 or leave it off")
        for name in ("batch_size", "width", "base_batch", "bn_group"):
            if getattr(self, name) < 1:
                bad(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("train_subset", "ghost_batch", "checkpoint_every", "seed", "workers"):
            if getattr(self, name) < 0:
                bad(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not self.epochs > 0:
            bad(f"--epochs must be > 0, got {self.epochs}")
        if not 0 <= self.warmup_epochs < self.epochs:
            bad(f"--warmup-epochs {self.warmup_epochs:g} must be >= 0 and less than --epochs {self.epochs:g}")
        if not self.lr > 0:
            bad(f"--lr must be > 0, got {self.lr}")
        if not self.collective_timeout > 0:
            bad(f"--collective-timeout must be > 0 seconds, got {self.collective_timeout}")
        if not 0 <= self.label_smoothing < 1:
            bad(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.batch_size % world_size:
            bad(f"global batch {self.batch_size} is not divisible by the world size {world_size}; "
                f"use a multiple of {world_size}")
        if world_size % self.bn_group:
            bad(f"--bn-group {self.bn_group} does not divide the world size {world_size}; use one of "
                f"{[k for k in range(1, world_size + 1) if world_size % k == 0]}")
        local = self.batch_size // world_size
        if self.ghost_batch and (self.ghost_batch > local or local % self.ghost_batch):
            bad(f"--ghost-batch {self.ghost_batch} must divide the per-replica batch {local}")
        if self.ghost_batch and self.bn_group > 1:
            bad("--ghost-batch and --bn-group > 1 cannot be combined; choose one")
        if self.noise_scale and world_size == 1:
            micro = self.ghost_batch or local // 2
            if micro < 1 or local // micro < 2 or local % micro:
                bad(f"--noise-scale on one process splits the batch into micro-batches ("
                    f"{'--ghost-batch' if self.ghost_batch else 'halves'}); the batch {local} cannot be "
                    "split into two or more: use a larger --batch-size or a smaller --ghost-batch")

    @property
    def peak_lr(self) -> float:
        if self.lr_scaling == "linear":
            return scaled_lr(self.lr, self.batch_size, self.base_batch)
        return self.lr


# One process measures the noise scale on a probe every this many steps (an extra forward
# and backward of the batch as micro-batches, about 1/NOISE_PROBE_EVERY of the training
# time); under DDP every step is measured, from gradients the step computes anyway.
NOISE_PROBE_EVERY = 10

# Fields that define the training math: a checkpoint resumes only with the same ones.
MATH_FIELDS = ("model", "width", "image_size", "train_subset", "loader", "batch_size", "epochs",
               "optimizer", "lr", "lr_scaling", "base_batch", "momentum", "weight_decay",
               "trust_coefficient", "warmup_epochs", "decay_power", "label_smoothing", "bn_group",
               "ghost_batch", "bf16", "seed")


# ----------------------------------------------------------------------------
# Model and optimizer
# ----------------------------------------------------------------------------

def build_optimizer(cfg: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    groups = lars_param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "lars":
        return Lars(groups, lr=lr, momentum=cfg.momentum, trust_coefficient=cfg.trust_coefficient)
    # SGD gets the same exclusion of biases and BN parameters from weight decay.
    for g in groups:
        g.pop("adapt", None)
    return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=True)


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------

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
    where = _Where(step=state["step"] if state is not None else 0)
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
    lost = _lost_peer_message(failure, world, where.step, cfg, run_path)
    if lost is None:
        shutdown()
        if isinstance(failure, StoreError):
            # Remote shards: the store's line, with what a rerun can do about it.
            raise type(failure)(f"{failure}; {_store_stop_note(failure, cfg, run_path, where.step)}") from None
        raise failure
    # No shutdown: tearing down a group whose peer is gone can block or log; the
    # process is about to exit, which frees it.
    sig = stop_signal(failure) if peer_failure(failure) is None or world == 1 else None
    raise PeerLostError(lost, exit_code=128 + sig if sig is not None else 1) from None


@dataclass
class _Where:
    """How far training got: read by the fault report after the loop is gone."""
    step: int


def _lost_peer_message(exc: BaseException, world: int, step: int, cfg: TrainConfig, run_path) -> str | None:
    """The one line for a lost peer or a SIGTERM, or None for any other exception."""
    what = peer_failure(exc) if world > 1 else None
    sig = stop_signal(exc)
    if what is not None:
        head = f"lost contact with a peer rank at step {step} ({what})"
    elif sig is not None:
        head = (f"stopped by {sig.name} at step {step} (torchrun sends it when another rank fails)"
                if world > 1 and sig == signal.SIGTERM else f"stopped by {sig.name} at step {step}")
    else:
        return None
    where = _checkpoint_note(cfg, run_path)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    max_restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if restarts < max_restarts:
        how = f"torchrun restarts the workers (restart {restarts + 1} of {max_restarts}), which resume from it"
    else:
        how = "rerun with --resume auto"
    return f"{head}; {where}; {how}"


def _store_stop_note(failure: StoreError, cfg: TrainConfig, run_path, step: int) -> str:
    """What a rerun can do after a store stopped the run at ``step``: resume advice only when
    the store did not answer (``StoreUnavailable``: waiting may cure it) and a checkpoint
    exists; no run directory named that a stop before the first step leaves behind."""
    newest = newest_checkpoint(run_path) if run_path is not None else None
    waited = isinstance(failure, StoreUnavailable)
    if newest is not None:
        when = "when the store answers again" if waited else "once that is fixed"
        return (f"stopped at step {step}; newest checkpoint: {newest.path} (step {newest.step}); "
                f"rerun with --resume auto {when}")
    if step == 0:
        s3_endpoint = str(cfg.data).startswith(("s3://", "s3a://")) and os.environ.get("AWS_ENDPOINT_URL")
        where = "AWS_ENDPOINT_URL" if s3_endpoint else "the URL's host and port"
        return (f"stopped before the first step; rerun when the store answers (if it never does, check {where})"
                if waited else "nothing was trained")
    every = f"every {cfg.checkpoint_every} steps" if cfg.checkpoint_every else "only at the end"
    return (f"stopped at step {step}, before the first checkpoint (saved {every}; --checkpoint-every N); "
            f"a rerun starts over{' when the store answers again' if waited else ''}")


def _checkpoint_note(cfg: TrainConfig, run_path) -> str:
    """Where a stopped run can resume from: its newest checkpoint, or why there is none."""
    newest = newest_checkpoint(run_path) if run_path is not None else None
    if newest is not None:
        return f"newest checkpoint: {newest.path} (step {newest.step})"
    if run_path is None:
        return "no checkpoint (no run directory)"
    every = f"every {cfg.checkpoint_every} steps" if cfg.checkpoint_every else "only at the end"
    return f"no checkpoint in {run_path} yet (saved {every}; --checkpoint-every N)"


def run_identity(cfg: TrainConfig) -> dict:
    """What makes two runs the same run: the fields of the training math and the data
    (resolved to an absolute path when it is one). Its digest names the run directory."""
    data = cfg.data or os.environ.get("HASTEN_DATA") or "cifar10-download"
    if Path(data).exists():
        data = str(Path(data).resolve())
    return {"data": data, **{k: getattr(cfg, k) for k in MATH_FIELDS}}


def default_run_path(cfg: TrainConfig, root: str | os.PathLike | None = None) -> Path:
    """``<root>/train-<digest of run_identity(cfg)>``: the directory every rank and every
    restart of this run derives alone (``root``: ``$HASTEN_RUNS``, else ``runs``)."""
    return stable_run_path("train", run_identity(cfg), root)


RESUME_AUTO = "auto"


@dataclass(frozen=True)
class ResumePlan:
    """Where a run starts: the checkpoint state to resume (None: fresh), the file it
    came from, and a line to tell the user (None: nothing to say). ``finished``: the
    report (``results.json``) of a run that already ended: nothing to train or evaluate."""
    state: dict | None
    source: Path | None
    note: str | None
    finished: dict | None = None


def plan_resume(cfg: TrainConfig, run_path: str | os.PathLike, resume: str | None = None, *,
                restarted: bool = False) -> ResumePlan:
    """Decide where a run in ``run_path`` starts.

    - ``resume="auto"``, or ``restarted`` (a worker torchrun restarted): the newest
      complete checkpoint in ``run_path``; with none, a given ``resume`` path, else a
      fresh start (said in the note).
    - ``resume=PATH``: that checkpoint (file, or run directory holding one).
    - ``resume=None``: fresh; refused when ``run_path`` already holds a checkpoint,
      so that a second run never overwrites the first one's.
    With ``resume`` None or "auto", a run that finished (its ``results.json`` is of its
    newest checkpoint's step) is not run again: ``finished`` holds its report.
    Every checkpoint must have been written with the same training configuration."""
    run_path = Path(run_path)
    newest = newest_checkpoint(run_path)
    if resume in (None, RESUME_AUTO) and newest is not None:
        report = _finished_report(run_path, newest.step)
        if report is not None:
            return ResumePlan(None, newest.path, f"{run_path} holds this run, finished at step {newest.step}: "
                              "nothing to train (a new run: --run-dir DIR)", finished=report)
    if resume == RESUME_AUTO or restarted:
        if newest is not None:
            return ResumePlan(load_resume(newest.path, cfg), newest.path,
                              f"resuming from {newest.path} (step {newest.step})")
        if resume in (None, RESUME_AUTO):
            return ResumePlan(None, None, f"no checkpoint in {run_path} yet; starting fresh")
    if resume is not None:
        path = Path(resume)
        path = path / CHECKPOINT_NAME if path.is_dir() else path
        if newest is not None and path.resolve().parent != run_path.resolve():
            raise ConfigError(f"{run_path} already holds a checkpoint of this configuration (step "
                              f"{newest.step}); resume it with --resume auto, or pass --run-dir DIR to "
                              f"continue {path} elsewhere")
        return ResumePlan(load_resume(path, cfg), path, None)
    if newest is not None:
        raise ConfigError(f"{run_path} already holds a checkpoint of this run (step {newest.step}); "
                          "continue it with --resume auto, or start a new run with --run-dir DIR")
    return ResumePlan(None, None, None)


def _finished_report(run_path: Path, step: int) -> dict | None:
    """The report a run in ``run_path`` wrote when it ended at ``step``, if it did."""
    import json

    try:
        report = json.loads((run_path / "results.json").read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and report.get("steps") == step else None


def load_resume(resume: str | os.PathLike, cfg: TrainConfig) -> dict:
    """Load a checkpoint to resume ``cfg`` from; a clear error if it is damaged or
    was written with a different training configuration."""
    path = Path(resume)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    state = load_checkpoint(path)
    if "config" not in state or "model" not in state:
        raise CheckpointError(f"{path} is not a hasten train checkpoint (no config/model entries)")
    saved = state["config"]
    diff = [f"--{k.replace('_', '-')}: checkpoint {saved.get(k)!r}, now {getattr(cfg, k)!r}"
            for k in MATH_FIELDS if saved.get(k) != getattr(cfg, k)]
    if diff:
        raise ConfigError(f"cannot resume {path} with a different training configuration: "
                          + "; ".join(diff))
    return state


def _train(cfg: TrainConfig, info, run_dir, state: dict | None, dataset, where: _Where) -> dict:
    device, rank, world = info.device, info.rank, info.world_size
    main = rank == 0
    seed_everything(cfg.seed)

    # --- data ---------------------------------------------------------------
    local_batch = cfg.batch_size // world
    if cfg.loader == "stream":
        data = stream_input(cfg, device, rank, world, local_batch)
    else:
        data = device_input(cfg, dataset, device, rank, world, local_batch)
    steps_per_epoch = data.steps_per_epoch
    total_steps = max(1, round(cfg.epochs * steps_per_epoch))
    warmup_steps = round(cfg.warmup_epochs * steps_per_epoch)
    warmup_steps = min(warmup_steps, total_steps - 1)

    # --- model, optimizer, schedule ------------------------------------------
    model = build_model(cfg.model, data.num_classes, data.image_size, cfg.width)
    if cfg.ghost_batch:
        apply_ghost_batchnorm(model, cfg.ghost_batch)
    model = model.to(device)
    if cfg.channels_last:
        model = to_channels_last(model)
    lr = cfg.peak_lr
    optimizer = build_optimizer(cfg, model, lr)
    scheduler = WarmupPolyDecay(optimizer, warmup_steps, total_steps, power=cfg.decay_power)
    step = 0
    positioned = False  # the loader itself resumes mid-epoch (else: skip the steps done)
    # Training seconds of the steps before a resume (the checkpoint keeps them): a resumed run
    # reports the time and rate of all its steps. None: a fresh run, or an older checkpoint.
    earlier_s = state.get("train_time_s") if state is not None else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = state["step"]
        set_rng_state(state["rng"])
        saved = state.get("data")
        if data.position is not None and saved is not None and saved["world_size"] == world:
            data.position.load_state_dict(saved["ranks"][rank])
            positioned = True
    if world > 1:
        # Every rank must start at the same step, or the first collective pairs different steps.
        steps = torch.tensor([step, -step], device=device)
        torch.distributed.all_reduce(steps, op=torch.distributed.ReduceOp.MAX)
        if int(steps[0]) != -int(steps[1]):
            raise ConfigError(f"the ranks resume from different steps ({-int(steps[1])} to {int(steps[0])}): "
                              "every rank must see the same run directory (shared storage across nodes)")
    # Group BN after loading: it shares the very same parameters and buffers.
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
    noise_micro = (cfg.ghost_batch or local_batch // 2) if noise is not None and world == 1 else 0
    noise_clock = Stopwatch(device)

    saved_at = [None]  # the step this run last saved a checkpoint at

    def checkpoint():
        if saved_at[0] == step:
            return  # saved at this step already: keep the one before as checkpoint-previous.pt
        saved_at[0] = step
        if clock.running:  # the time so far, this span included (the clock goes on)
            clock.stop()
            clock.start()
        # Unknown when resumed from a checkpoint that did not keep the time before it.
        elapsed = clock.elapsed if earlier_s is not None or start_step == 0 else None
        positions = None
        if data.position is not None:
            # Each rank's loader has its own position: rank 0 stores them all.
            positions = [data.position.state_dict()]
            if world > 1:
                positions = [None] * world
                torch.distributed.all_gather_object(positions, data.position.state_dict())
        if main and run_dir is not None:
            save_checkpoint(run_dir.path / CHECKPOINT_NAME, {
                "config": asdict(cfg), "step": step, "epoch": step // steps_per_epoch,
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": rng_state(),
                **({"train_time_s": (earlier_s or 0.0) + elapsed} if elapsed is not None else {}),
                **({"data": {"world_size": world, "ranks": positions}} if positions is not None else {}),
                **({"noise_scale": noise.state_dict()} if noise is not None else {}),
            }, keep_previous=True)

    if main and run_dir is not None:
        run_dir.write_config({**asdict(cfg), "world_size": world, "local_batch": local_batch,
                              "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
                              "warmup_steps": warmup_steps, "peak_lr": lr, "dataset": data.name,
                              "resumed_from_step": step})
        if step:
            run_dir.drop_metrics_after(step)

    # --- loop ---------------------------------------------------------------
    start_step = step
    # Rates count the steps the clock timed: all of them when the earlier time is known.
    base_step, base_s = (0, earlier_s) if earlier_s is not None else (start_step, 0.0)
    if main and progress_mode() == "lines":  # on a terminal the bar says this
        status(f"train: {total_steps - step} steps to go ({steps_per_epoch} per epoch at global batch "
               f"{cfg.batch_size}, {cfg.loader} loader, {world} process(es)); progress every "
               f"{progress_interval():g} s")
    bar = progress(total=total_steps, initial=step, desc="train", unit="step", **({} if main else {"disable": True}))
    clock = Stopwatch(device)
    clock.start()
    meter = TrainMeter(device)
    while step < total_steps:
        # Resume mid-epoch: the same order, skipping what was done (unless the loader resumed itself).
        skip = 0 if positioned else step % steps_per_epoch
        positioned = False
        for i, (x, y) in enumerate(data.epoch_batches(step // steps_per_epoch)):
            if i < skip:
                continue
            with autocast(device, cfg.bf16):
                logits = ddp(x)
            loss = cross_entropy(logits, y, cfg.label_smoothing)
            if noise_micro and step % NOISE_PROBE_EVERY == 0:
                noise_clock.start()
                _noise_probe(model, noise, x, y, noise_micro, cfg, device, step)
                noise_clock.stop()
            optimizer_step(loss, optimizer, scheduler)
            step += 1
            where.step = step
            if noise is not None:
                if world > 1:
                    noise_clock.start()
                    ddp.noise_scale.update(step)
                    noise_clock.stop()
            meter.update(loss * len(y), logits, y)
            bar.update(1)
            if main and run_dir is not None and (step % steps_per_epoch == 0 or step == total_steps):
                # Untimed, and the meter syncs with the device: once per epoch, not per step.
                clock.stop()
                run_dir.log(step=step, epoch=step / steps_per_epoch, loss=meter.loss,
                            train_accuracy=meter.accuracy, lr=scheduler.get_last_lr()[0],
                            time_s=base_s + clock.elapsed,
                            images_per_s=(step - base_step) * cfg.batch_size / (base_s + clock.elapsed),
                            **(_noise_metrics(noise) if noise is not None else {}))
                meter.reset()
                clock.start()
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                checkpoint()
            if step >= total_steps:
                break
    clock.stop()
    train_time = base_s + clock.elapsed
    bar.close()
    checkpoint()

    if world > 1:
        # DDP broadcasts rank 0's BN statistics before each forward, so after the
        # last step they differ; evaluate every rank with rank 0's.
        for b in model.buffers():
            torch.distributed.broadcast(b, 0)
    accuracy = evaluate(model, data.test_batches(), bf16=cfg.bf16, distributed=world > 1)
    images = (step - base_step) * cfg.batch_size
    report = {
        "accuracy": accuracy,
        "steps": step,
        "epochs": step / steps_per_epoch,
        "global_batch": cfg.batch_size,
        "local_batch": local_batch,
        "world_size": world,
        "time_s": train_time,
        "images_per_s": images / train_time if train_time > 0 else math.nan,
        "resumed_from_step": start_step,
        # Whether time_s and images_per_s cover every step (False: resumed from a checkpoint that
        # did not keep the time before it, so they cover this session's steps only).
        "time_of_all_steps": base_step == 0,
        "dataset": data.name,
        "images_per_epoch": steps_per_epoch * cfg.batch_size,
        "loader": cfg.loader,
        "model": cfg.model,
        "optimizer": cfg.optimizer,
        "peak_lr": lr,
        "bn_group": cfg.bn_group,
        "ghost_batch": cfg.ghost_batch,
        "bf16": cfg.bf16,
        "device": str(device),
    }
    if noise is not None:
        # This session's share: the probes of the steps before a resume were timed by that session.
        report["noise_scale"] = _noise_report(noise, cfg, world, local_batch, noise_micro, noise_clock.elapsed,
                                              clock.elapsed)
    if main and run_dir is not None:
        report["run_dir"] = str(run_dir.path)
        run_dir.log(step=step, test_accuracy=accuracy)
        run_dir.write_results(report)
    return report


def _noise_probe(model, noise: NoiseScale, x, y, micro: int, cfg: TrainConfig, device, step: int) -> None:
    """One process: the squared gradient norms of the batch's micro-batches of ``micro``
    images and of their mean, at the parameters this step starts from; training untouched."""
    def loss_fn(logits, labels):
        return cross_entropy(logits, labels, cfg.label_smoothing)

    class _Autocast(torch.nn.Module):  # the forward as training runs it (bf16 autocast or not)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, inp):
            with autocast(device, cfg.bf16):
                return self.inner(inp)

    small, big = micro_batch_sq_norms(_Autocast(model), loss_fn, list(zip(x.split(micro), y.split(micro))))
    noise.update(small, big, micro, len(x), step)


def _noise_metrics(noise: NoiseScale) -> dict:
    return {"noise_scale": noise.b_simple, "noise_grad_sq": noise.g2, "noise_trace": noise.trace}


def _noise_report(noise: NoiseScale, cfg: TrainConfig, world: int, local_batch: int, micro: int,
                  seconds: float, train_time: float) -> dict:
    """The estimate, how it was measured, what it costs, and the batch it suggests."""
    window = noise.b_simple_window  # the whole run: late in a decayed run |G|^2 -> 0 and the ratio explodes
    value = window if math.isfinite(window) else noise.b_simple
    suggested, why = suggest_batch(value, cfg.batch_size)
    if world > 1:
        how = (f"every step: each rank's gradient over its {local_batch} images (before the all-reduce) and the "
               f"averaged one over {cfg.batch_size}")
        b_small, b_big = local_batch, cfg.batch_size
    else:
        how = (f"every {NOISE_PROBE_EVERY} steps: micro-batches of {micro} images of the step's batch and their mean "
               f"over {local_batch}")
        b_small, b_big = micro, local_batch
    return {"b_simple": noise.b_simple, "b_simple_run": window, "used": value,
            "measurements": noise.updates, "b_small": b_small, "b_big": b_big, "how": how,
            "seconds": seconds, "overhead_fraction": seconds / train_time if train_time > 0 else math.nan,
            "suggested_batch": suggested, "why": why}
