"""The echo run's test images (``EvalSet``): decoded once at the training resolution, kept
in host memory, a fixed order whose first images detect the target quickly.

Used by ``hasten.recipes.echo.run`` and ``hasten.recipes.echo.compare``. Changes the
training math: no.
"""

from __future__ import annotations

import numpy as np
import torch

from hasten.data.normalize import normalize
from hasten.errors import DataError
from hasten.recipes.echo.network import mean_std_on
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.sources import open_source


class EvalSet:
    """Test images decoded once (at the training resolution) and kept in host memory.

    ``store``: the test split as a store of shards (``EvalSet.of(data, ...)`` opens it)."""

    def __init__(self, store, image_size: int, device: torch.device | str):
        # The whole image at the training size, as the training images before their crop.
        batches = list(ShardLoader(store, batch_size=1000, image_size=image_size, train=False, crop="whole"))
        if not batches:
            raise DataError(f"the test split holds no readable image ({sum(store.examples)} listed)")
        self.images = torch.cat([x for x, _ in batches])
        self.labels = torch.cat([y for _, y in batches])
        self.device = torch.device(device)
        self.mean, self.std = mean_std_on(self.device)
        # A fixed, class-balanced-by-chance subset to detect the target quickly.
        self.order = torch.from_numpy(np.random.default_rng(12345).permutation(len(self.labels)))

    @classmethod
    def of(cls, data: str, image_size: int, device: torch.device | str) -> EvalSet:
        """The test split of ``data`` (a folder, archive, shard directory or URL)."""
        return cls(open_source(data, "test"), image_size, device)

    def batches(self, n: int | None = None, batch_size: int = 2000):
        """Normalised (images, labels) on the device: the first ``n`` of the fixed order (None: all)."""
        idx = self.order[:n] if n else self.order
        for part in idx.split(batch_size):
            x = normalize(self.images[part].to(self.device, non_blocking=True), self.mean, self.std)
            yield x, self.labels[part].to(self.device)
