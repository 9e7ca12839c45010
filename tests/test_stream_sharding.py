"""shard_indices: every example once per epoch across ranks, deterministic per (seed, epoch)."""

import numpy as np
import pytest

from hasten.stream.sharding import shard_indices


@pytest.mark.parametrize("n,world", [(10, 3), (60, 4), (7, 1), (5, 8)])
def test_shards_cover_every_example_once_per_epoch(n, world):
    for epoch in (0, 1):
        shards = [shard_indices(n, rank=r, world_size=world, epoch=epoch, seed=5) for r in range(world)]
        assert sorted(np.concatenate(shards).tolist()) == list(range(n))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        again = shard_indices(n, rank=0, world_size=world, epoch=epoch, seed=5)
        assert np.array_equal(again, shards[0])
    a = shard_indices(60, rank=0, world_size=2, epoch=0)
    b = shard_indices(60, rank=0, world_size=2, epoch=1)
    assert not np.array_equal(a, b)
    padded = [shard_indices(10, rank=r, world_size=3, pad=True) for r in range(3)]
    assert {len(s) for s in padded} == {4}


@pytest.mark.parametrize("kwargs", [dict(rank=3, world_size=3), dict(world_size=0), dict(rank=-1)])
def test_shard_arguments_validated(kwargs):
    with pytest.raises(ValueError, match="rank|world_size"):
        shard_indices(10, **kwargs)

