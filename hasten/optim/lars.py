"""LARS: layer-wise adaptive rate scaling, shaped like ``torch.optim.SGD``.

Based on: Y. You, I. Gitman, B. Ginsburg, "Large Batch Training of Convolutional
Networks" (arXiv:1708.03888), Algorithm 1; the clipping variant is NVIDIA's LARC
(apex/parallel/LARC.py). Used for ResNet-50 at batch 32k in Ying et al., "Image
Classification at Supercomputer Scale" (arXiv:1811.06992).

Changes the training math: yes. Every tensor's step is rescaled by its own trust
ratio, so the update direction differs from SGD's.

Algorithm, per parameter tensor ``w`` with gradient ``g`` (all tensors of a param
group with ``adapt=False`` skip the ratio, i.e. r = 1, which makes them plain SGD)::

    d = g + weight_decay * w
    r = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps)
    r = 1                       if ||w|| == 0 or ||g|| == 0
    r = min(r / lr, 1)          if clip (LARC: the effective rate lr * r <= lr; r = 1 at lr = 0)
    buf = momentum * buf + r * d            (buf = r * d at the first step)
    w  -= lr * (r * d + momentum * buf)     if nesterov
    w  -= lr * buf                          otherwise

Where the trust ratio goes. Implementations disagree on whether it scales the
gradient before it enters the momentum buffer, or the buffer (the update) after.
We scale the gradient before momentum, as in the paper's Algorithm 1
(``v = m v + lr * lambda * (g + beta w)``), TensorFlow's LARSOptimizer
(tf.contrib.opt / the TPU ResNet reference used by Ying et al.), Paddle's
LarsMomentumOptimizer, NVIDIA's LARC (which rescales ``p.grad`` in place before an
unmodified SGD step) and timm's ``Lars``. The other placement (LAMB-style, ratio of
the momentum update) changes the meaning of ``trust_coefficient``, so published
LARS hyperparameters (eta = 0.001) would not transfer. Unlike the TF version, the
learning rate stays outside the buffer, as in ``torch.optim.SGD``, so a schedule
changes the step immediately rather than through the momentum average.

Zero norms give a ratio of 1, so zero-initialised tensors (the last batch-norm
scale of each residual block, Goyal et al.) still move on their first step.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

__all__ = ["Lars", "lars", "lars_param_groups"]


class Lars(Optimizer):
    """LARS with momentum, optional Nesterov, and optional LARC clipping.

    Args:
        params: parameters or param groups (see :func:`lars_param_groups`).
        lr: learning rate (the global rate; the trust ratio scales it per tensor).
        momentum: momentum factor.
        weight_decay: L2 penalty, added to the gradient before the trust ratio.
        trust_coefficient: eta, 0.001 in You et al.
        eps: added to the ratio's denominator.
        nesterov: Nesterov momentum (needs ``momentum > 0``).
        clip: LARC clipping, ``r = min(r / lr, 1)``.
        adapt: apply the trust ratio; param groups with ``adapt=False`` get SGD.
        foreach: use the multi-tensor path (default: on for CUDA tensors). It
            computes every ratio on the device, with no host-device sync.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        eps: float = 1e-8,
        nesterov: bool = False,
        clip: bool = False,
        adapt: bool = True,
        *,
        foreach: bool | None = None,
    ):
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr} (must be >= 0)")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Invalid momentum value: {momentum} (must be in [0, 1))")
        if not weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay} (must be >= 0)")
        if not trust_coefficient > 0.0:
            raise ValueError(f"Invalid trust_coefficient: {trust_coefficient} (must be > 0)")
        if not eps >= 0.0:
            raise ValueError(f"Invalid eps value: {eps} (must be >= 0)")
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum requires momentum > 0")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            trust_coefficient=trust_coefficient,
            eps=eps,
            nesterov=nesterov,
            clip=clip,
            adapt=adapt,
            foreach=foreach,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lars does not support sparse gradients")
                params.append(p)
                grads.append(p.grad)
                bufs.append(self.state[p].get("momentum_buffer"))
            if not params:
                continue
            lars(
                params,
                grads,
                bufs,
                lr=group["lr"],
                momentum=group["momentum"],
                weight_decay=group["weight_decay"],
                trust_coefficient=group["trust_coefficient"],
                eps=group["eps"],
                nesterov=group["nesterov"],
                clip=group["clip"],
                adapt=group["adapt"],
                foreach=group["foreach"],
            )
            if group["momentum"] > 0:
                for p, buf in zip(params, bufs):
                    self.state[p]["momentum_buffer"] = buf
        return loss


def lars(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffers: list[Tensor | None],
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    trust_coefficient: float,
    eps: float,
    nesterov: bool,
    clip: bool,
    adapt: bool,
    foreach: bool | None = None,
) -> None:
    """Functional LARS step. ``momentum_buffers`` entries that are None are
    created in place in the list (the caller stores them back in its state)."""
    if foreach is None:
        foreach = all(p.is_cuda for p in params)
    fn = _multi_tensor_lars if foreach else _single_tensor_lars
    fn(
        params, grads, momentum_buffers, lr=lr, momentum=momentum, weight_decay=weight_decay,
        trust_coefficient=trust_coefficient, eps=eps, nesterov=nesterov, clip=clip, adapt=adapt,
    )


def _trust_ratio(w_norm: Tensor, g_norm: Tensor, *, lr, weight_decay, trust_coefficient, eps, clip):
    ratio = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps)
    # torch.where keeps this on the device: no .item(), no sync.
    ratio = torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio))
    if clip:
        # At lr = 0, min(r / lr, 1) is 1 (its limit, and what NVIDIA's LARC computes): a
        # warm-up from 0 then seeds the momentum buffer with the unscaled step, not r times it.
        ratio = torch.clamp(ratio / lr, max=1.0) if lr > 0 else torch.ones_like(ratio)
    return ratio


def _single_tensor_lars(params, grads, bufs, *, lr, momentum, weight_decay, trust_coefficient,
                        eps, nesterov, clip, adapt):
    for i, (p, g) in enumerate(zip(params, grads)):
        d = g.add(p, alpha=weight_decay) if weight_decay != 0 else g.clone()
        if adapt:
            ratio = _trust_ratio(
                torch.linalg.vector_norm(p), torch.linalg.vector_norm(g), lr=lr,
                weight_decay=weight_decay, trust_coefficient=trust_coefficient, eps=eps, clip=clip,
            )
            d.mul_(ratio)
        if momentum > 0:
            buf = bufs[i]
            if buf is None:
                buf = d.clone()
                bufs[i] = buf
            else:
                buf.mul_(momentum).add_(d)
            d = d.add(buf, alpha=momentum) if nesterov else buf
        p.add_(d, alpha=-lr)


def _multi_tensor_lars(params, grads, bufs, *, lr, momentum, weight_decay, trust_coefficient,
                       eps, nesterov, clip, adapt):
    if weight_decay != 0:
        d = torch._foreach_add(grads, params, alpha=weight_decay)
    else:
        d = torch._foreach_mul(grads, 1.0)
    if adapt:
        w_norms = torch.stack(torch._foreach_norm(params))
        g_norms = torch.stack(torch._foreach_norm(grads))
        ratios = _trust_ratio(
            w_norms, g_norms, lr=lr, weight_decay=weight_decay,
            trust_coefficient=trust_coefficient, eps=eps, clip=clip,
        )
        torch._foreach_mul_(d, list(ratios.unbind()))
    if momentum > 0:
        if any(b is None for b in bufs):
            for i, b in enumerate(bufs):
                if b is None:
                    bufs[i] = d[i].clone()
                else:
                    b.mul_(momentum).add_(d[i])
        else:
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, d)
        if nesterov:
            torch._foreach_add_(d, bufs, alpha=momentum)
        else:
            d = bufs
    torch._foreach_add_(params, d, alpha=-lr)


_NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)


def lars_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two param groups: weights (adapted, decayed) and biases plus normalisation
    parameters (``adapt=False, weight_decay=0``, i.e. plain momentum SGD).

    You et al. and Ying et al. exclude batch-norm and bias parameters from both the
    trust ratio and weight decay: their norms are tiny or zero-centred, so the
    ratio would freeze or blow up their rate.
    """
    excluded: set[int] = set()
    for module in model.modules():
        if isinstance(module, _NORM_TYPES) or "norm" in type(module).__name__.lower():
            excluded.update(id(p) for p in module.parameters(recurse=False))
    adapted, plain = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in excluded or p.ndim <= 1 or name.endswith(".bias"):
            plain.append(p)
        else:
            adapted.append(p)
    return [
        {"params": adapted, "weight_decay": weight_decay},
        {"params": plain, "weight_decay": 0.0, "adapt": False},
    ]
