import pytest
import torch

from hasten.nn.whitening import extract_patches, init_whitening_conv, whitening_filters


def test_whitening_decorrelates_patches():
    torch.manual_seed(0)
    # strongly correlated channels and neighbouring pixels
    base = torch.randn(200, 1, 12, 12)
    images = torch.cat([base, 0.8 * base + 0.2 * torch.randn_like(base), base.roll(1, -1) + 0.3 * torch.randn_like(base)], 1)
    filters = whitening_filters(images, kernel_size=2, eps=1e-6)
    assert filters.shape == (24, 3, 2, 2)
    patches = extract_patches(images, 2).reshape(-1, 12)
    raw_cov = patches.T @ patches / len(patches)
    assert (raw_cov - torch.diag(raw_cov.diag())).abs().max() > 0.5  # correlated before
    white = patches @ filters[:12].reshape(12, 12).T
    cov = white.T @ white / len(white)
    assert torch.allclose(cov, torch.eye(12), atol=2e-2)
    assert torch.equal(filters[12:], -filters[:12])


def test_init_whitening_conv_freezes_weight_and_checks_shape():
    conv = torch.nn.Conv2d(3, 24, 2)
    init_whitening_conv(conv, torch.randn(50, 3, 8, 8))
    assert not conv.weight.requires_grad
    assert torch.equal(conv.bias, torch.zeros(24)) and conv.bias.requires_grad  # airbench: starts at 0, trains
    with pytest.raises(ValueError, match="24 output channels"):
        init_whitening_conv(torch.nn.Conv2d(3, 16, 2), torch.randn(5, 3, 8, 8))
