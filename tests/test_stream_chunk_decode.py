from functools import partial

import numpy as np
import pytest
import torch

from hasten.data.workers import ordered_map
from hasten.stream.chunk_decode import decode_chunk, pack_chunk
from hasten.stream.epoch_plan import epoch_plan, plan_records
from hasten.stream.pack import pack
from hasten.stream.shard_store import open_shards
from hasten.stream.shared_buffers import BatchPool, BufferPool
from hasten.stream.tar_members import close_files


@pytest.fixture(scope="module")
def shards(photo_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "set"
    pack(photo_folder, out, shard_bytes=40_000)
    return open_shards(out, "train")


@pytest.mark.parametrize("start", ["fork", "spawn"])
@pytest.mark.parametrize("lazy", [True, False])  # images read by the worker, or sent in shared memory
def test_chunks_decode_the_same_in_workers_started_by_fork_or_spawn(shards, start, lazy):
    """A packed chunk, its records and the decode function travel to a worker by module
    path (spawn pickles them; fork inherits them): the crops written into the loading
    process's reused batch are the crops decoded in this process."""
    plan = epoch_plan(shards.examples, epoch=0, seed=3)
    chunk = list(plan_records(shards, plan, lazy=lazy))[:6]
    assert all((r.where is not None) == lazy for _, r in chunk)
    decode = partial(decode_chunk, image_size=20, seed=3, epoch=0, crop="random-resized")
    here = decode(chunk)
    close_files()  # (the descriptors this process opened to read the images)
    batches = BatchPool((6, 20, 20, 3), cap=1)
    packed = pack_chunk(chunk, BufferPool(), batches)
    (there,) = list(ordered_map(decode, [packed], workers=1, mp_context=start))
    assert there.images is None  # written into the batch the loading process owns
    images = batches.arrived(len(there.keys))
    assert np.array_equal(there.keys, here.keys) and np.array_equal(there.labels, here.labels)
    assert len(here.keys) == 6 and torch.equal(images, here.images)
