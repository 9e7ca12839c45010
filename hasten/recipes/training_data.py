"""The data set a recipe trains on: loaded or given, optionally a seeded subset of the
training images, and checked to fill at least one batch.

Used by ``hasten.recipes.speedrun`` and ``hasten.recipes.train_input``. Changes the
training math: no (``train_subset`` trains on fewer images, as asked).
"""

from __future__ import annotations

import os

from hasten.data import ImageDataset, load_dataset
from hasten.errors import ConfigError

__all__ = ["load_training_data"]


def load_training_data(path: str | os.PathLike | None, *, batch_size: int, train_subset: int = 0,
                       image_size: int | None = None, dataset: ImageDataset | None = None) -> ImageDataset:
    """The data set a recipe trains on: ``dataset`` when given, else
    ``load_dataset(path, image_size=...)``; then the seeded random subset of
    ``train_subset`` training images (0: all of them). Raises ``ConfigError`` when
    the subset is larger than the set or the training set cannot fill one batch."""
    data = dataset if dataset is not None else load_dataset(path, image_size=image_size)
    if train_subset:
        if not 0 < train_subset <= len(data.train):
            raise ConfigError(f"--train-subset must be in 1..{len(data.train)}, got {train_subset}")
        data = data.with_train_subset(train_subset, seed=0)
    if len(data.train) < batch_size:
        raise ConfigError(f"the training set has {len(data.train)} images, fewer than one global batch of "
                          f"{batch_size}: pass a smaller --batch-size")
    return data
