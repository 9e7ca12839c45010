"""HostLoader: GpuLoader's batches, prepared per batch on the host."""

import pytest
import torch

from augment_reference import identify, offsets
from hasten.data.device_loader import Augmentation, GpuLoader
from hasten.data.host_loader import HostLoader
from hasten.data.normalize import normalize


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g), torch.arange(n)


def test_host_loader_batches_match_shapes_and_labels():
    images, labels = _data()
    loader = HostLoader(images, labels, 16, augment=Augmentation(translate=2, flip="random"))
    ys = torch.cat([y for _, y in loader])
    assert sorted(ys.tolist()) == list(range(64))
    x, _ = next(iter(loader))
    assert x.shape == (16, 3, 8, 8) and x.dtype == torch.float32


def test_unaugmented_host_batches_equal_the_device_loaders():
    images, labels = _data()
    host = HostLoader(images, labels, 16, shuffle=False)
    device = GpuLoader(images, labels, 16, shuffle=False)
    for (xh, yh), (xd, yd) in zip(host, device, strict=True):
        assert torch.equal(yh, yd)
        assert torch.allclose(xh, xd)


def test_augmented_batches_are_shifted_flipped_copies_and_reproducible():
    images, labels = _data()
    aug = Augmentation(translate=1, flip="random")
    plain = torch.cat([x for x, _ in HostLoader(images, labels, 16, shuffle=False)])
    first = [x for x, _ in HostLoader(images, labels, 16, shuffle=False, augment=aug, seed=3)]
    again = [x for x, _ in HostLoader(images, labels, 16, shuffle=False, augment=aug, seed=3)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    augmented = torch.cat(first)
    assert not torch.equal(augmented, plain)
    # The centre 6x6 of an image shifted by at most 1 pixel holds a 6x6 window of
    # the original (or its mirror image): check one per sample.
    for x, p in zip(augmented, plain):
        windows = [p[:, dy:dy + 6, dx:dx + 6] for dy in range(3) for dx in range(3)]
        assert any(torch.equal(x[:, 1:7, 1:7], w) or torch.equal(x[:, 1:7, 1:7], w.flip(-1)) for w in windows)


def test_host_batches_are_reference_translations_flips_and_cutouts():
    g = torch.Generator().manual_seed(4)
    images, labels = torch.randint(0, 256, (512, 2, 7, 9), dtype=torch.uint8, generator=g), torch.arange(512)
    loader = HostLoader(images, labels, 64, augment=Augmentation(translate=2, flip="random", cutout=3), seed=1)
    source = normalize(images, loader.mean, loader.std).numpy()
    drawn = [identify(xi, source[yi], 2, 3) for x, y in loader for xi, yi in zip(x.numpy(), y.tolist())]
    assert len(drawn) == 512
    assert {(dy, dx) for dy, dx, _, _ in drawn} == set(offsets(2))  # exactly [-2, 2]^2
    assert 0.4 < sum(m for _, _, m, _ in drawn) / len(drawn) < 0.6
    assert len({c for *_, c in drawn}) > 0.9 * 7 * 9  # cutout centres all over the image


def test_invalid_arguments_are_rejected():
    images, labels = _data()
    with pytest.raises(ValueError, match="uint8"):
        HostLoader(images.float(), labels, 8)
    with pytest.raises(ValueError, match="batch_size"):
        HostLoader(images, labels, 0)
