"""Batches as the profile sees them: their size in bytes, and whether they hold tensors.

Changes the training math: no.
"""

from __future__ import annotations


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


def has_tensor(x) -> bool:
    import torch
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (list, tuple)):
        return any(has_tensor(v) for v in x)
    if isinstance(x, dict):
        return any(has_tensor(v) for v in x.values())
    return False
