"""The speedrun's settings: a recipe (``Recipe``, every trick a field), the named
presets, Page's ablation ladder, one job's settings (``SpeedrunConfig``) and one
run's result (``RunResult``). Trained by ``hasten.recipes.speedrun``.

Changes the training math: yes (these are the training recipe's hyperparameters).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from hasten.data.device_loader import Augmentation
from hasten.errors import ConfigError
from hasten.models.speedrun_net import NetConfig
from hasten.nn.tta import TTA_LEVELS

# ----------------------------------------------------------------------------
# Hyperparameters
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    net: NetConfig = NetConfig()
    epochs: float = 9.9               # fractional: the last epoch stops early
    batch_size: int = 1024
    lr: float = 11.5                  # learning rate per 1024 examples (loss summed, not averaged)
    momentum: float = 0.85            # Nesterov
    weight_decay: float = 0.0153      # per 1024 examples, decoupled from the learning rate
    bias_scaler: float = 64.0         # lr multiplier for BN biases (their scales are frozen)
    label_smoothing: float = 0.2
    warmup_frac: float = 0.23         # lr: 0.2 -> 1.0 over this fraction of steps, then -> 0.07
    whiten: bool = True               # whitening conv initialised from data and frozen
    whiten_sample: str = "random"     # random: a seeded sample of 5,000 training images; first: airbench's
                                      # first 5,000 (a fair sample only of pre-shuffled files such as
                                      # CIFAR-10's; of class-ordered folders it is one class)
    whiten_bias_epochs: int = 3       # the whitening bias trains this many epochs, then freezes
    augment: Augmentation = Augmentation(translate=2, flip="alternating")
    averaging: str = "lookahead"      # none | ema (evaluate the EMA) | lookahead (copy back)
    ema_every: int = 5                # steps between weight-average updates
    ema_decay: float = 0.99           # for averaging=ema (Page); lookahead uses airbench's schedule
    tta: str = "flip_translate"       # none | flip | flip_translate
    device_loader: bool = True        # False: per-batch preprocessing on the host (ladder rung 0)
    bf16: bool = True                 # autocast to bfloat16 on CUDA (float32 on CPUs: see precision())
    channels_last: bool = True
    compile: bool = False             # torch.compile the model (CUDA; excluded from timing by warm-up)

    def __post_init__(self) -> None:
        if self.averaging not in ("none", "ema", "lookahead"):
            raise ValueError(f"Invalid averaging {self.averaging!r}; accepted: none, ema, lookahead")
        if self.whiten_sample not in ("random", "first"):
            raise ValueError(f"Invalid whiten_sample {self.whiten_sample!r}; accepted: random, first")
        if self.tta not in TTA_LEVELS:
            raise ValueError(f"Invalid tta {self.tta!r}; accepted: {', '.join(TTA_LEVELS)}")
        if self.epochs <= 0 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"epochs, batch_size and lr must be positive: {self.epochs}, {self.batch_size}, {self.lr}")
        ghost = self.net.ghost_batch_size
        if ghost and self.batch_size % ghost:
            raise ValueError(f"the ghost batch norm size {ghost} must divide the batch size {self.batch_size}")

    def replace(self, **changes) -> "Recipe":
        """``dataclasses.replace``, where ``net.<field>`` keys change the network."""
        net_changes = {k[4:]: changes.pop(k) for k in list(changes) if k.startswith("net.")}
        return dataclasses.replace(self, net=dataclasses.replace(self.net, **net_changes), **changes)


PRESETS: dict[str, Recipe] = {
    # airbench94 (Keller Jordan): 94.0% on canonical CIFAR-10 in 3.83 s on an A100.
    "airbench94": Recipe(),
    # CPU: a quarter of the width, 7 epochs of batch 256: on a 2-core AVX2 EPYC an
    # epoch of batch 256 took 57 s against 69 s at batch 512 (the bare network's step), and
    # the smaller batch takes more steps per epoch. 7 epochs, not 6.5: the search of issue 47
    # (tuning seeds 10, 11) put the half epoch first among 7.5 epochs and label smoothing 0.1
    # as a use of the ~10% spare time (+0.4 points). hasten 0.1 ran 8 epochs of batch 512
    # (CPU_0_1 below). Measured: docs/results/speedrun-cpu.md.
    "cpu": Recipe(net=NetConfig(widths=(32, 64, 128)), epochs=7.0, batch_size=256, lr=9.0),
    # A seconds-long preset for tests and smoke runs.
    "tiny": Recipe(net=NetConfig(widths=(16, 32, 32)), epochs=2, batch_size=256, lr=6.0,
                   whiten_bias_epochs=1, tta="flip"),
}


# hasten 0.1's cpu preset, for the comparison in benchmarks/speedrun_command.py.
CPU_0_1 = PRESETS["cpu"].replace(epochs=8, batch_size=512, whiten_sample="first")


def precision(recipe: Recipe, device: torch.device) -> str:
    """What ``train_run`` trains in: ``bf16`` where the recipe asks for it on CUDA,
    else ``fp32``. Not on CPUs, even with native bf16 units: tried on a 2-core AMX
    Xeon (torch 2.13.0), a bare training step once ran 2.3x faster under bf16
    autocast, but a whole ``cpu`` preset run took 596 s against 272 s in float32
    (one run each, on a loaded machine), and the profiler put single bf16
    convolution backward passes at 0.5-1.6 s against about 0.1 s in float32."""
    return "bf16" if recipe.bf16 and torch.device(device).type == "cuda" else "fp32"


def choose_preset(requested: str, device: torch.device) -> tuple[str, str]:
    """The preset to run and why: ``requested`` unless it is ``auto``, which picks
    by device."""
    if requested != "auto":
        return requested, "asked for with --preset"
    if device.type == "cuda":
        return "airbench94", "CUDA device present: the full recipe"
    return "cpu", ("no CUDA device: the 'cpu' preset (narrower net, fewer epochs) finishes in minutes on "
                   "2 cores, where the full 'airbench94' recipe would take hours")


def build_recipe(preset: str, **changes) -> Recipe:
    """``PRESETS[preset]`` with ``changes`` (see ``Recipe.replace``); a
    ``ConfigError`` for an unknown preset or an invalid value."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {list(PRESETS)}")
    try:
        return PRESETS[preset].replace(**changes)
    except ValueError as exc:  # Recipe and NetConfig validate their own fields
        raise ConfigError(str(exc)) from None


def default_target(device: torch.device) -> float:
    """The ablation's accuracy target: airbench's 94% on CUDA, 80% (within reach of
    the ``cpu`` preset) elsewhere."""
    return 0.94 if device.type == "cuda" else 0.80


# Page's ladder (each rung adds one trick to the previous one), then airbench's
# additions. Rung 0 is the plain net: host-side preprocessing, ReLU, pool after
# activation, no label smoothing, trainable BN scales, no whitening, no weight
# averaging, no TTA, random flips, default init.
BASELINE_CHANGES = {
    "device_loader": False, "net.pool_before_act": False, "label_smoothing": 0.0,
    "net.activation": "relu", "net.ghost_batch_size": 0, "net.freeze_bn_scale": False,
    "bias_scaler": 1.0, "whiten": False, "averaging": "none", "tta": "none",
    "augment": Augmentation(translate=2, flip="random"), "net.dirac_init": False,
}
LADDER: list[tuple[str, dict]] = [
    ("baseline", {}),
    ("+ preprocessing on the device", {"device_loader": True}),
    ("+ max-pool before activation", {"net.pool_before_act": True}),
    ("+ label smoothing 0.2", {"label_smoothing": 0.2}),
    ("+ CELU", {"net.activation": "celu"}),
    ("+ ghost batch norm (32/chunk)", {"net.ghost_batch_size": 32}),
    ("+ frozen BN scale, bias lr x64", {"net.freeze_bn_scale": True, "bias_scaler": 64.0}),
    ("+ patch whitening", {"whiten": True}),
    ("+ EMA of weights", {"averaging": "ema"}),
    ("+ TTA: flip", {"tta": "flip"}),
    ("+ alternating flip", {"augment": "alternating"}),
    ("+ identity (dirac) init", {"net.dirac_init": True}),
    ("+ GELU, Lookahead (airbench)", {"net.activation": "gelu", "net.ghost_batch_size": 0, "averaging": "lookahead"}),
    ("+ TTA: flip + translate", {"tta": "flip_translate"}),
]


def ladder_recipes(top: Recipe) -> list[tuple[str, Recipe]]:
    """The cumulative rungs, each a full Recipe, ending in ``top`` with all tricks on."""
    recipe = top.replace(**BASELINE_CHANGES)
    rungs = []
    for name, changes in LADDER:
        changes = dict(changes)
        if changes.get("augment") == "alternating":
            changes["augment"] = dataclasses.replace(recipe.augment, flip="alternating")
        try:
            recipe = recipe.replace(**changes)
        except ValueError as exc:
            raise ConfigError(f"ablation rung {name!r}: {exc}") from None
        rungs.append((name, recipe))
    return rungs


@dataclass(frozen=True)
class SpeedrunConfig:
    """One ``run``: ``runs`` timed runs of ``recipe``, or its ablation ladder."""
    recipe: Recipe
    preset: str                       # the name ``recipe`` was built from, for the reports
    device: str = "cpu"               # cpu | cuda | cuda:N
    data: str | None = None           # folder, archive or CIFAR-10 binary (None: load_dataset's default)
    runs: int = 1                     # run i uses seed + i
    seed: int = 0
    train_subset: int = 0             # train on a seeded random subset of this many images; 0 = all
    warmup: bool = True               # an untimed warm-up run first (allocator, cuDNN autotune, compile)
    ablate: bool = False              # the ablation ladder (tricks added one by one) instead
    target: float = 0.94              # ablation: epochs and seconds to this accuracy are reported

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ConfigError(f"--runs must be >= 1, got {self.runs}")
        if not 0 < self.target <= 1:
            raise ConfigError(f"--target is an accuracy in (0, 1], got {self.target}")
        if self.train_subset < 0:
            raise ConfigError(f"--train-subset must be >= 0, got {self.train_subset}")


@dataclass
class RunResult:
    accuracy: float                  # final accuracy without TTA
    tta_accuracy: float              # final accuracy with the recipe's TTA (the headline number)
    time_s: float                    # timed span, see the module docstring
    cpu_time_s: float = 0.0          # process CPU seconds over the same span (all threads)
    epochs: list[dict] = field(default_factory=list)
    epochs_to_target: float | None = None
    time_to_target_s: float | None = None
    time_parts_s: list[float] = field(default_factory=list)  # timed seconds per process: one part, or
                                                             # before each stop and after the last resume

    def __post_init__(self) -> None:
        if not self.time_parts_s:  # a run never stopped: its time in one part
            self.time_parts_s = [self.time_s]
