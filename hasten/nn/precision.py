"""bfloat16 mixed precision with float32 where it matters, and channels_last.

Based on: Ying et al., "Image Classification at Supercomputer Scale"
(arXiv:1811.06992): convolutions and matrix products in bfloat16, with batch norm,
the loss and gradient sums in float32. bfloat16 has float32's exponent range, so
no loss scaling is needed (unlike float16).

How each float32 part is kept here:

- parameters stay float32 (autocast casts copies for each op), so gradients and
  their all-reduce are float32 unless a compression hook is chosen on purpose;
- batch norm: :func:`batchnorm_in_float32` makes every BN layer see a float32
  input (autocast passes bf16 activations to BN on CUDA); the following conv casts
  back to bf16 under autocast;
- loss: :func:`cross_entropy` upcasts the logits.

Changes the training math: yes (bf16 matmuls and convolutions round to 8 bits of
mantissa); accuracy is expected to match float32 within run-to-run noise.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["autocast", "batchnorm_in_float32", "cross_entropy", "to_channels_last"]



def autocast(device: torch.device | str, enabled: bool):
    """bf16 autocast on ``device`` (CUDA or CPU), or a no-op context."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def _upcast_input(module: nn.Module, args: tuple):
    x = args[0]
    return (x.float(),) + args[1:] if x.dtype != torch.float32 else None


def batchnorm_in_float32(model: nn.Module) -> nn.Module:
    """Make every batch-norm layer of ``model`` normalise a float32 input.
    Returns ``model`` (modified in place with forward pre-hooks)."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.register_forward_pre_hook(_upcast_input)
    return model


def cross_entropy(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0,
                  reduction: str = "mean") -> Tensor:
    """Cross-entropy in float32, with label smoothing (Szegedy et al.,
    arXiv:1512.00567; 0.1 in Ying et al.): the target puts ``1 - s + s / K`` on
    the true class and ``s / K`` on each of the K classes otherwise.
    ``reduction``: mean | sum (airbench sums, and scales the lr per 1024 examples)."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"Invalid label_smoothing: {label_smoothing} (must be in [0, 1))")
    return F.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing, reduction=reduction)


def onednn_channels_last_hazard(model: nn.Module) -> str | None:
    """The first convolution that oneDNN cannot train in channels_last on a CPU, or None.

    A 1x1 stride-2 convolution (ResNet's downsampling shortcut) with fewer than 8
    input channels: its weight gradient in channels_last writes out of bounds on
    AVX2 in torch 2.13's oneDNN 3.12 (oneDNN issue 6035), which ends the process in
    a segfault, an abort or a hang depending on the thread count. CUDA is unaffected."""
    if any(p.device.type != "cpu" for p in model.parameters()):
        return None
    for name, m in model.named_modules():
        if (isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) and m.stride == (2, 2)
                and m.in_channels < 8):
            return f"{name} ({m.in_channels} input channels, 1x1, stride 2)"
    return None


def to_channels_last(model: nn.Module) -> nn.Module:
    """NHWC memory format: tensor cores and oneDNN read convolutions in this
    layout without transposes. Inputs should be converted the same way.

    Raises ValueError, before anything runs, for a CPU model that oneDNN would crash
    or hang on in channels_last (:func:`onednn_channels_last_hazard`)."""
    hazard = onednn_channels_last_hazard(model)
    if hazard is not None:
        raise ValueError(f"channels_last on the CPU needs at least 8 input channels in 1x1 stride-2 "
                         f"convolutions (oneDNN's weight gradient crashes or hangs below that): {hazard}; "
                         "widen the model or keep NCHW")
    return model.to(memory_format=torch.channels_last)
