"""StreamLoader: sharded, augmented, echoed batches; skipped files; dead workers; normalisation."""

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
from hasten.data.normalize import normalize
from hasten.data.workers import DecodeWorkerError
from hasten.echo.auto import AutoEcho
from hasten.errors import DataError
from hasten.stream.loader import StreamLoader
from hasten.stream.records import open_records
from hasten.stream.slow_storage import SlowStorage

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


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_ranks_cover_every_example_once(folder, workers):
    records = open_records(folder)
    keys = []
    for rank in range(3):
        loader = StreamLoader(records, batch_size=7, rank=rank, world_size=3, workers=workers, chunk_size=8,
                              with_keys=True)
        loader.set_epoch(2)
        for images, labels, k in loader:
            assert images.shape[1:] == (3, 16, 16) and images.dtype == torch.uint8
            assert torch.equal(labels, torch.from_numpy(records.labels[k.numpy()]))
            keys += k.tolist()
    assert sorted(keys) == list(range(60))


def test_stream_inside_a_dataloader(folder):
    loader = StreamLoader(open_records(folder), batch_size=5, with_keys=True)
    dl = torch.utils.data.DataLoader(loader, batch_size=None, num_workers=2)
    keys = [k for _, _, ks in dl for k in ks.tolist()]
    assert sorted(keys) == list(range(60))


def collect(loader):
    return [(x.clone(), k.clone()) for x, _, k in loader]


def test_example_before_copies_differ_after_copies_identical(folder):
    records = open_records(folder)
    for variant, expect_equal in (("example-before", False), ("example-after", True)):
        with pytest.warns(UserWarning, match="repeated copies"):  # deliberately unmixed
            loader = StreamLoader(records, batch_size=60, echo=2, variant=variant, with_keys=True, shuffle_buffer=0)
        pairs = same = 0
        for images, keys in collect(loader):
            for i in range(0, len(keys) - 1, 2):
                assert keys[i] == keys[i + 1]  # no shuffle buffer: copies are adjacent
                pairs += 1
                same += torch.equal(images[i], images[i + 1])
        assert pairs == 60
        if expect_equal:
            assert same == pairs
        else:
            assert same <= 0.1 * pairs  # a random crop and flip coincide rarely (1 in 162)


@pytest.mark.parametrize("echo", [1, 2])
def test_stream_augmentation_is_a_reference_crop_flip_covering_pad_4(folder, echo):
    """Every streamed image is its decoded example translated by (dy, dx) in
    [-4, 4]^2 with reflect padding and mirrored or not: every shift occurs, none
    beyond, on the direct path (echo 1) and the late one (example-before echoing)."""
    records = open_records(folder)
    plain = {}
    for x, _, keys in StreamLoader(records, batch_size=60, augment=False, with_keys=True, shuffle=False):
        plain.update({k: xi.numpy() for k, xi in zip(keys.tolist(), x)})
    loader = StreamLoader(records, batch_size=60, echo=echo, with_keys=True)
    drawn = []
    for _ in range(14):
        for x, _, keys in loader:
            drawn += [identify(xi.numpy(), plain[k], 4) for xi, k in zip(x, keys.tolist())]
    assert {(dy, dx) for dy, dx, _, _ in drawn} == set(offsets(4))
    assert 0.4 < np.mean([m for _, _, m, _ in drawn]) < 0.6


def test_batch_echo_and_counters(folder):
    loader = StreamLoader(open_records(folder), batch_size=10, echo=3, variant="batch", with_keys=True)
    batches = collect(loader)
    assert len(batches) == 18
    for i in range(0, 18, 3):
        assert all(torch.equal(batches[i][0], batches[i + j][0]) for j in (1, 2))
    c = loader.counters
    assert c.fresh_examples == 60 and c.fresh_batches == 6 and c.batches_emitted == 18


def test_shuffle_buffer_in_stream_lowers_duplicates(folder):
    rates = []
    with pytest.warns(UserWarning, match="repeated copies"):  # no buffer: copies stay together
        StreamLoader(open_records(folder), batch_size=12, echo=2, shuffle_buffer=0)
    for buffer in (0, 120):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader = StreamLoader(open_records(folder), batch_size=12, echo=2, shuffle_buffer=buffer)
        list(loader)
        rates.append(loader.counters.duplicate_rate)
    assert rates[0] == pytest.approx(0.5) and rates[1] < 0.3


@pytest.mark.parametrize("kwargs,match", [
    (dict(echo=0.5), ">= 1"), (dict(variant="sideways"), "example-before, example-after, batch"),
    (dict(shuffle_buffer=-1), "integer >= 0"), (dict(batch_size=0), "batch_size"), (dict(workers=-1), "workers"),
])
def test_stream_rejects_bad_parameters(folder, kwargs, match):
    args = dict(batch_size=4) | kwargs
    with pytest.raises(ValueError, match=match):
        next(iter(StreamLoader(open_records(folder), **args)))


def test_corrupt_images_skipped_and_counted_then_refused(folder, tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(folder, root)
    (root / "train" / "cat" / "000.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    data = (root / "train" / "dog" / "001.jpg").read_bytes()
    (root / "train" / "dog" / "001.jpg").write_bytes(data[: len(data) // 2])
    records = open_records(root)
    loader = StreamLoader(records, batch_size=8, max_bad_fraction=0.05, with_keys=True)
    keys = [k for _, _, ks in loader for k in ks.tolist()]
    assert len(keys) == 58
    assert sorted(name for name, _ in loader.skipped) == ["train/cat/000.jpg", "train/dog/001.jpg"]
    with pytest.raises(DataError, match="max_bad_fraction"):
        list(StreamLoader(records, batch_size=8, max_bad_fraction=0.01))


def test_killed_worker_raises_within_seconds(folder):
    slow = SlowStorage(open_records(folder), latency_s=0.05)
    loader = StreamLoader(slow, batch_size=4, workers=2, chunk_size=4, poll_s=0.1)
    it = iter(loader)
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
    loader = StreamLoader(open_records(folder), batch_size=8, device="cuda", echo=2, variant="batch")
    batches = list(loader)
    assert len(batches) == 16
    assert all(x.is_cuda and y.is_cuda and x.dtype == torch.uint8 for x, y in batches)


def test_autoecho_at_one_trains_on_exactly_the_batches_of_no_echo(folder):
    records = open_records(folder)
    plain = collect(StreamLoader(records, batch_size=8, shuffle_buffer=16, with_keys=True))
    auto = collect(StreamLoader(records, batch_size=8, shuffle_buffer=16, with_keys=True,
                                echo=AutoEcho(e_max=1.0), variant="example-before"))
    assert len(plain) == len(auto)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain, auto))




def test_mean_and_std_give_the_same_batches_normalised_on_the_device(folder):
    records = open_records(folder)
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    raw = collect(StreamLoader(records, batch_size=8, with_keys=True))
    normed = [(x, k) for x, _, k in StreamLoader(records, batch_size=8, with_keys=True, mean=mean, std=std)]
    assert len(normed) == len(raw)
    for (x, k), (xn, kn) in zip(raw, normed):
        assert torch.equal(k, kn)
        assert xn.dtype == torch.float32 and xn.is_contiguous(memory_format=torch.channels_last)
        assert torch.allclose(xn, normalize(x, mean, std))
    with pytest.raises(ValueError, match="mean and std"):
        StreamLoader(records, batch_size=8, mean=mean)


@pytest.mark.gpu
def test_normalised_batches_are_made_on_the_gpu(folder):
    loader = StreamLoader(open_records(folder), batch_size=8, device="cuda", mean=[0.5] * 3, std=[0.25] * 3)
    assert loader._norm[0].is_cuda  # built once, on the device
    x, y = next(iter(loader))
    assert x.is_cuda and y.is_cuda and x.dtype == torch.float32
