import pytest
import torch

from augment_reference import identify, offsets
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


def _identified(loader, images, epochs, pad, cutout):
    """Per epoch, {example index: (dy, dx, mirrored, cutout centre)} identified against
    the reference (``augment_reference.identify``) for every example the loader yields."""
    source = normalize(images, loader.mean, loader.std).numpy()
    per_epoch = []
    for _ in range(epochs):
        seen = {}
        for x, y in loader:
            for xi, yi in zip(x.numpy(), y.tolist()):
                seen[yi] = identify(xi, source[yi], pad, cutout)
        per_epoch.append(seen)
    return per_epoch


def _rect_data(n, seed=0):
    """Non-square images, so no crop of one equals the mirror of another."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 2, 7, 9), dtype=torch.uint8, generator=g), torch.arange(n)


def test_batches_are_reference_translations_flips_and_cutouts():
    images, labels = _rect_data(640)
    loader = GpuLoader(images, labels, 64, augment=Augmentation(translate=2, flip="random", cutout=3), seed=1)
    epochs = _identified(loader, images, 2, pad=2, cutout=3)
    drawn = [v for e in epochs for v in e.values()]
    assert len(drawn) == 1280
    assert {(dy, dx) for dy, dx, _, _ in drawn} == set(offsets(2))  # exactly [-2, 2]^2
    assert 0.4 < sum(m for _, _, m, _ in drawn) / len(drawn) < 0.6
    assert {c for *_, c in drawn} == {(cy, cx) for cy in range(7) for cx in range(9)}  # every centre
    assert epochs[0] != epochs[1]  # fresh draws each epoch


@pytest.mark.parametrize("translate, flip, cutout", [(1, "none", 0), (0, "random", 0), (0, "none", 4), (3, "alternating", 2)])
def test_each_augmentation_alone_is_applied_as_asked(translate, flip, cutout):
    images, labels = _rect_data(320)
    loader = GpuLoader(images, labels, 32, augment=Augmentation(translate=translate, flip=flip, cutout=cutout))
    drawn = list(_identified(loader, images, 1, pad=translate, cutout=cutout)[0].values())
    assert {(dy, dx) for dy, dx, _, _ in drawn} == set(offsets(translate))
    assert 0.35 < sum(m for _, _, m, _ in drawn) / len(drawn) < 0.65 if flip != "none" else not any(m for _, _, m, _ in drawn)
    assert all(c is not None for *_, c in drawn) if cutout else True


def test_alternating_flip_alternates_per_example_across_shuffled_epochs():
    images, labels = _rect_data(256)
    loader = GpuLoader(images, labels, 32, augment=Augmentation(translate=1, flip="alternating"), seed=2)
    epochs = [{k: m for k, (_, _, m, _) in e.items()} for e in _identified(loader, images, 4, pad=1, cutout=0)]
    assert 0.35 < sum(epochs[0].values()) / 256 < 0.65  # a random half first
    for k in range(256):
        assert epochs[1][k] != epochs[0][k] and epochs[2][k] == epochs[0][k] and epochs[3][k] == epochs[1][k]


def test_each_rank_yields_its_rows_of_the_global_batch_augmented():
    images, labels = _rect_data(128)
    aug = Augmentation(translate=2, flip="random", cutout=3)
    single = GpuLoader(images, labels, 32, augment=aug, seed=5)
    ranks = [GpuLoader(images, labels, 16, augment=aug, seed=5, rank=r, world_size=2) for r in range(2)]
    source = normalize(images, single.mean, single.std).numpy()
    batches = list(zip(single, *ranks))
    assert len(batches) == 4
    for (_, y), (x0, y0), (x1, y1) in batches:
        assert torch.equal(y0, y[:16]) and torch.equal(y1, y[16:])  # rank r: rows [16 r, 16 r + 16)
        for xi, yi in zip(torch.cat([x0, x1]).numpy(), torch.cat([y0, y1]).tolist()):
            identify(xi, source[yi], 2, 3)  # each is an augmented copy of its own example


def test_invalid_arguments_are_rejected():
    images, labels = _data()
    with pytest.raises(ValueError, match="Invalid flip mode 'sideways'; accepted: none, random, alternating"):
        Augmentation(flip="sideways")
    for bad in (dict(translate=-1), dict(cutout=-2)):
        with pytest.raises(ValueError, match="translate and cutout must be >= 0"):
            Augmentation(**bad)
    with pytest.raises(ValueError, match="uint8"):
        GpuLoader(images.float(), labels, 8)
    with pytest.raises(ValueError, match="uint8"):
        GpuLoader(images[0], labels, 8)
    with pytest.raises(ValueError, match=r"labels must have shape \(64,\), got \(63,\)"):
        GpuLoader(images, labels[:63], 8)
    for batch_size in (0, True, 2.0):
        with pytest.raises(ValueError, match="Invalid batch_size"):
            GpuLoader(images, labels, batch_size)
    with pytest.raises(ValueError, match="Invalid rank 2 for world_size 2"):
        GpuLoader(images, labels, 8, rank=2, world_size=2)
    with pytest.raises(ValueError, match="Invalid rank -1"):
        GpuLoader(images, labels, 8, rank=-1, world_size=2)
    with pytest.raises(ValueError, match="64 examples cannot fill one global batch of 66"):
        GpuLoader(images, labels, 33, world_size=2)
    assert len(GpuLoader(images, labels, 64)) == 1  # exactly one full batch is enough


def test_batch_count_order_and_last_partial_batch():
    images, labels = _data(n=50)
    assert len(GpuLoader(images, labels, 16)) == 3  # drop_last: 50 // 16
    keep = GpuLoader(images, labels, 16, shuffle=False, drop_last=False)
    assert len(keep) == 4
    ys = [y for _, y in keep]
    assert [len(y) for y in ys] == [16, 16, 16, 2] and torch.equal(torch.cat(ys), torch.arange(50))
    ranks = [GpuLoader(images, labels, 16, shuffle=False, drop_last=False, rank=r, world_size=2) for r in range(2)]
    assert [len(r) for r in ranks] == [2, 2]
    assert [y.tolist() for _, y in ranks[1]] == [list(range(16, 32)), list(range(48, 50))]
    assert [len(y) for _, y in ranks[0]] == [16, 16]
    assert len(GpuLoader(images, labels, 60, drop_last=False)) == 1  # fewer than a batch: allowed without drop_last


def test_seed_dtype_layout_and_given_statistics():
    images, labels = _data()
    aug = Augmentation(translate=2, flip="random", cutout=2)
    a, b = (torch.cat([x for x, _ in GpuLoader(images, labels, 16, augment=aug, seed=s)]) for s in (0, 1))
    assert not torch.equal(a, b)  # the seed changes the draws
    loader = GpuLoader(images, labels, 16, augment=aug, dtype=torch.bfloat16, channels_last=True)
    x, _ = next(iter(loader))
    assert x.dtype == torch.bfloat16 and x.is_contiguous(memory_format=torch.channels_last)
    x, _ = next(iter(GpuLoader(images, labels, 16)))
    assert x.dtype == torch.float32 and x.is_contiguous()
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    loader = GpuLoader(images, labels, 16, mean=mean, std=std, shuffle=False)
    assert torch.allclose(next(iter(loader))[0], normalize(images[:16], mean, std))
    half = GpuLoader(images, labels, 16, mean=mean)  # both or neither: the data's own statistics
    assert half.mean == pytest.approx(channel_stats(images)[0]) and half.std == pytest.approx(channel_stats(images)[1])


@pytest.mark.gpu
def test_gpu_loader_keeps_everything_on_the_device():
    images, labels = _data()
    loader = GpuLoader(images, labels, 16, device="cuda", augment=Augmentation(2, "alternating", 2))
    x, y = next(iter(loader))
    assert x.is_cuda and y.is_cuda


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ATen ops run under it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_epoch_is_augmented_once_and_each_batch_is_a_slice(channels_last):
    """airbench's layout of the work: the whole epoch cropped, mirrored and cut out in
    a fixed number of ops, then every batch a view of it (no copy per batch)."""
    images, labels = _rect_data(256)
    aug = Augmentation(translate=2, flip="alternating", cutout=3)
    epoch_ops = []
    for batch_size in (8, 64):
        loader = GpuLoader(images, labels, batch_size, augment=aug, channels_last=channels_last)
        it = iter(loader)
        with _Ops() as first:
            x0, _ = next(it)
        epoch_ops.append(first.ops)
        for _ in range(len(loader) - 1):
            with _Ops() as batch:
                x, y = next(it)
            assert set(batch.ops) <= {"slice"}, batch.ops  # views only: no gather, no copy
            assert x.untyped_storage().data_ptr() == x0.untyped_storage().data_ptr()
            layout = torch.channels_last if channels_last else torch.contiguous_format
            assert x.is_contiguous(memory_format=layout)
    assert epoch_ops[0] == epoch_ops[1]  # 32 batches or 4: the same epoch work
    # Gathers: the images (crop and mirror in one), and the shifts, flips, cutout
    # centres and labels put in batch order.
    assert epoch_ops[0].count("index") == 5
