import pytest
import torch

from hasten.models.speedrun_net import NetConfig, SpeedrunNet
from hasten.nn.ghost_bn import GhostBatchNorm2d


def test_net_shapes_and_dirac_init():
    net = SpeedrunNet(NetConfig(widths=(8, 16, 16)))
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    w = net.layers[0].conv2.weight  # 8 -> 8: identity on every filter
    centre = w[:, :, 1, 1]
    assert torch.equal(centre, torch.eye(8)) and w.abs().sum() == 8
    bn = net.layers[0].norm1
    assert not bn.weight.requires_grad and bn.bias.requires_grad  # frozen BN scale


def test_pool_before_activation_changes_order_not_shape():
    x = torch.randn(2, 3, 32, 32)
    a = SpeedrunNet(NetConfig(widths=(8, 8, 8), pool_before_act=True))
    b = SpeedrunNet(NetConfig(widths=(8, 8, 8), pool_before_act=False))
    b.load_state_dict(a.state_dict())
    assert a(x).shape == b(x).shape and not torch.allclose(a(x), b(x))


def test_ghost_batch_size_switches_the_batch_norm():
    plain = SpeedrunNet(NetConfig(widths=(8, 8, 8)))
    ghost = SpeedrunNet(NetConfig(widths=(8, 8, 8), ghost_batch_size=2))
    assert type(plain.layers[0].norm1) is torch.nn.BatchNorm2d
    assert isinstance(ghost.layers[0].norm1, GhostBatchNorm2d) and ghost.layers[0].norm1.ghost_batch_size == 2
    ghost.load_state_dict(plain.state_dict())  # the same state: a checkpoint loads into either


def test_invalid_net_config():
    with pytest.raises(ValueError, match="gelu"):
        NetConfig(activation="swish")
    with pytest.raises(ValueError, match="ghost_batch_size"):
        NetConfig(ghost_batch_size=-1)


def test_first_layer_bias_starts_at_zero_as_in_airbench():
    for cfg in (NetConfig(widths=(8, 8, 8)), NetConfig(widths=(8, 8, 8), whiten_kernel=3, dirac_init=False)):
        torch.manual_seed(0)
        bias = SpeedrunNet(cfg).whiten.bias
        assert bias.shape == (2 * 3 * cfg.whiten_kernel ** 2,) and torch.equal(bias, torch.zeros_like(bias))
        assert bias.requires_grad  # zeroed, not frozen: it trains for whiten_bias_epochs
