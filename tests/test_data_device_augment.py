import pytest
import torch
import torch.nn.functional as F

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
