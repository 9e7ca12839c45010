import pytest
import torch
import torch.nn.functional as F

from augment_reference import cutout_mask, offsets, shifted_indices
from hasten.data import device_augment as augment


def _images(n=8, c=3, h=10, w=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, h, w, generator=g)


def test_flip_is_exact_mirror_where_masked():
    x = _images()
    mask = torch.tensor([True, False] * 4)
    out = augment.flip_where(x, mask)
    for i in range(len(x)):
        expected = x[i].flip(-1) if mask[i] else x[i]
        assert torch.equal(out[i], expected)
    # mirroring twice is the identity
    assert torch.equal(augment.flip_where(out, mask), x)


def test_random_flip_flips_some_and_keeps_others():
    x = _images(n=64)
    out = augment.random_flip(x, generator=torch.Generator().manual_seed(1))
    flipped = [torch.equal(out[i], x[i].flip(-1)) for i in range(64)]
    kept = [torch.equal(out[i], x[i]) for i in range(64)]
    assert all(f or k for f, k in zip(flipped, kept))
    assert 10 < sum(flipped) < 54


def test_crop_with_zero_shift_is_identity_and_shift_moves_content():
    x = _images()
    pad = 2
    padded = F.pad(x, (pad,) * 4, mode="reflect")
    zero = torch.zeros(len(x), 2, dtype=torch.long)
    assert torch.equal(augment.crop_with_shifts(padded, zero, pad), x)
    shifts = torch.tensor([[dy, dx] for dy, dx in [(-2, -2), (-1, 0), (0, 1), (1, 2), (2, -1), (2, 2), (0, 0), (-2, 1)]])
    out = augment.crop_with_shifts(padded, shifts, pad)
    h, w = x.shape[-2:]
    for i, (dy, dx) in enumerate(shifts.tolist()):
        # content is translated: the interior region maps exactly onto the source
        ys = slice(max(0, -dy), min(h, h - dy))
        xs = slice(max(0, -dx), min(w, w - dx))
        src = x[i][:, max(0, dy):max(0, dy) + (ys.stop - ys.start), max(0, dx):max(0, dx) + (xs.stop - xs.start)]
        assert torch.equal(out[i][:, ys, xs], src)


def test_random_crop_draws_per_sample_shifts():
    x = _images(n=32)
    shifts = augment.random_shifts(32, 2, generator=torch.Generator().manual_seed(0))
    assert shifts.min() >= -2 and shifts.max() <= 2
    assert len({tuple(s) for s in shifts.tolist()}) > 5  # different samples, different shifts
    out = augment.random_crop_reflect(x, 2, generator=torch.Generator().manual_seed(0))
    assert out.shape == x.shape


@pytest.mark.parametrize("center, expected_area", [((5, 6), 16), ((0, 0), 4), ((9, 11), 9)])
def test_cutout_zeroes_a_square_clipped_at_borders(center, expected_area):
    x = torch.ones(1, 3, 10, 12)
    out = augment.cutout(x, 4, centers=torch.tensor([center]))
    zero = (out[0] == 0).all(0)
    assert int(zero.sum()) == expected_area
    assert torch.equal(out[0][0] == 0, out[0][2] == 0)  # same square in every channel


def test_cutout_random_centres_differ_per_sample():
    x = torch.ones(16, 1, 16, 16)
    out = augment.cutout(x, 4, generator=torch.Generator().manual_seed(3))
    masks = {tuple((out[i, 0] == 0).flatten().nonzero().flatten().tolist()) for i in range(16)}
    assert len(masks) > 8


def test_alternating_flip_negates_every_other_epoch():
    base = torch.rand(100, generator=torch.Generator().manual_seed(0)) < 0.5
    m0, m1, m2 = (augment.alternating_flip_mask(base, e) for e in range(3))
    assert torch.equal(m0, base) and torch.equal(m1, ~base) and torch.equal(m2, base)


def _reference_views(image: torch.Tensor, pad: int) -> dict:
    """Every crop of ``image`` (C, H, W) reflect-padded by ``pad``, plain and mirrored,
    keyed by (dy, dx, mirrored), dy and dx in [-pad, pad]."""
    _, h, w = image.shape
    views = {}
    for dy, dx in offsets(pad):
        rows, cols = (torch.tensor(i) for i in shifted_indices(h, w, dy, dx))
        crop = image[:, rows[:, None], cols[None, :]]
        views[(dy, dx, False)], views[(dy, dx, True)] = crop, crop.flip(-1)
    return views


def test_crop_with_shifts_matches_explicit_indexing():
    x = _images(n=6)
    pad = 3
    shifts = torch.tensor([[-3, 3], [3, -3], [0, 0], [-1, 2], [2, 1], [-3, -3]])
    out = augment.crop_with_shifts(F.pad(x, (pad,) * 4, mode="reflect"), shifts, pad)
    for i, (dy, dx) in enumerate(shifts.tolist()):
        assert torch.equal(out[i], _reference_views(x[i], pad)[(dy, dx, False)])


@pytest.mark.parametrize("pad", [1, 4])
def test_random_crop_reflect_is_a_reference_crop_covering_every_shift(pad):
    x = _images(n=600, c=2, h=10, w=11, seed=4)
    out = augment.random_crop_reflect(x, pad, generator=torch.Generator().manual_seed(5))
    found = []
    for image, o in zip(x, out):
        matches = [k for k, v in _reference_views(image, pad).items() if not k[2] and torch.equal(o, v)]
        assert len(matches) == 1
        found.append(matches[0][:2])
    grid = set(offsets(pad))
    assert set(found) == grid  # exactly [-pad, pad] in both directions
    assert max(found.count(s) for s in grid) < 3 * len(found) / len(grid)  # roughly uniform
    assert torch.equal(augment.random_crop_reflect(x, 0), x)


def test_random_shifts_cover_exactly_the_range():
    shifts = augment.random_shifts(4000, 3, generator=torch.Generator().manual_seed(0))
    for column in shifts.T:
        counts = torch.bincount(column + 3)
        assert len(counts) == 7 and counts.min() > 4000 / 7 * 0.8  # each of -3..3, none beyond


def _cutout_reference(x: torch.Tensor, size: int, centers) -> torch.Tensor:
    out = x.clone()
    for i, (cy, cx) in enumerate(centers):
        out[i][:, torch.tensor(cutout_mask(*x.shape[-2:], size, cy, cx))] = 0
    return out


@pytest.mark.parametrize("size", [3, 4])
def test_cutout_zeroes_the_reference_square_at_every_centre(size):
    x = _images(n=900, c=2, h=6, w=7, seed=6) + 10  # no pixel is 0 before cutout
    out = augment.cutout(x, size, generator=torch.Generator().manual_seed(7))
    # Each output equals the reference for exactly one centre; every centre occurs.
    centres = [(cy, cx) for cy in range(6) for cx in range(7)]
    masks = [torch.tensor(cutout_mask(6, 7, size, *c)) for c in centres]
    found = []
    for i in range(len(x)):
        zero = (out[i] == 0).all(0)
        assert torch.equal(out[i][:, ~zero], x[i][:, ~zero])  # the rest untouched
        match = [c for c, m in zip(centres, masks) if torch.equal(m, zero)]
        assert len(match) == 1
        found.append(match[0])
    assert set(found) == set(centres)
    given = torch.tensor(found[:5])
    assert torch.equal(augment.cutout(x[:5], size, centers=given), _cutout_reference(x[:5], size, found[:5]))


def test_draws_come_from_the_given_generator():
    """Same generator seed, same result, whatever the global RNG did in between; another
    seed, another result: the functions draw from ``generator`` and nothing else."""
    x = _images(n=64)

    def twice(f):
        torch.manual_seed(123)
        a = f(torch.Generator().manual_seed(5))
        torch.manual_seed(456)
        b = f(torch.Generator().manual_seed(5))
        c = f(torch.Generator().manual_seed(6))
        assert torch.equal(a, b) and not torch.equal(a, c)

    twice(lambda g: augment.random_shifts(64, 2, generator=g))
    twice(lambda g: augment.random_crop_reflect(x, 2, generator=g))
    twice(lambda g: augment.random_flip(x, generator=g))
    twice(lambda g: augment.cutout(x, 3, generator=g))
    assert augment.random_shifts(5, 2).shape == (5, 2) and augment.random_shifts(5, 2).dtype == torch.int64


def test_cutout_of_size_one_zeroes_one_pixel():
    x = _images(n=4) + 10
    out = augment.cutout(x, 1, centers=torch.tensor([[0, 0], [3, 4], [9, 11], [5, 0]]))
    assert [int((o == 0).all(0).sum()) for o in out] == [1, 1, 1, 1]
    assert (out[1][:, 3, 4] == 0).all() and torch.equal(augment.cutout(x, 0), x)


def test_crop_flip_is_the_reference_crop_mirrored_for_the_indexed_images():
    x = _images(n=6, c=2, h=5, w=7)
    pad = 2
    index = torch.tensor([4, 0, 4, 5, 1])
    shifts = torch.tensor([[-2, 2], [2, -1], [0, 0], [1, 1], [-1, -2]])
    flips = torch.tensor([True, False, False, True, True])
    out = augment.crop_flip(F.pad(x, (pad,) * 4, mode="reflect"), pad, shifts, flips, index=index)
    assert out.shape == (5, 2, 5, 7) and out.is_contiguous(memory_format=torch.channels_last)
    for i, (src, (dy, dx), m) in enumerate(zip(index.tolist(), shifts.tolist(), flips.tolist())):
        assert torch.equal(out[i], _reference_views(x[src], pad)[(dy, dx, m)])
    # Neither shift nor mirror: the images themselves.
    assert torch.equal(augment.crop_flip(x, 0), x)
    assert torch.equal(augment.crop_flip(x, 0, flips=flips.new_ones(6)), x.flip(-1))
