"""What every section of the GPU suite shares: the device, the sizes, the data (loaded
once), the output folder, the results of earlier sections, and the section's clock."""

from __future__ import annotations

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
                 smoke: bool, peer_sdist: str | None = None, say=print):
        self.device, self.sizes, self.out, self.smoke = device, sizes, Path(out), smoke
        self.peer_sdist = peer_sdist
        self.say = say
        self.results: dict[str, dict] = {}   # section -> its record, this run
        self._data_path = data_path
        self._dataset: ImageDataset | None = None
        self._scratch = tempfile.TemporaryDirectory(prefix="hasten-gpu-suite-")
        self.scratch = Path(self._scratch.name)
        self.section: str | None = None
        self._t0 = time.perf_counter()
        # Smoke runs never cut n short: toy sizes, and on a busy CPU a budget would make them flaky.
        self.enforce_budgets = not smoke

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

    # -- the section's clock -----------------------------------------------------
    def begin(self, section: str) -> None:
        self.section = section
        self._t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def time_left(self) -> float:
        return self.sizes.budget_s[self.section] - self.elapsed()

    def can_start(self, estimate_s: float) -> bool:
        """Whether a piece of work estimated at ``estimate_s`` still fits the budget."""
        return not self.enforce_budgets or self.elapsed() + estimate_s <= self.sizes.budget_s[self.section]

    # -- results -----------------------------------------------------------------
    def checkpoint(self, partial: dict) -> None:
        """Write the section's results so far: a run cut off keeps them."""
        write_json(self.out / f"{self.section}.json", {"section": self.section, "status": "partial",
                                                       "smoke": self.smoke, **partial})

    def previous(self, section: str) -> dict | None:
        """``section``'s finished record: from this run, else from ``<out>/<section>.json``."""
        if section in self.results:
            record = self.results[section]
        else:
            path = self.out / f"{section}.json"
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                return None
        return record if record.get("status") == "ok" else None

    def close(self) -> None:
        self._scratch.cleanup()


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
