"""What the GPU suite runs and how long each section may take: the full plan for one
H100 in at most 20 minutes including start-up, and the smoke plan (CPU, toy sizes).

The budgets are estimates for an H100 (airbench94 is published at 3.83 s per run
on an A100). Every piece of work is checked against the time left before it starts
(``Context.can_start``): the section's own budget and the suite's overall budget,
whichever ends first; a section records how many runs it made (``n_runs`` against
``n_planned``) and says ``cut_short``, and a section that cannot start in the time
left is skipped with the reason. ``pm`` writes a mean with its 95% interval
(``mean_ci`` of benchmarks/_common.py, Student t) as every table reports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SECTIONS = ("speedrun", "ablation", "echo", "large_batch", "throughput", "tests")
H100_LIMIT_S = 20 * 60
# Machine start, copying the tree, installing nothing (the peer is extracted, not
# built), importing torch and decoding CIFAR-10-JPEG once (about 6 s on 2 cores).
STARTUP_S = 120


@dataclass(frozen=True)
class Sizes:
    """Every size the sections use; ``FULL`` and ``SMOKE`` below."""
    budget_s: dict = field(default_factory=dict)   # section -> seconds
    # section -> the least time worth starting it with (less left overall: skipped, with the reason)
    min_s: dict = field(default_factory=dict)
    train_subset: int = 0          # seeded random training subset (0: all 50,000)
    test_subset: int = 0           # seeded random test subset (0: all 10,000)
    matmul_seconds: float = 3.0    # measuring the device's matmul rate
    # speedrun: every preset ("+compile": torch.compile) and the peer (airbench 0.1.8's train94,
    # in a process of its own), each after one untimed full run, then n runs of each interleaved
    speedrun_presets: tuple = ("airbench94",)
    speedrun_runs: int = 20
    compile_s: float = 0.0         # charged for a compiling job's warm-up before it starts (an estimate)
    recipe_changes: dict = field(default_factory=dict)  # e.g. fewer epochs (smoke)
    peer: bool = True              # the peer joins the speedrun's interleaving where it can run (CUDA)
    # ablation: the ladder of the first speedrun preset, to the peer's mean accuracy
    ablation_repeats: int = 2
    # echo: the GPU preset of ``hasten echo`` behind slow storage at R about echo_ratio
    echo_ratio: float = 6.0
    echo_factors: tuple = (2.0, 4.0, 6.0)   # fixed factors; the best of them is "the best fixed e"
    echo_seeds: int = 3
    echo_changes: dict = field(default_factory=dict)  # EchoRunConfig fields over the device preset
    # large_batch: ResNet-18, SGD + linear scaling + warm-up against LARS, one epoch budget
    lb_width: int = 64
    lb_batches: tuple = (512, 2048, 8192)
    lb_epochs: float | None = None     # None: as many as the section's budget allows (clamped below)
    lb_epochs_range: tuple = (6.0, 50.0)
    lb_warmup_epochs: float = 2.0
    lb_seeds: int = 2
    lb_replica_batch: int = 16         # group BN: images per simulated replica
    lb_bn_groups: tuple = (1, 4)       # replicas per BN group (k x replica_batch images per BN)
    lb_bn_global_batch: int = 512
    # throughput: ResNet-18 steps (bf16/fp32 x channels_last/not), and two loaders
    # A multiple of 8 on the CPU: oneDNN's 1x1 stride-2 weight gradient in channels_last
    # (ResNet's downsample shortcuts) writes out of bounds for fewer than 8 input channels on
    # AVX2 (segfault, abort or hang; oneDNN issue 6035; torch 2.13's oneDNN 3.12).
    tp_width: int = 64
    tp_batch: int = 512
    tp_warmup: int = 5
    tp_steps: int = 20
    tp_repeats: int = 3
    tp_loader_epochs: int = 2
    tp_loader_workers: int = 8
    # tests: pytest -m gpu
    tests_timeout_s: float = 300.0

    @property
    def total_budget_s(self) -> float:
        return sum(self.budget_s.values())


FULL = Sizes(
    budget_s={"speedrun": 360, "ablation": 150, "echo": 170, "large_batch": 250, "throughput": 60, "tests": 60},
    min_s={"speedrun": 60, "ablation": 40, "echo": 60, "large_batch": 60, "throughput": 20, "tests": 20},
    speedrun_presets=("airbench94", "airbench94+compile"), compile_s=90.0,
)

# Every section on the CPU at toy sizes, a minute or two on 2 shared cores: what a test runs.
SMOKE = Sizes(
    budget_s={"speedrun": 60, "ablation": 60, "echo": 60, "large_batch": 60, "throughput": 30, "tests": 60},
    min_s={"speedrun": 5, "ablation": 5, "echo": 5, "large_batch": 5, "throughput": 5, "tests": 5},
    train_subset=512, test_subset=200, matmul_seconds=0.3,
    speedrun_presets=("tiny",), speedrun_runs=2, recipe_changes={"epochs": 1},
    ablation_repeats=1,
    echo_ratio=2.0, echo_factors=(2.0,), echo_seeds=1,
    echo_changes={"target": 0.12, "max_fresh": 512, "eval_every": 4, "eval_images": 200, "batch_size": 32},
    lb_width=4, lb_batches=(32, 128), lb_epochs=1.0, lb_warmup_epochs=0.5, lb_seeds=1,
    lb_replica_batch=8, lb_bn_groups=(1,), lb_bn_global_batch=32,
    tp_width=8, tp_batch=32, tp_warmup=1, tp_steps=2, tp_repeats=1, tp_loader_epochs=1, tp_loader_workers=1,
)


def pm(stats: dict, scale: float = 1.0, fmt: str = ".2f", unit: str = "") -> str:
    """``mean ± ci95`` with ``scale`` applied (``mean (n=1)`` for one value, ``-`` for none)."""
    if stats.get("mean") is None:
        return "-"
    mean = f"{stats['mean'] * scale:{fmt}}{unit}"
    if stats.get("ci95") is None:
        return f"{mean} (n={stats.get('n', 1)})"
    return f"{mean} ± {stats['ci95'] * scale:{fmt}}{unit}"


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
