"""`hasten train --loader stream` on a directory of tar shards."""

import pytest

from hasten.recipes.train import TrainConfig, train
from hasten.recipes.train_input import stream_input
from hasten.stream.pack import pack


@pytest.fixture(scope="module")
def shard_dir(photo_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "set"
    pack(photo_folder, out, shard_bytes=40_000)
    return out


def test_train_runs_on_shards(shard_dir, one_thread):
    cfg = TrainConfig(data=str(shard_dir), loader="stream", model="resnet10", width=8, image_size=32,
                      batch_size=8, epochs=2, warmup_epochs=0, device="cpu")
    report = train(cfg)
    assert report["steps"] == 2 * (54 // 8) and 0 <= report["accuracy"] <= 1
    assert report["images_per_epoch"] == 48


def test_shard_input_resumes_the_data_position(shard_dir):
    cfg = TrainConfig(data=str(shard_dir), loader="stream", image_size=24, batch_size=6, device="cpu")
    data = stream_input(cfg, "cpu", 0, 1, 6)
    assert data.image_size == 24 and data.num_classes == 3 and data.steps_per_epoch == 9
    full = [y.tolist() for _, y in data.epoch_batches(1)]
    assert len(full) == 9
    again = stream_input(cfg, "cpu", 0, 1, 6)
    batches = data.epoch_batches(1)
    for _ in range(4):
        next(batches)
    state = data.position.state_dict()
    again.position.load_state_dict(state)
    assert [y.tolist() for _, y in again.epoch_batches(1)] == full[4:]
