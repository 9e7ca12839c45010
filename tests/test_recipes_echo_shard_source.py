"""hasten.recipes.echo.shard_source: fresh examples for the echo runs read from packed
shards (the real upstream of benchmarks/echo_link.py): every example once per epoch,
the pixels the in-memory set decodes, labels checked, and train_budget's runs on it."""

import io
import threading
import time

import numpy as np
import pytest
from PIL import Image

from hasten.errors import DataError
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.shard_source import ShardSource
from hasten.recipes.echo.sweep import train_budget
from hasten.stream.decode_pool import decode_records, read_records
from hasten.stream.pack import pack
from hasten.stream.records import open_records
from hasten.stream.shard_store import open_shards
from test_recipes_echo import _memory_data


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """32 train JPEGs of 2 classes (16x16) packed shuffled into small shards; their
    records decoded in record order, as load_data does, and pack's index map."""
    root = tmp_path_factory.mktemp("echo-shards")
    rng = np.random.default_rng(0)
    for split, n in (("train", 16), ("test", 4)):
        for label, name in enumerate(("red", "blue")):
            (root / "src" / split / name).mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 120, (16, 16, 3), dtype=np.uint8)
                img[..., 0 if label == 0 else 2] += 120
                buf = io.BytesIO()
                Image.fromarray(img).save(buf, "JPEG", quality=90)
                (root / "src" / split / name / f"{i:03d}.jpg").write_bytes(buf.getvalue())
    pack(root / "src", root / "shards", shard_bytes=8 * 1024, seed=0, shuffle=True)
    records = open_records(root / "src", "train", cache=root / "cache")
    decoded = decode_records(read_records(records, np.arange(len(records))), 16)
    return open_shards(root / "shards"), np.random.default_rng(0).permutation(len(records)), decoded


def test_each_epoch_delivers_every_example_once_with_the_pixels_of_the_in_memory_set(packed):
    store, index_of, decoded = packed
    assert len(store.examples) > 2  # several shards: the plan's order matters
    source = ShardSource(store, index_of, decoded.labels, 16, buffer=8, prefetch=2, ahead=4)
    keys = source.keys(seed=3)
    n = len(decoded.labels)
    first, second = [next(keys) for _ in range(n)], [next(keys) for _ in range(n)]
    keys.close()
    assert sorted(first) == list(range(n)) and sorted(k - n for k in second) == list(range(n))
    assert first != [k - n for k in second]  # a new order each epoch
    assert np.array_equal(source.images, decoded.images)  # the bytes that came through, decoded
    assert source.arrived >= 2 * n and not source.skipped


def test_a_shard_label_that_disagrees_with_the_training_set_is_one_data_error(packed):
    store, index_of, decoded = packed
    wrong = decoded.labels.copy()
    wrong[index_of[0]] = 1 - wrong[index_of[0]]
    keys = ShardSource(store, index_of, wrong, 16, buffer=0, prefetch=1).keys(seed=0)
    with pytest.raises(DataError, match="label"):
        for _ in range(2 * len(wrong)):
            next(keys)


def test_an_index_map_that_is_not_a_permutation_is_refused(packed):
    store, index_of, decoded = packed
    with pytest.raises(DataError, match="permutation"):
        ShardSource(store, np.zeros_like(index_of), decoded.labels, 16)


def test_train_budget_trains_on_the_source_and_counts_its_examples(packed, one_thread):
    store, index_of, decoded = packed
    data = _memory_data(n=len(decoded.labels), m=40)
    data.train, data.train_labels = decoded.images, decoded.labels
    cfg = SweepConfig(data="x", train_images=len(decoded.labels), test_images=40, batch_size=3, epochs=1.0,
                      eval_points=(1.0,))
    source = ShardSource(store, index_of, decoded.labels, 16, buffer=8, prefetch=2)
    run = train_budget(cfg, data, RunSpec(steps=20, echo=2.0, lr=0.05), upstream=source, final_eval=False)
    time.sleep(0.2)  # a reader left running would go on decoding
    assert run["steps"] == 20 and run["upstream_decoded"] == source.arrived
    assert not any(t.name == "hasten-shard-source" for t in threading.enumerate())  # the run stopped its reader
    # e = 2: 60 items from about 30 fresh examples (the buffer holds a few more); all decoded here.
    assert 30 <= run["fresh_examples"] <= source.arrived
    with pytest.raises(ValueError, match="one of"):
        train_budget(cfg, data, RunSpec(steps=2), upstream=source, clocks=object())


def test_the_keys_follow_the_stream_loaders_plan(packed):
    """The source is the streaming pipeline's loader: its first epoch is that loader's
    training plan for the seed, mapped to training indices."""
    from hasten.stream.shard_loader import ShardLoader

    store, index_of, decoded = packed
    source = ShardSource(store, index_of, decoded.labels, 16, buffer=8, prefetch=2, chunk=5)
    keys = source.keys(seed=4)
    got = [next(keys) for _ in range(len(decoded.labels))]
    keys.close()
    loader = ShardLoader(store, batch_size=7, image_size=16, seed=4, shuffle_buffer=8, crop="whole", with_keys=True)
    expected = np.concatenate([k.numpy() for _, _, k in loader])
    assert got == index_of[expected].tolist()


def test_an_undecodable_image_is_skipped_and_counted_by_name(tmp_path, packed):
    _, _, decoded = packed
    rng = np.random.default_rng(1)
    for split in ("train", "test"):
        for name in ("red", "blue"):
            (tmp_path / "src" / split / name).mkdir(parents=True)
            for i in range(4):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buf, "JPEG")
                (tmp_path / "src" / split / name / f"{i:03d}.jpg").write_bytes(buf.getvalue())
    (tmp_path / "src" / "train" / "blue" / "002.jpg").write_bytes(b"not a jpeg at all")
    pack(tmp_path / "src", tmp_path / "shards", shard_bytes=4 * 1024, seed=0, shuffle=False)
    store = open_shards(tmp_path / "shards")
    labels = np.repeat([0, 1], 4)
    source = ShardSource(store, np.arange(8), labels, 16, buffer=0, prefetch=1, chunk=3, max_bad_fraction=0.05)
    keys = source.keys(seed=0)
    got = [next(keys) for _ in range(14)]  # two epochs of the 7 readable examples
    keys.close()
    first, second = sorted(got[:7]), sorted(k - 8 for k in got[7:])
    assert first == second and len(set(first)) == 7 and set(first) < set(range(8))  # one left out, each epoch
    assert source.skipped and all("002.jpg" in name for name, _ in source.skipped)
    with pytest.raises(DataError, match="max_bad_fraction"):  # the loader's bound holds here too
        keys = ShardSource(store, np.arange(8), labels, 16, buffer=0, prefetch=1, max_bad_fraction=0.0).keys(0)
        for _ in range(14):
            next(keys)


@pytest.mark.parametrize("echo", [1.0, 2.0, "auto"])
def test_train_budget_trains_through_the_echo_stage_of_the_stream(packed, one_thread, echo):
    """With ``stream`` the run's input is hasten's own pipeline end to end: ShardLoader, then
    EchoStage, which counts the fresh examples and (AutoEcho) reports each batch itself."""
    from hasten.stream.shard_loader import ShardLoader

    store, _, decoded = packed
    n = len(decoded.labels)
    data = _memory_data(n=n, m=40)
    cfg = SweepConfig(data="x", train_images=n, test_images=40, batch_size=3, epochs=1.0, eval_points=(1.0,),
                      image_size=16, value_every=2)
    made = []

    def stream(seed):
        made.append(ShardLoader(store, batch_size=3, image_size=16, seed=seed, shuffle_buffer=8, crop="pad-crop",
                                with_keys=True, drop_last=True))
        return made[-1]

    per_epoch = n // 3  # batches (drop_last)
    steps = 3 * per_epoch if echo == 1.0 else 24  # three epochs without echoing
    spec = RunSpec(steps=steps, echo=echo, lr=0.05, e_max=2.0, seed=5)
    run = train_budget(cfg, data, spec, stream=stream, final_eval=False)
    assert len(made) == 1 and made[0].seed == 5
    assert run["steps"] >= steps and run["upstream_skipped_count"] == 0
    if echo == 1.0:
        assert run["fresh_examples"] == 3 * per_epoch * 3  # every epoch's full batches, through the stage
    elif echo == 2.0:
        assert run["mean_echo_factor"] == 2.0 and run["fresh_examples"] < 24 * 3  # repeats among the items
    else:
        assert run["autoecho_windows"]  # the stage reported its batches to AutoEcho
