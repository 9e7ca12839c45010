"""Batches as the profile sees them: their size, whether they are data, and copies that can be replayed.

Changes the training math: no.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping


def batch_nbytes(batch) -> int:
    """Bytes of the tensors in a batch (tensors, or lists, tuples and dicts of them)."""
    import torch
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(b) for b in batch)
    if isinstance(batch, dict):
        return sum(batch_nbytes(b) for b in batch.values())
    return 0


def tensor_layout(batch, most: int = 8) -> list[dict]:
    """The shape and dtype of each tensor in a batch, in order (at most ``most``), with its key where the
    batch is a mapping of tensors: what the report's words and code for the loop are chosen from
    (:mod:`hasten.profile.loop_kind`)."""
    import torch
    if isinstance(batch, Mapping):
        pairs = [(k, v) for k, v in batch.items() if isinstance(v, torch.Tensor)]
    else:
        pairs = [(None, t) for t in tensors_in(batch)]
    return [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), **({"key": k} if k else {})}
            for k, t in pairs[:most]]


def has_tensor(x) -> bool:
    import torch
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (list, tuple)):
        return any(has_tensor(v) for v in x)
    if isinstance(x, dict):
        return any(has_tensor(v) for v in x.values())
    return False


def is_data(args) -> bool:
    """Whether a model's arguments are data: tensors in it, none of them part of an autograd graph.

    A generator's output passed on to a discriminator is not: kept and replayed, it would
    take autograd back through a graph the step has already freed."""
    tensors = list(tensors_in(args))
    return bool(tensors) and not any(t.requires_grad for t in tensors)


def tensors_in(x):
    import torch
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from tensors_in(v)
    elif isinstance(x, Mapping):
        for v in x.values():
            yield from tensors_in(v)


def same_layout(a, b) -> bool:
    """Same nesting, and tensors of the same shape, dtype and device: ``b`` can stand in for ``a``."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and a.device == b.device)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_layout(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (type(a) is type(b) and a.keys() == b.keys()
                and all(same_layout(a[k], b[k]) for k in a))
    try:
        return bool(a == b)
    except Exception:  # an object whose == is elementwise or refuses: not comparable, not the same
        return False


def map_tensors(fn, batch):
    """``batch`` with each tensor ``t`` in it replaced by ``fn(t)``: lists, tuples (named too) and
    mappings rebuilt, anything else handed on as it is."""
    import torch
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(map_tensors(fn, v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(fn, v) for v in batch)
    if isinstance(batch, Mapping):
        try:
            out = copy.copy(batch)
            for k in batch:
                out[k] = map_tensors(fn, batch[k])
            return out
        except Exception:  # a read-only or unusual mapping: handed on as it is
            return batch
    return batch


def fresh_copy(batch):
    """A copy of a batch that the loop may change in place (``x.div_(255)``, ``batch.pop("labels")``)
    without changing the kept one: tensors cloned, lists, tuples and mappings rebuilt."""
    return map_tensors(lambda t: t.detach().clone().requires_grad_(t.requires_grad), batch)


# Elements of a tensor read into its fingerprint: equal batches give equal digests, and two
# different batches of data differ in far more than the elements this skips.
FINGERPRINT_ELEMENTS = 1 << 16


def fingerprint(batch) -> str:
    """A digest of a batch's contents: each tensor's shape, dtype and up to
    ``FINGERPRINT_ELEMENTS`` evenly spaced elements; other leaves by ``repr``."""
    h = hashlib.blake2b(digest_size=16)
    _digest(h, batch)
    return h.hexdigest()


def _digest(h, x) -> None:
    import torch
    if isinstance(x, torch.Tensor):
        h.update(f"{tuple(x.shape)}{x.dtype}".encode())
        try:
            flat = x.detach().reshape(-1)
            step = max(1, flat.numel() // FINGERPRINT_ELEMENTS)
            h.update(flat[::step].contiguous().cpu().view(torch.uint8).numpy().tobytes())
        except (RuntimeError, TypeError):  # a sparse or nested tensor: its shape and dtype only
            pass
    elif isinstance(x, (list, tuple)):
        h.update(b"[")
        for v in x:
            _digest(h, v)
        h.update(b"]")
    elif isinstance(x, Mapping):
        h.update(b"{")
        for k, v in x.items():
            h.update(repr(k).encode())
            _digest(h, v)
        h.update(b"}")
    else:
        h.update(repr(x).encode()[:4096])
