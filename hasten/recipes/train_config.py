"""What a ``hasten train`` run is: its configuration (``TrainConfig``, checked by
``validate`` before any work), the fields that define its training math
(``MATH_FIELDS``: a checkpoint resumes only with the same ones) and its optimizer
(SGD with Goyal et al.'s linear scaling rule, or LARS, You et al., arXiv:1708.03888).

Trained by ``hasten.recipes.train``. Changes the training math: yes (it defines it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hasten.distributed.data_parallel import DEFAULT_TIMEOUT_S
from hasten.distributed.hooks import HOOKS
from hasten.errors import ConfigError
from hasten.models.resnet import MODELS
from hasten.optim import Lars, lars_param_groups, scaled_lr
from hasten.stream.retry import DEFAULT_RETRIES

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


# Fields that define the training math: a checkpoint resumes only with the same ones.
MATH_FIELDS = ("model", "width", "image_size", "train_subset", "loader", "batch_size", "epochs",
               "optimizer", "lr", "lr_scaling", "base_batch", "momentum", "weight_decay",
               "trust_coefficient", "warmup_epochs", "decay_power", "label_smoothing", "bn_group",
               "ghost_batch", "bf16", "seed")


def build_optimizer(cfg: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    groups = lars_param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "lars":
        return Lars(groups, lr=lr, momentum=cfg.momentum, trust_coefficient=cfg.trust_coefficient)
    # SGD gets the same exclusion of biases and BN parameters from weight decay.
    for g in groups:
        g.pop("adapt", None)
    return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=True)
