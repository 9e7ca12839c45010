import numpy as np
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


def _images_with_small_directions(n=60, h=7, w=8, seed=0):
    """Images with a non-zero mean, channels of different scales and one channel
    nearly a copy of another: the patch covariance has distinct eigenvalues
    spanning several decades, some near ``eps``."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, 3, h, w, generator=g, dtype=torch.float64)
    images = base * torch.tensor([1.0, 0.5, 0.2], dtype=torch.float64).view(1, 3, 1, 1) + 0.3
    images[:, 2] = images[:, 0] + 0.02 * base[:, 2]
    return images


def _reference_filters(images: torch.Tensor, k: int, eps: float) -> np.ndarray:
    """Patches cut one by one, covariance and eigen-decomposition in float64 numpy,
    largest eigenvalue first: rows V^T / sqrt(lambda + eps) as (C*k*k, C, k, k)."""
    x = images.double().numpy()
    n, c, h, w = x.shape
    patches = np.stack([x[i, :, y:y + k, z:z + k].reshape(-1)
                        for i in range(n) for y in range(h - k + 1) for z in range(w - k + 1)])
    covariance = patches.T @ patches / len(patches)  # not centred, as airbench
    eigenvalues, eigenvectors = np.linalg.eigh(covariance)
    order = np.argsort(eigenvalues)[::-1]
    eigenvalues, eigenvectors = eigenvalues[order], eigenvectors[:, order]
    return (eigenvectors.T / np.sqrt(eigenvalues + eps)[:, None]).reshape(c * k * k, c, k, k)


@pytest.mark.parametrize("k, eps", [(2, 5e-4), (3, 1e-2), (2, 0.0)])
def test_whitening_filters_match_a_float64_eigendecomposition(k, eps):
    images = _images_with_small_directions()
    filters = whitening_filters(images, kernel_size=k, eps=eps)
    assert filters.dtype == torch.float32
    filters = filters.double().numpy()
    reference = _reference_filters(images, k, eps)
    half = 3 * k * k
    assert filters.shape == (2 * half, 3, k, k)
    for got, want in zip(filters[:half], reference):
        sign = np.sign((got * want).sum())  # an eigenvector is defined up to its sign
        np.testing.assert_allclose(sign * got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_array_equal(filters[half:], -filters[:half])


def test_whitening_conv_outputs_have_identity_covariance():
    """Applied as a convolution (the layout the network uses), the first half of
    the filters gives unit-variance, uncorrelated features (uncentred, eps ~ 0)."""
    images = _images_with_small_directions(n=80).float()
    conv = torch.nn.Conv2d(3, 24, 2)
    init_whitening_conv(conv, images, eps=1e-9)
    with torch.no_grad():
        out = torch.nn.functional.conv2d(images.double(), conv.weight[:12].double())
    features = out.permute(0, 2, 3, 1).reshape(-1, 12)
    covariance = features.T @ features / len(features)
    assert torch.allclose(covariance, torch.eye(12, dtype=torch.float64), atol=2e-3)
    assert torch.equal(conv.weight, whitening_filters(images, 2, eps=1e-9))


def test_extract_patches_matches_slicing():
    images = torch.randn(2, 3, 4, 5)
    patches = extract_patches(images, 2)
    expected = [images[i, :, y:y + 2, x:x + 2] for i in range(2) for y in range(3) for x in range(4)]
    assert torch.equal(patches, torch.stack(expected))


def test_defaults_are_airbenchs_and_odd_convolutions_are_refused():
    images = _images_with_small_directions(n=10).float()
    assert torch.equal(whitening_filters(images), whitening_filters(images, kernel_size=2, eps=5e-4))
    conv = torch.nn.Conv2d(3, 24, 2, bias=False)  # no bias: nothing to zero
    init_whitening_conv(conv, images)
    assert torch.equal(conv.weight, whitening_filters(images, 2, 5e-4)) and not conv.weight.requires_grad
    with pytest.raises(ValueError, match=r"square kernel and 24 output channels, got 24 channels and kernel \(2, 3\)"):
        init_whitening_conv(torch.nn.Conv2d(3, 24, (2, 3)), images)
