"""EchoStage with AutoEcho when the pipeline runs on a thread of its own, as it does on
CUDA (the pinning thread): what AutoEcho measures, and where its agreement runs."""

import threading
import time

import numpy as np
import pytest
import torch
from conftest import write_image_folder
from test_echo_auto_rules import _FakeRanks
from test_stream_echo_stage import jpeg_bytes

import hasten.stream.echo_stage as stage_module
from hasten.echo.auto import AutoEcho
from hasten.stream.device_copy import threaded
from hasten.stream.echo_stage import EchoStage
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.sources import open_source


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """train/<class>/NNN.jpg: 60 random 16x16 images in 3 classes (and a test split of 3)."""
    rng = np.random.default_rng(0)
    return open_source(write_image_folder(tmp_path_factory.mktemp("images"), ("cat", "dog", "emu"),
                                          {"train": 20, "test": 1}, lambda c, i: jpeg_bytes(rng)))


def stage(store, auto, batch_size, chunk_size):
    return EchoStage(ShardLoader(store, batch_size=batch_size, chunk_size=chunk_size, image_size=16, crop="pad-crop"),
                     auto)


def _pipeline_on_a_thread(monkeypatch, pin_s=0.0):
    """to_device as on CUDA: the whole pipeline iterated on a thread of its own, each
    batch taking ``pin_s`` there (pinning), handed over through a bounded queue."""
    def to_device(batches, device, *, depth=2):
        def pin(batch):
            time.sleep(pin_s)
            return batch
        return threaded(batches, pin, depth=depth)

    monkeypatch.setattr(stage_module, "to_device", to_device)


def test_the_agreement_runs_on_autoechos_own_group_created_on_the_training_thread(store, monkeypatch):
    # DDP on CUDA: the default group is NCCL, used by the training thread. A collective on it
    # from the pipeline's thread would interleave with DDP's in a rank-dependent order.
    _pipeline_on_a_thread(monkeypatch)
    ranks = _FakeRanks(other_estimate=1.0, other_cap=8.0)
    ranks.install(monkeypatch)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "gloo" if group else "nccl")
    auto = AutoEcho(interval=8)
    training_thread = threading.get_ident()
    s = stage(store, auto, 6, 8)
    # Two epochs: the windows before the loop's first step carry to it (no agreement), and on a
    # loaded machine the pipeline's thread may run through most of one small epoch before that.
    for _ in range(2):
        for _ in s:
            time.sleep(0.002)
    assert ranks.created == [("gloo", training_thread)]
    assert len(ranks.groups) >= 3 and all(group == ("autoecho-group", 1) for group, _ in ranks.groups)
    assert all(t != training_thread for _, t in ranks.groups)  # the stage did run on the other thread


def test_autoecho_hears_the_consumers_step_not_the_pinning_threads_time(store, monkeypatch):
    # Pinning is slow (60 ms a batch, slept), the training step fast (10 ms, slept), decoding
    # fast (6 tiny JPEGs: a few ms even on a starved core): the loop waits, but on work after
    # the echo stage, which echoing cannot hide. e must stay 1.
    _pipeline_on_a_thread(monkeypatch, pin_s=0.06)
    # Windows of 5 batches: one batch's decode stalled ~20 ms by a loaded machine's scheduler
    # is then a 5% wait, not a 25% one (an R of 1.25, where AutoEcho starts to echo).
    auto = AutoEcho(interval=30)
    reports = []
    record_step = auto.record_step

    def recording(wait_s, step_s, items):
        reports.append((threading.get_ident(), wait_s, step_s, items))
        record_step(wait_s, step_s, items)

    monkeypatch.setattr(auto, "record_step", recording)
    s = stage(store, auto, 6, 6)
    for _ in range(3):
        for _ in s:
            time.sleep(0.01)
    assert {t for t, *_ in reports} == {threading.get_ident()}
    assert len(reports) == 30 and sum(items for *_, items in reports) == 180
    steps = sorted(step for _, _, step, _ in reports)
    waits = sorted(wait for _, wait, _, _ in reports)
    assert steps[15] < 0.03 and waits[15] > 0.03  # the consumer's own step, and its wait on pinning
    assert auto.windows >= 5 and auto.factor == 1.0


def test_time_inside_paused_is_not_reported_as_the_step(store, monkeypatch):
    auto = AutoEcho(e_max=1.0, interval=6)  # e = 1: three batches of 20
    reports = []
    monkeypatch.setattr(auto, "record_step", lambda wait_s, step_s, items: reports.append(step_s))
    for _ in stage(store, auto, 20, 20):
        with auto.paused():
            time.sleep(0.05)
    assert len(reports) == 3 and max(reports) < 0.04
