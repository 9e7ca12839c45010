"""Host augmentation: random and keyed crop/flip of (N, H, W, C) uint8 chunks."""

import numpy as np
import pytest

from hasten.data.host_augment import crop_flip, keyed_crop_flip


def test_keyed_augmentation_depends_on_example_not_on_batch():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    keys = np.arange(6)
    whole = keyed_crop_flip(images, keys, seed=3)
    parts = np.concatenate([keyed_crop_flip(images[:2], keys[:2], seed=3), keyed_crop_flip(images[2:], keys[2:], seed=3)])
    assert np.array_equal(whole, parts)
    copies = [keyed_crop_flip(images, keys, seed=3, copies=np.full(6, c)) for c in range(1, 4)]
    assert sum(np.array_equal(whole[i], c[i]) for c in copies for i in range(6)) <= 3


def test_host_crop_flip_matches_the_device_augmentation():
    import torch
    import torch.nn.functional as F

    from hasten.data.device_augment import crop_with_shifts, flip_where
    from hasten.data.host_augment import apply_crop_flip

    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (5, 6, 7, 3), dtype=np.uint8)
    shifts = rng.integers(-2, 3, size=(5, 2))
    flipped = np.array([True, False, True, False, False])
    host = apply_crop_flip(images, shifts[:, 0] + 2, shifts[:, 1] + 2, flipped, pad=2)
    nchw = torch.from_numpy(images).permute(0, 3, 1, 2)
    device = flip_where(crop_with_shifts(F.pad(nchw, (2,) * 4, mode="reflect"), torch.from_numpy(shifts), 2),
                        torch.from_numpy(flipped))
    assert np.array_equal(host, device.permute(0, 2, 3, 1).numpy())


def test_crop_flip_without_shift_or_flip_is_the_identity_and_checks_its_input():
    images = np.random.default_rng(2).integers(0, 256, (4, 5, 5, 3), dtype=np.uint8)
    assert np.array_equal(crop_flip(images, np.random.default_rng(0), pad=0, flip=False), images)
    with pytest.raises(ValueError, match="N, H, W, C"):
        crop_flip(images[0], np.random.default_rng(0))
    with pytest.raises(ValueError, match="pad"):
        crop_flip(images, np.random.default_rng(0), pad=-1)
