"""Group batch norm: batch statistics shared by contiguous groups of k replicas.

Based on: Ying et al., "Image Classification at Supercomputer Scale"
(arXiv:1811.06992), section "Distributed batch normalization": with 16 images per
replica, statistics over one replica are too noisy, so replicas are grouped
(groups of 4-8, a BN batch of about 64) and the per-channel sum, sum of squares
and count are all-reduced within each group. Like ``torch.nn.SyncBatchNorm`` with
a sub-group, but it runs on any torch.distributed backend (gloo on CPU as well as
NCCL), and reduces one packed float32 tensor in each direction.

Changes the training math: yes, compared with per-replica BN (the statistics cover
k x b images instead of b). Group BN over k ranks with batch b each computes
exactly what plain BN computes over one batch of k x b, forward and backward.

Statistics, normalisation and the gradient sums are computed in float32 whatever
the input dtype (bf16 autocast included); the output has the input's dtype.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import once_differentiable

from hasten.errors import ConfigError

__all__ = ["GroupBatchNorm", "convert_batchnorm", "bn_process_group"]

_GROUPS: dict[tuple[int, int], object] = {}


def bn_process_group(group_size: int):
    """This rank's process group of ``group_size`` contiguous ranks
    (ranks ``[r // k * k, r // k * k + k)``). Every rank must call it, in the same
    order, because ``dist.new_group`` is collective. Returns None when there is
    nothing to share (group size 1)."""
    if group_size < 1:
        raise ConfigError(f"invalid BN group size {group_size}: must be >= 1")
    if group_size == 1:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            f"BN group size {group_size} needs torch.distributed to be initialised "
            "(run under torchrun); use group size 1 for a single process"
        )
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % group_size != 0:
        raise ConfigError(
            f"BN group size {group_size} does not divide the world size {world}; "
            f"use one of {[k for k in range(1, world + 1) if world % k == 0]}"
        )
    if group_size == world:
        return dist.group.WORLD
    key = (world, group_size)
    if key not in _GROUPS:
        mine = None
        for start in range(0, world, group_size):
            g = dist.new_group(list(range(start, start + group_size)))
            if start <= rank < start + group_size:
                mine = g
        _GROUPS[key] = mine
    return _GROUPS[key]


class _GroupBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, factor, group):
        dims = [d for d in range(x.ndim) if d != 1]
        xf = x.float()
        local_count = x.numel() // x.shape[1]
        # One packed all-reduce: [sum (C), sum of squares (C), count (1)].
        stats = torch.cat([
            xf.sum(dims), (xf * xf).sum(dims),
            torch.full((1,), float(local_count), device=x.device),
        ])
        dist.all_reduce(stats, group=group)
        c = x.shape[1]
        count = stats[2 * c]
        mean = stats[:c] / count
        var = (stats[c:2 * c] / count - mean * mean).clamp_(min=0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            # count is a device tensor; the unbiased correction stays on the device.
            running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
            unbiased = var * count / (count - 1).clamp(min=1)
            running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        shape = [1, c] + [1] * (x.ndim - 2)
        xhat = (xf - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.float().view(shape) + bias.float().view(shape)
        ctx.save_for_backward(x, weight, mean, invstd, count)
        ctx.group = group
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, mean, invstd, count = ctx.saved_tensors
        dims = [d for d in range(x.ndim) if d != 1]
        c = x.shape[1]
        shape = [1, c] + [1] * (x.ndim - 2)
        xhat = (x.float() - mean.view(shape)) * invstd.view(shape)
        dyf = dy.float()
        local = torch.cat([dyf.sum(dims), (dyf * xhat).sum(dims)])
        # The weight/bias gradients are the local sums: DDP adds them across ranks
        # like any other parameter gradient. x's gradient needs the group's sums.
        grad_weight = local[c:].to(weight.dtype, copy=True) if weight is not None else None
        grad_bias = local[:c].to(weight.dtype, copy=True) if weight is not None else None
        dist.all_reduce(local, group=ctx.group)
        sum_dy, sum_dy_xhat = local[:c] / count, local[c:] / count
        scale = invstd if weight is None else invstd * weight.float()
        dx = (dyf - sum_dy.view(shape) - xhat * sum_dy_xhat.view(shape)) * scale.view(shape)
        return dx.to(x.dtype), grad_weight, grad_bias, None, None, None, None, None


class GroupBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Batch norm over any input of shape (N, C, ...) whose training statistics are
    all-reduced over ``process_group`` (see :func:`bn_process_group`). With no
    group (group size 1) or in eval mode it is exactly ``nn.BatchNorm``."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, process_group=None,
                 device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (N, C, ...), got {input.dim()}D")

    def forward(self, x):
        self._check_input_dim(x)
        if not self.training or self.process_group is None:
            return super().forward(x)
        factor = 0.0
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked)) if self.momentum is None else self.momentum
        return _GroupBatchNormFunction.apply(
            x, self.weight, self.bias,
            self.running_mean if self.track_running_stats else None,
            self.running_var if self.track_running_stats else None,
            self.eps, factor, self.process_group,
        )


def convert_batchnorm(module: nn.Module, group_size: int, process_group=None) -> nn.Module:
    """Replace every ``nn.BatchNorm1d/2d/3d`` (and SyncBatchNorm) in ``module`` by a
    :class:`GroupBatchNorm` sharing statistics over groups of ``group_size``
    contiguous ranks, keeping parameters and running statistics. Collective: call it
    on every rank. ``group_size=1`` returns the module unchanged."""
    if process_group is None:
        process_group = bn_process_group(group_size)
    if process_group is None:
        return module
    return _convert(module, process_group)


# Exact types: subclasses (GhostBatchNorm2d, GroupBatchNorm) have their own semantics.
_PLAIN_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _convert(module: nn.Module, process_group) -> nn.Module:
    if type(module) in _PLAIN_BN:
        new = GroupBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                             module.track_running_stats, process_group=process_group)
        with torch.no_grad():
            if module.affine:
                new.weight = module.weight
                new.bias = module.bias
            if module.track_running_stats:
                new.running_mean = module.running_mean
                new.running_var = module.running_var
                new.num_batches_tracked = module.num_batches_tracked
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, _convert(child, process_group))
    return module

