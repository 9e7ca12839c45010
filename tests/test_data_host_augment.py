"""Host augmentation: random and keyed crop/flip of (N, H, W, C) uint8 chunks."""

import numpy as np
import pytest

from augment_reference import offsets, shifted_indices
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


def _reference_views(image: np.ndarray, pad: int) -> dict:
    """Every crop of ``image`` (H, W, C) reflect-padded by ``pad``, plain and mirrored,
    keyed by (dy, dx, mirrored) with dy, dx in [-pad, pad]."""
    h, w, _ = image.shape
    views = {}
    for dy, dx in offsets(pad):
        rows, cols = shifted_indices(h, w, dy, dx)
        crop = image[np.ix_(rows, cols)]
        views[(dy, dx, False)], views[(dy, dx, True)] = crop, crop[:, ::-1]
    return views


def _drawn_views(images: np.ndarray, out: np.ndarray, pad: int) -> list:
    """For each output image, the one (dy, dx, mirrored) whose reference view it equals."""
    found = []
    for image, o in zip(images, out):
        matches = [key for key, view in _reference_views(image, pad).items() if np.array_equal(o, view)]
        assert len(matches) == 1, f"output matches {len(matches)} reference views"
        found.append(matches[0])
    return found


def _assert_covers_exactly(found: list, pad: int, flip: bool) -> None:
    shifts = {(dy, dx) for dy, dx, _ in found}
    grid = set(offsets(pad))
    assert shifts == grid  # every shift in [-pad, pad]^2 drawn, none outside
    mirrored = np.mean([m for *_, m in found])
    assert (0.4 < mirrored < 0.6) if flip else mirrored == 0
    # roughly uniform over the (2 pad + 1)^2 offsets: no offset more than 3x its share
    counts = np.bincount([(dy + pad) * (2 * pad + 1) + dx + pad for dy, dx, _ in found])
    assert counts.max() < 3 * len(found) / len(grid)


@pytest.mark.parametrize("pad, flip", [(4, True), (2, False), (1, True)])
def test_crop_flip_is_a_reference_crop_and_covers_every_shift(pad, flip):
    images = np.random.default_rng(3).integers(0, 256, (800, 10, 11, 2), dtype=np.uint8)
    out = crop_flip(images, np.random.default_rng(4), pad=pad, flip=flip)
    _assert_covers_exactly(_drawn_views(images, out, pad), pad, flip)


@pytest.mark.parametrize("pad, flip", [(4, True), (3, False)])
def test_keyed_crop_flip_is_a_reference_crop_and_covers_every_shift(pad, flip):
    images = np.random.default_rng(5).integers(0, 256, (800, 10, 11, 2), dtype=np.uint8)
    keys = np.arange(800) * 7 + 11
    out = keyed_crop_flip(images, keys, seed=9, pad=pad, flip=flip)
    _assert_covers_exactly(_drawn_views(images, out, pad), pad, flip)
    # another seed, another draw for the same examples
    other = keyed_crop_flip(images, keys, seed=10, pad=pad, flip=flip)
    assert np.mean([np.array_equal(a, b) for a, b in zip(out, other)]) < 0.2


def test_keyed_draws_of_one_seed_are_no_reshuffle_of_another_seeds():
    """The stream passes seed = base + epoch: epoch 1's crops must be new draws, not
    epoch 0's handed to other examples (as combining seed ^ key would give)."""
    images = np.random.default_rng(6).integers(0, 256, (64, 10, 11, 2), dtype=np.uint8)
    keys = np.arange(64)
    per_seed = [sorted(_drawn_views(images, keyed_crop_flip(images, keys, seed=s), 4)) for s in range(3)]
    assert per_seed[0] != per_seed[1] and per_seed[1] != per_seed[2]


_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One splitmix64 output (Steele, Lea, Flood 2014; Vigna's reference constants),
    in Python integers modulo 2**64."""
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


@pytest.mark.parametrize("seed, pad, with_copies", [(7, 4, True), (2**40 + 3, 2, False), (-5, 3, True)])
def test_keyed_draws_are_the_documented_hash_of_seed_key_and_copy(seed, pad, with_copies):
    """h = splitmix64(splitmix64(splitmix64(seed) ^ key) ^ copy); dy = h mod (2 pad + 1),
    dx = (h >> 16) mod (2 pad + 1), mirrored = bit 32 of h: computed one example at a
    time in Python integers, compared with the crop found in the output."""
    images = np.random.default_rng(8).integers(0, 256, (40, 10, 11, 2), dtype=np.uint8)
    keys = np.arange(40) * 1_000_003 + 17
    copies = np.arange(40) % 3 if with_copies else None
    out = keyed_crop_flip(images, keys, seed=seed, copies=copies, pad=pad)
    span = 2 * pad + 1
    for i, found in enumerate(_drawn_views(images, out, pad)):
        h = _splitmix64(_splitmix64(_splitmix64(seed & _M64) ^ int(keys[i])) ^ (int(copies[i]) if with_copies else 0))
        assert found == (h % span - pad, (h >> 16) % span - pad, bool((h >> 32) & 1)), i
    if not with_copies:
        assert np.array_equal(out, keyed_crop_flip(images, keys, seed=seed, copies=np.zeros(40, int), pad=pad))


def test_defaults_are_the_standard_cifar_augmentation_and_one_image_is_augmented_too():
    """Defaults: pad 4 (shifts in [-4, 4]) and random flips, for crop_flip and keyed_crop_flip."""
    images = np.random.default_rng(9).integers(0, 256, (800, 10, 11, 2), dtype=np.uint8)
    _assert_covers_exactly(_drawn_views(images, crop_flip(images, np.random.default_rng(10)), 4), 4, True)
    _assert_covers_exactly(_drawn_views(images, keyed_crop_flip(images, np.arange(800), seed=1), 4), 4, True)
    # A batch of one is augmented like any other: over many draws, most are moved.
    one = images[:1]
    moved = [not np.array_equal(crop_flip(one, np.random.default_rng(s)), one) for s in range(20)]
    moved += [not np.array_equal(keyed_crop_flip(one, np.array([k]), seed=0), one) for k in range(20)]
    assert sum(moved) >= 30
