import pytest
import torch

from hasten.data.device_loader import Augmentation, GpuLoader
from hasten.data.normalize import channel_stats, normalize


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g), torch.arange(n)


def test_epoch_covers_every_example_once_and_shuffles():
    images, labels = _data()
    loader = GpuLoader(images, labels, 16, augment=Augmentation())
    first = torch.cat([y for _, y in loader])
    second = torch.cat([y for _, y in loader])
    assert sorted(first.tolist()) == list(range(64))
    assert not torch.equal(first, second)


def test_unaugmented_batches_are_the_normalized_images():
    images, labels = _data()
    mean, std = channel_stats(images)
    loader = GpuLoader(images, labels, 16, mean=mean, std=std)
    for x, y in loader:
        assert torch.allclose(x, normalize(images[y], mean, std))


def test_normalized_data_has_zero_mean_unit_std():
    images, labels = _data(n=256)
    loader = GpuLoader(images, labels, 256)
    x = loader.images
    assert x.mean(dim=(0, 2, 3)).abs().max() < 1e-4
    assert (x.std(dim=(0, 2, 3)) - 1).abs().max() < 1e-2


def test_alternating_flip_shows_each_image_both_ways_over_two_epochs():
    images, labels = _data()
    loader = GpuLoader(images, labels, 64, shuffle=False, augment=Augmentation(flip="alternating"))
    (x0, _), = list(loader)
    (x1, _), = list(loader)
    for i in range(64):
        assert torch.equal(x1[i], x0[i].flip(-1))


def test_ranks_split_each_global_batch_like_one_process():
    images, labels = _data()
    aug = Augmentation(translate=2, flip="random", cutout=3)
    single = GpuLoader(images, labels, 16, augment=aug, seed=5)
    ranks = [GpuLoader(images, labels, 8, augment=aug, seed=5, rank=r, world_size=2) for r in range(2)]
    for (x, y), (x0, y0), (x1, y1) in zip(single, *ranks):
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)


def test_invalid_arguments_are_rejected():
    images, labels = _data()
    with pytest.raises(ValueError, match="flip"):
        Augmentation(flip="sideways")
    with pytest.raises(ValueError, match="uint8"):
        GpuLoader(images.float(), labels, 8)
    with pytest.raises(ValueError, match="rank"):
        GpuLoader(images, labels, 8, rank=2, world_size=2)


@pytest.mark.gpu
def test_gpu_loader_keeps_everything_on_the_device():
    images, labels = _data()
    loader = GpuLoader(images, labels, 16, device="cuda", augment=Augmentation(2, "alternating", 2))
    x, y = next(iter(loader))
    assert x.is_cuda and y.is_cuda
