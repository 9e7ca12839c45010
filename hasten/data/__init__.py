"""Datasets as uint8 tensors: canonical CIFAR-10 and image folders, and loaders that feed them.

``load_dataset(path)`` (``hasten.data.sources``) is the one entry point; it
returns an ``ImageDataset`` of two ``Split`` s (``hasten.data.dataset``). Loaders,
augmentation and normalisation live in their own modules (``device_loader``,
``host_loader``, ``device_augment``, ``host_augment``, ``normalize``); import
them from there.
"""

from hasten.data.dataset import ImageDataset, Split
from hasten.data.sources import load_dataset

__all__ = ["ImageDataset", "Split", "load_dataset"]
