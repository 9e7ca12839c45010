"""A verification run of the device-resident loader fix (``HASTEN_PROFILE_APPLY=resident``).

The report prints ``hasten.data.host_loader.HostLoader(images, labels, batch_size)`` (``GpuLoader``
on CUDA) over the dataset decoded once into memory. From outside the script the dataset cannot be
decoded whole, but the loop's own batches can be kept: the warm-up's batches of the training loader
are copied into a pool (up to :data:`POOL` of them), and from the measured window on, each batch the
loop draws is ``batch_size`` rows gathered at random from the pool, one ``index_select`` per tensor:
what a resident loader does for a batch. The loader's workers, never asked again, idle. The steps
measured are then the fix's: decoding gone, a gather from memory in its place (in host memory: on
CUDA the loop still copies each batch to the device, which ``GpuLoader`` would not).

A tensor in the batch whose first dimension is not the batch's rows (a per-batch value) is handed on
as the first batch had it; anything else than tensors, lists, tuples and mappings, likewise.

Changes the training math: yes, in the verification run only (the warm-up's rows again and again);
the fix itself does not (the same data, decoded once).
"""

from __future__ import annotations

from collections.abc import Mapping

from hasten.profile.inject.batches import fresh_copy, map_tensors, tensors_in
from hasten.profile.inject.state import State

APPLY = "resident"
POOL = 16  # batches kept: the gather's cost per batch does not depend on the pool's size


def draw(st: State, it, orig):
    """The training loader's next batch in a verification run of the resident loader."""
    pool = it.__dict__.setdefault("_hasten_pool", [])
    if st.phase == "warmup" or not pool:
        batch = orig(it)
        if len(pool) < POOL:
            pool.append(fresh_copy(batch))
        return batch
    joined = it.__dict__.get("_hasten_joined")
    if joined is None:
        joined = it._hasten_joined = _join(pool)
        it._hasten_rows = sum(_rows(b) for b in pool)
        it._hasten_size = _rows(pool[0])
    import torch
    idx = torch.randint(it._hasten_rows, (it._hasten_size,))
    rows = it._hasten_rows
    return map_tensors(lambda t: t.index_select(0, idx) if t.dim() and t.shape[0] == rows else t, joined)


def _rows(batch) -> int:
    first = next(iter(tensors_in(batch)), None)
    return first.shape[0] if first is not None and first.dim() else 0


def _join(batches: list):
    """The batches joined leaf by leaf along the rows (tensors concatenated, where their shapes allow)."""
    import torch
    first = batches[0]
    if isinstance(first, torch.Tensor):
        try:
            return torch.cat(batches) if first.dim() else first
        except RuntimeError:  # rows of different shapes: no pool of this leaf
            return first
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_join([b[i] for b in batches]) for i in range(len(first))))
    if isinstance(first, (list, tuple)) and all(len(b) == len(first) for b in batches):
        return type(first)(_join([b[i] for b in batches]) for i in range(len(first)))
    if isinstance(first, Mapping):
        return {k: _join([b[k] for b in batches]) for k in first}
    return first
