import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hasten.nn.ghost_bn import GhostBatchNorm2d, apply_ghost_batchnorm


def test_ghost_bn_equals_bn_per_chunk_forward_and_backward():
    torch.manual_seed(0)
    x = torch.randn(24, 5, 4, 4, requires_grad=True)
    ghost = GhostBatchNorm2d(5, ghost_batch_size=6)
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
    ghost, plain = GhostBatchNorm2d(3, ghost_batch_size=8), torch.nn.BatchNorm2d(3)
    assert not torch.allclose(ghost(x), plain(x), atol=1e-3)
    plain.load_state_dict(ghost.state_dict())
    ghost.eval(), plain.eval()
    assert torch.allclose(ghost(x), plain(x))


def test_ghost_bn_rejects_bad_sizes():
    with pytest.raises(ValueError, match="ghost_batch_size"):
        GhostBatchNorm2d(3, ghost_batch_size=0)
    with pytest.raises(ValueError, match="divisible"):
        GhostBatchNorm2d(3, ghost_batch_size=3)(torch.randn(4, 3, 2, 2))


def test_apply_ghost_batchnorm_splits_statistics_and_keeps_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model[1].weight
    assert apply_ghost_batchnorm(model, ghost_batch_size=4) is model
    assert type(model[1]).__name__ == "GhostBatchNorm2d"
    assert model[1].weight is weight  # the same parameter: an optimizer built before still holds it
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ref.items())
    x = torch.randn(8, 3, 2, 2) + torch.arange(8.0).view(8, 1, 1, 1)  # halves differ
    y = model(x)
    plain = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    plain.load_state_dict(ref)
    h = plain[0](x)
    expect = torch.cat([plain[1](h[:4]), plain[1](h[4:])])
    torch.testing.assert_close(y, expect)


@pytest.mark.parametrize("ghost_batch_size,batch,chunks", [(4, 8, 2), (2, 8, 4), (8, 8, 1)])
def test_apply_ghost_batchnorm_turns_the_ghost_batch_size_into_chunks(ghost_batch_size, batch, chunks):
    torch.manual_seed(0)
    model = apply_ghost_batchnorm(nn.Sequential(nn.BatchNorm2d(3)), ghost_batch_size)
    x = torch.randn(batch, 3, 2, 2) + torch.arange(float(batch)).view(batch, 1, 1, 1)
    expect = torch.cat([F.batch_norm(c, None, None, training=True) for c in x.chunk(chunks)])
    torch.testing.assert_close(model(x), expect)


def test_apply_ghost_batchnorm_rejects_a_size_that_does_not_divide_the_batch():
    model = apply_ghost_batchnorm(nn.Sequential(nn.BatchNorm2d(3)), 4)
    with pytest.raises(ValueError, match="batch size 6 is not divisible by ghost_batch_size=4"):
        model(torch.randn(6, 3, 2, 2))
    model.eval()
    assert model(torch.randn(6, 3, 2, 2)).shape == (6, 3, 2, 2)  # evaluation uses running statistics
    with pytest.raises(ValueError, match="ghost_batch_size"):
        apply_ghost_batchnorm(nn.BatchNorm2d(3), 0)
