import torch
import torch.nn.functional as F
import pytest

from hasten.nn.ema import Lookahead, WeightAverage, airbench_decay_schedule, warmup_decay
from hasten.nn.ghost_bn import GhostBatchNorm2d
from hasten.nn.tta import evaluate, tta_logits
from hasten.nn.whitening import extract_patches, init_whitening_conv, whitening_filters


def test_ghost_bn_equals_bn_per_chunk_forward_and_backward():
    torch.manual_seed(0)
    x = torch.randn(24, 5, 4, 4, requires_grad=True)
    ghost = GhostBatchNorm2d(5, num_splits=4)
    with torch.no_grad():
        ghost.weight.uniform_(0.5, 1.5)
        ghost.bias.uniform_(-1, 1)
    out = ghost(x)
    x_ref = x.detach().clone().requires_grad_(True)
    chunks = [F.batch_norm(c, None, None, ghost.weight, ghost.bias, True, 0.1, ghost.eps) for c in x_ref.chunk(4)]
    ref = torch.cat(chunks)
    assert torch.allclose(out, ref, atol=1e-5)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-5)
    # running mean is the mean of the per-chunk updates
    expected = 0.9 * 0 + 0.1 * torch.stack([c.mean(dim=(0, 2, 3)) for c in x.detach().chunk(4)]).mean(0)
    assert torch.allclose(ghost.running_mean, expected, atol=1e-6)


def test_ghost_bn_differs_from_full_batch_bn_and_matches_it_in_eval():
    torch.manual_seed(0)
    x = torch.randn(16, 3, 4, 4) + torch.arange(16.0).view(16, 1, 1, 1)  # chunks have different means
    ghost, plain = GhostBatchNorm2d(3, num_splits=2), torch.nn.BatchNorm2d(3)
    assert not torch.allclose(ghost(x), plain(x), atol=1e-3)
    plain.load_state_dict(ghost.state_dict())
    ghost.eval(), plain.eval()
    assert torch.allclose(ghost(x), plain(x))


def test_ghost_bn_rejects_bad_splits():
    with pytest.raises(ValueError, match="num_splits"):
        GhostBatchNorm2d(3, num_splits=0)
    with pytest.raises(ValueError, match="divisible"):
        GhostBatchNorm2d(3, num_splits=3)(torch.randn(4, 3, 2, 2))


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
    with pytest.raises(ValueError, match="24 output channels"):
        init_whitening_conv(torch.nn.Conv2d(3, 16, 2), torch.randn(5, 3, 8, 8))


def test_weight_average_update_and_lookahead_copy_back():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    ema, look = WeightAverage(model), Lookahead(model)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model, decay=0.9)
    assert torch.allclose(ema.state["weight"], torch.full((1, 2), 0.1))
    assert torch.equal(model.weight, torch.ones(1, 2))  # EMA leaves the model alone
    look.update(model, decay=0.75)
    assert torch.allclose(model.weight, torch.full((1, 2), 0.25))  # Lookahead pulls it back
    with pytest.raises(ValueError, match="decay"):
        ema.update(model, 1.5)


def test_airbench_decay_schedule_rises_to_its_cap():
    s = airbench_decay_schedule(100)
    assert s[0] == 0 and torch.isclose(s[-1], torch.tensor(0.95 ** 5)) and (s.diff() >= 0).all()


class _Asymmetric(torch.nn.Module):
    """Logits that depend on where the mass of the image is: flips matter."""

    def forward(self, x):
        w = x.shape[-1]
        left, right = x[..., : w // 2].sum(dim=(1, 2, 3)), x[..., w // 2:].sum(dim=(1, 2, 3))
        return torch.stack([left, right], 1)


def test_tta_flip_averages_the_mirror():
    x = torch.rand(4, 3, 8, 8)
    model = _Asymmetric()
    flip = tta_logits(model, x, "flip")
    assert torch.allclose(flip, 0.5 * model(x) + 0.5 * model(x.flip(-1)))
    assert torch.allclose(flip[:, 0], flip[:, 1])  # symmetric after flip averaging
    assert torch.equal(tta_logits(model, x, "none"), model(x))
    translate = tta_logits(model, x, "flip_translate")
    assert translate.shape == (4, 2) and not torch.allclose(translate, flip)
    with pytest.raises(ValueError, match="flip_translate"):
        tta_logits(model, x, "rotate")


def test_evaluate_counts_correct_predictions():
    model = _Asymmetric()
    x = torch.zeros(4, 1, 2, 2)
    x[:2, ..., 0] = 1  # mass on the left -> class 0
    x[2:, ..., 1] = 1
    assert evaluate(model, [(x, torch.tensor([0, 0, 1, 1]))]) == 1.0
    assert evaluate(model, [(x, torch.tensor([0, 1, 1, 1]))]) == 0.75


def test_warmup_decay_starts_low_and_caps():
    assert warmup_decay(0.99, 0) == pytest.approx(0.1)
    assert warmup_decay(0.99, 10) == pytest.approx(11 / 20)
    assert warmup_decay(0.99, 10_000) == 0.99
