"""load_training_data (hasten.recipes.training_data): the seeded subset and the one-batch check."""

import pytest
import torch

from hasten.data import ImageDataset, Split
from hasten.errors import ConfigError
from hasten.recipes.training_data import load_training_data


def _class_by_class(n=100):
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 3, 2, 2).contiguous()
    labels = torch.arange(n) // 10  # stored class by class, like an image folder
    return ImageDataset("x", list("abcdefghij"), Split(images, labels), Split(images, labels), "mem")


def test_train_subset_is_seeded_and_keeps_all_classes():
    data = _class_by_class()
    a, b = (load_training_data(None, dataset=data, batch_size=1, train_subset=50) for _ in range(2))
    assert torch.equal(a.train.labels, b.train.labels) and len(a.train) == 50
    assert len(set(a.train.labels.tolist())) == 10
    assert torch.equal(a.train.images[:, 0, 0, 0].long() // 10, a.train.labels)  # images stay paired with labels
    with pytest.raises(ValueError, match="train-subset"):
        load_training_data(None, dataset=data, batch_size=1, train_subset=101)


def test_zero_subset_is_the_whole_set_and_a_batch_must_fit():
    data = _class_by_class()
    assert load_training_data(None, dataset=data, batch_size=100) is data
    with pytest.raises(ConfigError, match="100 images, fewer than one global batch of 128: pass a smaller --batch-size"):
        load_training_data(None, dataset=data, batch_size=128)
    with pytest.raises(ConfigError, match="fewer than one global batch of 64"):
        load_training_data(None, dataset=data, batch_size=64, train_subset=32)
