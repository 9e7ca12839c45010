"""What every section of the GPU suite shares: the device, the sizes, the data (loaded
once) and what is computed from it once (channel statistics, FLOPs per recipe), the
output folder, the results of earlier sections, the section's clock and the suite's
overall budget, and the process-wide torch settings each section starts from."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gpu.plan import Sizes
from hasten.data import ImageDataset, load_dataset
from hasten.rundir import write_json

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


class Context:
    """One suite run. ``say`` prints a line; ``data_path`` is the dataset (for a smoke
    run without one, a synthetic image folder made on first use)."""

    def __init__(self, *, device: torch.device, sizes: Sizes, out: Path, data_path: str | None,
                 smoke: bool, peer_sdist: str | None = None, say=print, overall_s: float | None = None,
                 enforce_budgets: bool | None = None, clock=time.perf_counter):
        self.device, self.sizes, self.out, self.smoke = device, sizes, Path(out), smoke
        self.peer_sdist = peer_sdist
        self.say = say
        self.results: dict[str, dict] = {}   # section -> its record, this run
        self.partial: dict = {}              # the running section's results so far (``checkpoint``)
        self._data_path = data_path
        self._dataset: ImageDataset | None = None
        self._mean_std = None
        self._flops: dict = {}
        self._scratch = tempfile.TemporaryDirectory(prefix="hasten-gpu-suite-")
        self.scratch = Path(self._scratch.name)
        self.section: str | None = None
        self.clock = clock
        self._suite_t0 = self._t0 = clock()
        # The suite's overall budget (None: the sections' budgets added up).
        self.overall_s = sizes.total_budget_s if overall_s is None else overall_s
        # Smoke runs never cut n short unless asked: toy sizes, and on a busy CPU a budget would make them flaky.
        self.enforce_budgets = (not smoke) if enforce_budgets is None else enforce_budgets

    # -- the data ----------------------------------------------------------------
    @property
    def data_path(self) -> str:
        if self._data_path is None:
            self._data_path = str(make_toy_folder(self.scratch / "toy-cifar"))
            self.say(f"no dataset given: a synthetic toy image folder ({self._data_path})")
        return self._data_path

    def dataset(self) -> ImageDataset:
        """The dataset decoded once, with the plan's seeded subsets (smoke) applied."""
        if self._dataset is None:
            t0 = time.perf_counter()
            ds = load_dataset(self.data_path)
            if self.sizes.train_subset and self.sizes.train_subset < len(ds.train):
                ds = ds.with_train_subset(self.sizes.train_subset, seed=0)
            if self.sizes.test_subset and self.sizes.test_subset < len(ds.test):
                ds = dataclasses.replace(ds, test=ds.test.subset(self.sizes.test_subset, seed=0))
            self._dataset = ds
            self.say(f"data: {ds.summary()} in {time.perf_counter() - t0:.1f} s")
        return self._dataset

    def mean_std(self):
        """The training images' per-channel mean and std (``channel_stats``), computed once
        for every run of every section (3.7 s on CIFAR-10 when computed per run)."""
        if self._mean_std is None:
            from hasten.data.normalize import channel_stats

            self._mean_std = channel_stats(self.dataset().train.images)
        return self._mean_std

    def flops(self, recipe) -> int:
        """``hasten.recipes.speedrun.flops_per_run`` of ``recipe`` on this data, counted once per recipe."""
        if recipe not in self._flops:
            from hasten.recipes import speedrun

            self._flops[recipe] = speedrun.flops_per_run(recipe, self.dataset())
        return self._flops[recipe]

    # -- the section's clock and the overall budget ----------------------------------
    def begin(self, section: str) -> None:
        self.section = section
        self.partial = {}
        self._t0 = self.clock()

    def elapsed(self) -> float:
        """Seconds since the section began."""
        return self.clock() - self._t0

    def overall_left(self) -> float:
        """Seconds left of the suite's overall budget."""
        return self.overall_s - (self.clock() - self._suite_t0)

    def time_left(self) -> float:
        """Seconds left for the running section: its own budget or the overall one, whichever ends first."""
        return min(self.sizes.budget_s[self.section] - self.elapsed(), self.overall_left())

    def can_start(self, estimate_s: float) -> bool:
        """Whether a piece of work estimated at ``estimate_s`` still fits the time left
        (always, when budgets are not enforced: smoke runs)."""
        return not self.enforce_budgets or estimate_s <= self.time_left()

    def skip_reason(self, section: str) -> str | None:
        """Why ``section`` cannot start now (less than its ``min_s`` left overall), else None."""
        need = self.sizes.min_s.get(section, 0.0)
        left = self.overall_left()
        if self.enforce_budgets and left < need:
            return (f"overall budget: {max(left, 0):.0f} s left of {self.overall_s:.0f} s, "
                    f"{section} needs at least {need:.0f} s")
        return None

    # -- results -----------------------------------------------------------------
    def checkpoint(self, partial: dict) -> None:
        """Write the section's results so far: a run cut off keeps them, and a section
        that fails later keeps them in its error record (``gpu_suite.run_sections``)."""
        self.partial = dict(partial)
        write_json(self.out / f"{self.section}.json", {"section": self.section, "status": "partial",
                                                       "smoke": self.smoke, **partial})

    def previous(self, section: str) -> dict | None:
        """``section``'s record: from this run, else from ``<out>/<section>.json``; any
        status (a section that failed late still holds its finished runs: read the fields)."""
        if section in self.results:
            return self.results[section]
        try:
            return json.loads((self.out / f"{section}.json").read_text())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        self._scratch.cleanup()


# Process-wide torch settings a section may change and the next must not inherit.
def torch_settings() -> dict:
    """The settings every section starts from: cuDNN autotuning and TF32 (convolutions
    and matmuls), float32 matmul precision, deterministic algorithms, thread counts."""
    return {"cudnn.benchmark": torch.backends.cudnn.benchmark,
            "cudnn.deterministic": torch.backends.cudnn.deterministic,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "num_threads": torch.get_num_threads()}


def restore_torch_settings(saved: dict) -> dict:
    """Put back what ``torch_settings`` saved; returns the settings that had changed
    (name -> (saved, found)), which the section's record names."""
    now = torch_settings()
    changed = {k: (saved[k], now[k]) for k in saved if now[k] != saved[k]}
    torch.backends.cudnn.benchmark = saved["cudnn.benchmark"]
    torch.backends.cudnn.deterministic = saved["cudnn.deterministic"]
    # The precision first: it sets cuBLAS's TF32 flag as a side effect.
    torch.set_float32_matmul_precision(saved["float32_matmul_precision"])
    torch.backends.cudnn.allow_tf32 = saved["cudnn.allow_tf32"]
    torch.backends.cuda.matmul.allow_tf32 = saved["cuda.matmul.allow_tf32"]
    torch.use_deterministic_algorithms(saved["deterministic_algorithms"], warn_only=saved["deterministic_warn_only"])
    if now["num_threads"] != saved["num_threads"]:
        torch.set_num_threads(saved["num_threads"])
    return changed


@contextlib.contextmanager
def strict_fp32():
    """Float32 that is float32: TF32 off for cuDNN convolutions (on by default in
    PyTorch) and cuBLAS matmuls, and "highest" matmul precision, inside the block; the
    caller's settings after it."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[2])  # first: it sets cuBLAS's TF32 flag too
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved[:2]


def make_toy_folder(root: Path, *, train_per_class: int = 64, test_per_class: int = 20, size: int = 32) -> Path:
    """An image folder of JPEGs with the CIFAR-10 class names, each class a colour and a
    stripe direction plus noise: learnable in a few steps, so smoke accuracies move."""
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size]
    for split, n in (("train", train_per_class), ("test", test_per_class)):
        for label, name in enumerate(CIFAR10_CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            colour = np.array([(label * 53) % 256, (label * 97 + 60) % 256, (label * 151 + 120) % 256])
            stripes = np.sin((xx if label % 2 else yy) * (0.4 + 0.15 * label))[..., None]
            for i in range(n):
                img = colour + 60 * stripes + rng.normal(0, 25, (size, size, 3))
                Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(folder / f"{i:04d}.jpg", quality=90)
    return root
