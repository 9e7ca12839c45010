"""The split of a dataset's example indices over data-parallel ranks, per epoch.

Every rank computes the same permutation of ``range(n)`` from (seed, epoch) and
takes every ``world_size``-th index starting at its rank, so across ranks each
example is read exactly once per epoch, and no rank needs to talk to another.
The ranks' lists differ in length by at most one; ``pad=True`` repeats the first indices
of the permutation to make them equal (as torch's DistributedSampler does), at
the price of reading a few examples twice per epoch.

Changes the training math: no (an order of the data, like any shuffling sampler).
"""

from __future__ import annotations

import numpy as np


def rank_indices(
    n: int, *, rank: int = 0, world_size: int = 1, epoch: int = 0, seed: int = 0, shuffle: bool = True, pad: bool = False
) -> np.ndarray:
    """The dataset indices this rank reads in this epoch (int64 array)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"dataset size must be an integer >= 0; got {n!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1; got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, {world_size - 1}] for world_size={world_size}; got {rank!r}")
    if shuffle:
        order = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)]).permutation(n)
    else:
        order = np.arange(n)
    if pad and n % world_size:
        extra = world_size - n % world_size
        order = np.concatenate([order, np.resize(order, extra)]) if n else order
    return order[rank::world_size].astype(np.int64)
