"""What the echo sweep runs: ``SweepConfig`` (the whole benchmark) and ``RunSpec`` (one
training run of it). Both the sweep (``hasten.recipes.echo.sweep``) and its data and input
pipeline (``hasten.recipes.echo.data``) read them, so they live apart from both.

Changes the training math: no (configuration only).
"""

from __future__ import annotations

from dataclasses import dataclass

from hasten.errors import ConfigError


# ----------------------------------------------------------------------------- Hyperparameters
@dataclass(frozen=True)
class SweepConfig:
    """The whole benchmark. Defaults: sized so that every run and the whole sweep fit a
    shared 2-core CPU (about half an hour), while the baseline still reads every
    example of its subset several times, as in the paper."""
    data: str
    train_images: int = 10_000  # fixed class-balanced subset of the training set
    subset_seed: int = 2019  # which subset (the repeat-value calibration holds out its own)
    test_images: int = 5_000  # fixed test images that detect the target (final accuracy: all 10,000)
    image_size: int = 16  # decoded at 1/2 DCT scale
    width: int = 16  # SmallNet: conv widths 16, 32, 64
    net_widths: tuple[int, int, int] | None = None  # the speedrun network with these widths instead of SmallNet
    batch_size: int = 64
    epochs: float = 3.0  # the baseline's budget: passes over the subset
    lr: float = 0.1  # SGD-Nesterov peak learning rate at the centre of the grid
    lr_grid: tuple[float, ...] = (0.5, 1.0, 2.0)  # multipliers of lr tried for every setting
    warmup: float = 0.05  # share of the budget with a linear warm-up; then linear decay to 0
    weight_decay: float = 5e-4
    label_smoothing: float = 0.1
    pad: int = 2  # random-crop padding at 16x16 (4 at 32x32)
    eval_points: tuple[float, ...] = (0.6, 0.8, 0.9, 0.95, 1.0)  # budget fractions evaluated
    extra_budget: float = 1.5  # budget multiplier tried when no learning rate reaches the target
    seeds: int = 3
    factors: tuple[float, ...] = (2.0, 4.0, 6.0, 8.0)  # example-before, also timed
    other_factors: tuple[float, ...] = (2.0, 4.0)  # example-after and batch, counts only
    ratios: tuple[float, ...] = (2.0, 4.0, 6.0, 8.0)  # upstream ratios R of the timed comparison
    not_bound_ratio: float = 0.5  # R of the "not input-bound" AutoEcho check
    buffer_factor: float = 4.0  # the shuffle-buffer study's echo factor
    buffer_sizes: tuple[int, ...] = (0, 256, 1024)  # studied beside the default size
    latency_s: float = 0.02  # per request, as to object storage
    request_examples: int = 32  # JPEGs per request (a byte range of a record file)
    in_flight_grid: tuple[int, ...] = (1, 2, 4, 8, 16)  # the baseline's loader search
    prefetch_grid: tuple[int, ...] = (0, 8)  # requests read ahead of the consumer
    e_max: float = 8.0  # AutoEcho's largest factor
    # AutoEcho measures what a repeat is worth on the task every this many steps at first,
    # less often once it stands (hasten.echo.repeat_value; 3/8 of a step's forward and
    # backward each; it bounds e and its headroom, not the schedule); 0: its prior throughout.
    value_every: int = 8
    # The sweep at a target (hasten.recipes.echo.target) only: the test accuracy to reach (the
    # paper-regime sweep sets its own, the baseline's mean minus one std) and the modelled
    # source's read-ahead in batches (hasten.recipes.echo.clock).
    target: float | None = None
    lead_batches: int = 2
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ConfigError(f"seeds must be >= 1; got {self.seeds}")
        if self.train_images < 10 * self.batch_size or self.batch_size < 1:
            raise ConfigError(f"train_images must be >= 10 batches; got {self.train_images} with batch "
                              f"{self.batch_size}")
        if not 0 < self.test_images <= 10_000:
            raise ConfigError(f"test_images must be in 1..10000; got {self.test_images}")
        if self.epochs <= 0 or not self.lr > 0 or not self.lr_grid:
            raise ConfigError(f"epochs and lr must be > 0 and lr_grid non-empty; got {self.epochs}, {self.lr}, "
                              f"{self.lr_grid}")
        if not (isinstance(self.value_every, int) and self.value_every >= 0):
            raise ConfigError(f"value_every must be an integer >= 0 (steps); got {self.value_every!r}")
        if any(e < 1 for e in (*self.factors, *self.other_factors)) or any(r <= 0 for r in self.ratios):
            raise ConfigError("echo factors must be >= 1 and upstream ratios > 0")

    @classmethod
    def at_target(cls, data: str, **fields) -> "SweepConfig":
        """The sweep at a real target (``hasten.recipes.echo.target``): all 50,000 training
        images at 32x32, the speedrun network at half the ``cpu`` preset's width (16, 32, 64;
        about a quarter of its compute), batch 256, a 5-epoch budget and 75% test accuracy to reach; the
        baseline reaches 75.5% with a 4-epoch budget (a pilot run on 2 cores, 180 s)."""
        preset = dict(train_images=50_000, image_size=32, net_widths=(16, 32, 64), batch_size=256, epochs=5.0,
                      lr=0.2, pad=4, target=0.75, factors=(2.0, 4.0), other_factors=(), ratios=(2.0, 4.0, 8.0),
                      eval_points=tuple(round(0.6 + 0.05 * i, 2) for i in range(9)))
        return cls(data=data, **{**preset, **fields})

    @property
    def steps(self) -> int:
        """The baseline's budget in steps."""
        return round(self.epochs * self.train_images / self.batch_size)


@dataclass(frozen=True)
class RunSpec:
    """One training run: echo setting, learning rate, budget in steps, seed."""
    variant: str = "example-before"
    echo: float | str = 1.0  # a factor >= 1, or "auto"
    lr: float = 0.1
    steps: int = 625
    seed: int = 0
    shuffle_buffer: int | None = None  # None: default_shuffle_buffer(e or e_max, batch)
    e_max: float = 8.0

    @property
    def label(self) -> str:
        return "none" if self.echo == 1.0 else self.variant
