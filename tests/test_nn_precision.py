"""bf16 autocast with batch norm, loss and gradients in float32; channels_last."""

import pytest
import torch
from torch import nn

from hasten.models.resnet import build_model
from hasten.nn.precision import autocast, batchnorm_in_float32, cross_entropy, to_channels_last


def _seen_dtypes(model):
    seen = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.register_forward_pre_hook(lambda mod, args, name=name: seen.__setitem__(name, args[0].dtype))
    return seen


def test_bf16_autocast_keeps_bn_loss_and_grads_in_float32():
    torch.manual_seed(0)
    model = batchnorm_in_float32(build_model("resnet10", 10, 16, width=4))
    seen = _seen_dtypes(model)  # registered after the upcast hooks: sees what BN sees
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    with autocast(torch.device("cpu"), True):
        logits = model(x)
        conv_out = model.stem[0](x)
    assert conv_out.dtype == torch.bfloat16  # the convolutions do run in bf16
    assert seen and set(seen.values()) == {torch.float32}
    loss = cross_entropy(logits, y, 0.1)
    assert loss.dtype == torch.float32
    loss.backward()
    # Parameters stay float32, so their gradients (and DDP's all-reduce of them) are float32.
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}
    assert all(b.dtype == torch.float32 for n, b in model.named_buffers() if "running" in n)


def test_without_the_hook_autocast_would_hand_bn_bf16():
    model = build_model("resnet10", 10, 16, width=4)
    seen = _seen_dtypes(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(4, 3, 16, 16))
    assert torch.bfloat16 in set(seen.values())


def test_cross_entropy_sums_in_float32_when_asked():
    logits, y = torch.randn(6, 4).bfloat16(), torch.randint(0, 4, (6,))
    total = cross_entropy(logits, y, 0.2, reduction="sum")
    assert total.dtype == torch.float32
    torch.testing.assert_close(total, 6 * cross_entropy(logits, y, 0.2))


def test_autocast_takes_a_device_or_its_name_and_can_be_off():
    with autocast("cpu", True):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), False):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32


def test_channels_last_model_gives_the_same_output():
    torch.manual_seed(0)
    model = build_model("resnet10", 10, 16, width=8).eval()
    x = torch.randn(2, 3, 16, 16)
    ref = model(x)
    cl = to_channels_last(model)
    assert cl.stem[0].weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(cl(x.contiguous(memory_format=torch.channels_last)), ref,
                               rtol=1e-4, atol=1e-4)


def test_channels_last_refuses_cpu_models_onednn_cannot_train():
    """ResNet width 4 has a 1x1 stride-2 shortcut with 4 input channels: oneDNN's weight gradient
    of it in channels_last crashes or hangs on AVX2, so the conversion refuses it up front."""
    with pytest.raises(ValueError, match="1x1 stride-2"):
        to_channels_last(build_model("resnet10", 10, 16, width=4))
    with pytest.raises(ValueError, match=r": 1 \(3 input channels"):
        to_channels_last(nn.Sequential(nn.Conv2d(3, 3, 3), nn.Conv2d(3, 8, 1, stride=2)))
    to_channels_last(nn.Sequential(nn.Conv2d(3, 8, 1, stride=1), nn.Conv2d(8, 8, 1, stride=2)))


@pytest.mark.gpu
def test_bf16_step_on_cuda():
    model = batchnorm_in_float32(build_model("resnet10", 10, 32, width=8)).cuda()
    model = to_channels_last(model)
    x = torch.randn(16, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    seen = _seen_dtypes(model)
    with autocast(torch.device("cuda"), True):
        logits = model(x)
    assert logits.dtype == torch.bfloat16 and set(seen.values()) == {torch.float32}
    cross_entropy(logits, torch.randint(0, 10, (16,), device="cuda")).backward()
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}
