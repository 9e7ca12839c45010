"""rank_indices: every example once per epoch across ranks, deterministic per (seed, epoch)."""

import numpy as np
import pytest

from hasten.stream.rank_split import rank_indices


@pytest.mark.parametrize("n,world", [(10, 3), (60, 4), (7, 1), (5, 8)])
def test_ranks_cover_every_example_once_per_epoch(n, world):
    for epoch in (0, 1):
        splits = [rank_indices(n, rank=r, world_size=world, epoch=epoch, seed=5) for r in range(world)]
        assert sorted(np.concatenate(splits).tolist()) == list(range(n))
        assert max(map(len, splits)) - min(map(len, splits)) <= 1
        again = rank_indices(n, rank=0, world_size=world, epoch=epoch, seed=5)
        assert np.array_equal(again, splits[0])
    a = rank_indices(60, rank=0, world_size=2, epoch=0)
    b = rank_indices(60, rank=0, world_size=2, epoch=1)
    assert not np.array_equal(a, b)
    padded = [rank_indices(10, rank=r, world_size=3, pad=True) for r in range(3)]
    assert {len(s) for s in padded} == {4}


@pytest.mark.parametrize("kwargs", [dict(rank=3, world_size=3), dict(world_size=0), dict(rank=-1)])
def test_rank_arguments_validated(kwargs):
    with pytest.raises(ValueError, match="rank|world_size"):
        rank_indices(10, **kwargs)

