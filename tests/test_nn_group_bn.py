"""GroupBatchNorm over k gloo processes equals plain BN over the k concatenated
batches, forward, running statistics and gradients."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hasten.errors import ConfigError
from hasten.harness.launch import spawn
from hasten.nn.group_bn import GroupBatchNorm, bn_process_group, convert_batchnorm

C, B = 3, 4  # channels, images per rank


def _check(rank, world, group_size, channels_last, backend="gloo"):
    """One rank of a real process group (hasten.harness.launch.spawn forks it and joins the group)."""
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    x_all = (torch.randn(world * B, C, 5, 5, generator=g) * 3 + 1).to(dev)
    dy_all = torch.randn(world * B, C, 5, 5, generator=g).to(dev)
    weight, bias = torch.rand(C, generator=g) + 0.5, torch.randn(C, generator=g)

    def bn(cls):
        m = cls(C).to(dev)
        with torch.no_grad():
            m.weight.copy_(weight)
            m.bias.copy_(bias)
        return m

    # Reference: plain BN over this rank's whole group, concatenated.
    first = rank // group_size * group_size
    lo, hi = first * B, (first + group_size) * B
    ref = bn(nn.BatchNorm2d)
    x_ref = x_all[lo:hi].clone().requires_grad_()
    y_ref = ref(x_ref)
    y_ref.backward(dy_all[lo:hi])

    model = convert_batchnorm(nn.Sequential(bn(nn.BatchNorm2d)), group_size=group_size)
    assert isinstance(model[0], GroupBatchNorm)
    x = x_all[rank * B:(rank + 1) * B].clone()
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    y = model(x)
    y.backward(dy_all[rank * B:(rank + 1) * B])

    mine = slice((rank - first) * B, (rank - first + 1) * B)
    torch.testing.assert_close(y, y_ref[mine], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, x_ref.grad[mine], rtol=1e-5, atol=1e-5)
    # Parameter gradients are local sums; adding them over the group (what DDP
    # does across ranks) must give the reference gradient.
    group = bn_process_group(group_size)
    for p, p_ref in [(model[0].weight, ref.weight), (model[0].bias, ref.bias)]:
        gsum = p.grad.clone()
        dist.all_reduce(gsum, group=group)
        torch.testing.assert_close(gsum, p_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[0].running_mean, ref.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model[0].running_var, ref.running_var, rtol=1e-5, atol=1e-6)
    # A different group's data must give different statistics (not a world-wide BN).
    if group_size < world:
        assert not torch.allclose(model[0].running_mean, x_all.mean((0, 2, 3)) * 0.1, atol=1e-4)


@pytest.mark.multiproc
@pytest.mark.parametrize(
    "world,group_size,channels_last",
    [(2, 2, False), (4, 2, False), (4, 4, True)],
)
def test_group_bn_equals_bn_on_concatenated_batch(world, group_size, channels_last):
    spawn(_check, world, (group_size, channels_last))


@pytest.mark.gpu
@pytest.mark.multiproc
def test_group_bn_on_nccl():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    world = min(4, torch.cuda.device_count())
    spawn(_check, world, (2, True, "nccl"), backend="nccl", start_method="spawn")


def test_single_process_group_size_one_is_plain_bn():
    m = nn.Sequential(nn.BatchNorm2d(3))
    assert convert_batchnorm(m, group_size=1) is m
    assert type(m[0]) is nn.BatchNorm2d


def test_group_size_above_one_without_distributed_is_a_clear_error():
    with pytest.raises(ConfigError, match="torch.distributed"):
        convert_batchnorm(nn.BatchNorm2d(3), group_size=2)
    with pytest.raises(ConfigError, match=">= 1"):
        bn_process_group(0)


def test_eval_mode_uses_running_stats_like_batchnorm():
    bn = nn.BatchNorm2d(3)
    bn.running_mean.fill_(0.5)
    gbn = GroupBatchNorm(3, process_group=None)
    gbn.load_state_dict(bn.state_dict())
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(gbn.eval()(x), bn.eval()(x))



def test_group_bn_normalises_bf16_input_in_float32():
    x = (torch.randn(16, 3, 4, 4) * 50 + 300).bfloat16()
    gbn = GroupBatchNorm(3)
    y = gbn(x)
    ref = F.batch_norm(x.float(), None, None, training=True)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=1e-2)
