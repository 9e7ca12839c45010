"""EchoStage over ShardLoader: exactly-once (and exactly-e-times) epochs over ranks, echo
variants and counters, the small-image crops, resume, skipped files, dead workers."""

import io
import multiprocessing as mp
import os
import shutil
import signal
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from augment_reference import identify, offsets
from hasten.decode.image import decode_fitted
from hasten.data.workers import DecodeWorkerError
from hasten.echo.auto import AutoEcho
from hasten.errors import DataError
from hasten.stream.echo_stage import EchoStage
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.slow_storage import SlowStorage
from hasten.stream.sources import open_source

CLASSES = ("cat", "dog", "emu")


def jpeg_bytes(rng, size=16):
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """train/<class>/NNN.jpg (60 random 16x16 images) and test/<class>/ (6)."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 20), ("test", 2)):
        for c in CLASSES:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                (root / split / c / f"{i:03d}.jpg").write_bytes(jpeg_bytes(rng))
    return root


def stage(store, echo=1, *, variant="example-before", shuffle_buffer=None, crop="pad-crop", **loader):
    loader = ShardLoader(store, **{"image_size": 16, "crop": crop, "with_keys": True} | loader)
    return EchoStage(loader, echo, variant=variant, shuffle_buffer=shuffle_buffer)


def by_key(store):
    """(label, file name) of every global example number, read shard by shard (the reference)."""
    records = [r for i in range(len(store)) for r in store.shard_records(i)]
    return [r.label for r in records], [r.name.partition(":")[2] for r in records]


def collect(loader):
    return [(x.clone(), k.clone()) for x, _, k in loader]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("echo", [1, 2])
def test_ranks_deliver_every_example_e_times_per_epoch(folder, workers, echo):
    store = open_source(folder)
    labels, _ = by_key(store)
    keys = []
    for rank in range(3):
        s = stage(store, echo, batch_size=7, rank=rank, world_size=3, workers=workers, chunk_size=8)
        s.set_epoch(2)
        for images, y, k in s:
            assert images.shape[1:] == (3, 16, 16) and images.dtype == torch.uint8
            assert y.tolist() == [labels[i] for i in k.tolist()]
            keys += k.tolist()
        assert s.epoch == 3  # a whole epoch advances it
    assert sorted(keys) == sorted(list(range(60)) * echo)


def test_example_before_copies_differ_after_copies_identical(folder):
    store = open_source(folder)
    for variant, expect_equal in (("example-before", False), ("example-after", True)):
        with pytest.warns(UserWarning, match="repeated copies"):  # deliberately unmixed
            s = stage(store, 2, variant=variant, batch_size=60, shuffle_buffer=0)
        pairs = same = 0
        for images, keys in collect(s):
            for i in range(0, len(keys) - 1, 2):
                assert keys[i] == keys[i + 1]  # no shuffle buffer: copies are adjacent
                pairs += 1
                same += torch.equal(images[i], images[i + 1])
        assert pairs == 60
        if expect_equal:
            assert same == pairs
        else:
            assert same <= 0.1 * pairs  # a random crop and flip coincide rarely (1 in 162)


@pytest.mark.parametrize("variant", ["example-before", "example-after", "batch"])
def test_with_copies_numbers_each_examples_copies_from_zero(folder, variant):
    """The copy numbers AutoEcho's repeat-value measurement takes: each example's copies are
    numbered 0 (its first), 1, 2, once each, wherever the shuffle buffer puts them."""
    loader = ShardLoader(open_source(folder), batch_size=8, image_size=16, crop="pad-crop", with_keys=True)
    s = EchoStage(loader, 3, variant=variant, shuffle_buffer=0 if variant == "batch" else 40, with_copies=True)
    seen: dict[int, list[int]] = {}
    for images, labels, keys, copies in s:
        assert copies.dtype == torch.int64 and len(copies) == len(keys) == len(images)
        for k, c in zip(keys.tolist(), copies.tolist()):
            seen.setdefault(k, []).append(c)
    assert len(seen) == 60
    for numbers in seen.values():
        # (a repeated batch is not numbered: no repeat shares a batch with its example)
        assert sorted(numbers) == ([0, 0, 0] if variant == "batch" else [0, 1, 2])
    plain = ShardLoader(open_source(folder), batch_size=8, image_size=16, crop="pad-crop")
    (x, y, copies), *_ = EchoStage(plain, 1, with_copies=True)
    assert not copies.any() and len(copies) == len(y)


def test_whole_crop_is_the_fitted_decode_of_each_file(folder):
    store = open_source(folder)
    _, names = by_key(store)
    for x, _, keys in ShardLoader(store, batch_size=60, image_size=12, crop="whole", with_keys=True, train=False):
        for xi, k in zip(x, keys.tolist()):
            expected = decode_fitted((folder / names[k]).read_bytes(), names[k], 12)
            assert np.array_equal(xi.permute(1, 2, 0).numpy(), expected)


@pytest.mark.parametrize("echo", [1, 2])
def test_stream_augmentation_is_a_reference_crop_flip_covering_pad_4(folder, echo):
    """Every streamed image is its decoded example translated by (dy, dx) in
    [-4, 4]^2 with reflect padding and mirrored or not: every shift occurs, none
    beyond, in the decode workers (echo 1) and after the echo stage (example-before)."""
    store = open_source(folder)
    plain = {}
    for x, _, keys in ShardLoader(store, batch_size=60, image_size=16, crop="whole", with_keys=True, train=False):
        plain.update({k: xi.numpy() for k, xi in zip(keys.tolist(), x)})
    s = stage(store, echo, batch_size=60)
    drawn = []
    for _ in range(14):
        for x, _, keys in s:
            drawn += [identify(xi.numpy(), plain[k], 4) for xi, k in zip(x, keys.tolist())]
    assert {(dy, dx) for dy, dx, _, _ in drawn} == set(offsets(4))
    assert 0.4 < np.mean([m for _, _, m, _ in drawn]) < 0.6


def test_pad_crop_is_the_same_in_workers_and_in_the_loading_process(folder):
    store = open_source(folder)
    a = collect(ShardLoader(store, batch_size=8, image_size=16, crop="pad-crop", with_keys=True))
    b = collect(ShardLoader(store, batch_size=8, image_size=16, crop="pad-crop", with_keys=True, workers=2))
    assert len(a) == len(b) and all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))


def test_batch_echo_and_counters(folder):
    s = stage(open_source(folder), 3, variant="batch", batch_size=10)
    batches = collect(s)
    assert len(batches) == 18
    for i in range(0, 18, 3):
        assert all(torch.equal(batches[i][0], batches[i + j][0]) for j in (1, 2))
    c = s.counters
    assert c.fresh_examples == 60 and c.fresh_batches == 6 and c.batches_emitted == 18


def test_shuffle_buffer_in_stream_lowers_duplicates(folder):
    rates = []
    with pytest.warns(UserWarning, match="repeated copies"):  # no buffer: copies stay together
        stage(open_source(folder), 2, batch_size=12, shuffle_buffer=0)
    for buffer in (0, 120):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = stage(open_source(folder), 2, batch_size=12, shuffle_buffer=buffer)
        list(s)
        rates.append(s.counters.duplicate_rate)
    assert rates[0] == pytest.approx(0.5) and rates[1] < 0.3


@pytest.mark.parametrize("stage_kwargs,loader_kwargs,match", [
    (dict(echo=0.5), {}, ">= 1"), (dict(variant="sideways"), {}, "example-before, example-after, batch"),
    (dict(shuffle_buffer=-1), {}, "integer >= 0"), ({}, dict(batch_size=0), "batch_size"),
    ({}, dict(workers=-1), "workers"), ({}, dict(crop="squash"), "random-resized, center, pad-crop, whole"),
    (dict(echo=2), dict(crop="random-resized"), "crop='pad-crop'"),
])
def test_rejects_bad_parameters(folder, stage_kwargs, loader_kwargs, match):
    with pytest.raises(ValueError, match=match):
        next(iter(stage(open_source(folder), **dict(batch_size=4) | loader_kwargs | stage_kwargs)))


def test_example_after_and_batch_echo_work_on_the_fused_crop(folder):
    store = open_source(folder)
    for variant in ("example-after", "batch"):
        s = stage(store, 2, variant=variant, crop="random-resized", batch_size=10)
        assert sorted(k for _, k in collect(s) for k in k.tolist()) == sorted(list(range(60)) * 2)


def test_resume_mid_epoch_without_echo_yields_exactly_the_rest(folder):
    store = open_source(folder)
    s = stage(store, batch_size=8)
    s.set_epoch(1)
    it = iter(s)
    first = [k for _ in range(3) for k in next(it)[2].tolist()]
    state = s.loader.state_dict()
    it.close()
    resumed = stage(store, batch_size=8)
    resumed.loader.load_state_dict(state)
    resumed.set_epoch(1)  # the same epoch keeps the position
    rest = [k for _, _, ks in resumed for k in ks.tolist()]
    assert len(first) == 24 and sorted(first + rest) == list(range(60))


def test_corrupt_images_skipped_and_counted_then_refused(folder, tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(folder, root)
    (root / "train" / "cat" / "000.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    data = (root / "train" / "dog" / "001.jpg").read_bytes()
    (root / "train" / "dog" / "001.jpg").write_bytes(data[: len(data) // 2])
    store = open_source(root)
    s = stage(store, batch_size=8, max_bad_fraction=0.05)
    keys = [k for _, _, ks in s for k in ks.tolist()]
    assert len(keys) == 58 and len(set(keys)) == 58
    assert sorted(name.partition(":")[2] for name, _ in s.skipped) == ["train/cat/000.jpg", "train/dog/001.jpg"]
    with pytest.raises(DataError, match="max_bad_fraction"):
        list(stage(store, batch_size=8, max_bad_fraction=0.01))


def test_killed_worker_raises_within_seconds(folder):
    slow = SlowStorage(open_source(folder, per_shard=8), latency_s=0.05)
    it = iter(stage(slow, batch_size=4, workers=2, chunk_size=4, poll_s=0.1))
    next(it)
    victims = [p for p in mp.active_children() if p.name.startswith("hasten-decode-")]
    assert victims
    os.kill(victims[0].pid, signal.SIGKILL)
    raised = []

    def drain():  # in a thread, so that a hang fails the test instead of stalling it
        try:
            for _ in it:
                pass
        except DecodeWorkerError as e:
            raised.append(e)

    t0 = time.monotonic()
    consumer = threading.Thread(target=drain, daemon=True)
    consumer.start()
    consumer.join(timeout=10)
    assert not consumer.is_alive(), "the iterator hung after a worker died"
    assert raised and "SIGKILL" in str(raised[0])
    assert time.monotonic() - t0 < 5


@pytest.mark.gpu
def test_batches_arrive_on_the_gpu(folder):
    batches = list(stage(open_source(folder), 2, variant="batch", batch_size=8, device="cuda", with_keys=False))
    assert len(batches) == 16
    assert all(x.is_cuda and y.is_cuda and x.dtype == torch.uint8 for x, y in batches)


def test_autoecho_at_one_trains_on_exactly_the_batches_of_no_echo(folder):
    store = open_source(folder)
    plain = collect(stage(store, batch_size=8, shuffle_buffer=16))
    auto = collect(stage(store, AutoEcho(e_max=1.0), batch_size=8, shuffle_buffer=16))
    assert len(plain) == len(auto)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain, auto))
