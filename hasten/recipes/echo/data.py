"""The echo sweep's data and input pipeline (``hasten.recipes.echo.sweep`` runs the sweep).

- **Data.** A fixed class-balanced subset of CIFAR-10-JPEG, decoded once at the
  training resolution into host memory (``load_data``), and the test set in a fixed
  order whose head detects the target (``test_batches``).
- **The slow source.** ``Source`` describes it (per-request latency, requests in
  flight, one link whose bandwidth sets R); ``fresh_keys`` reads a new permutation of
  the subset each epoch through ``hasten.stream.slow_storage``.
- **The pipeline.** ``pipeline`` puts the echo stage, the shuffle buffer and batching
  after the source, built from the stage functions that ``hasten.stream.echo_stage``
  composes after ``ShardLoader``, on training keys instead of decoded images, and numbers
  the copies that key the augmentation.

The fresh examples come from host memory, decoded once, not through ``ShardLoader``:
the sweep's step (batch 64 at 16x16) is about as short as decoding its batch on the
same cores, so a decode in the loop would measure that contention rather than echoing
(docs/results/echo.md). The real-source experiment, whose step is 20 times its decode, reads
through ``ShardLoader`` (``hasten.recipes.echo.shard_source``).

Changes the training math: yes with echoing (repeated examples); e = 1 is plain
training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from hasten.data.normalize import normalize
from hasten.echo import AutoEcho, EchoCounters, echo_batches, echo_examples, shuffle_buffer
from hasten.errors import ConfigError
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.network import MEAN, STD
from hasten.stream.decode_pool import decode_records, read_records
from hasten.stream.records import open_records
from hasten.stream.slow_storage import SlowStorage, concurrent_reads


# ----------------------------------------------------------------------------- The slow source
@dataclass(frozen=True)
class Source:
    """The slow source: per-request latency, concurrent requests, one shared link."""
    latency_s: float
    link_bytes_per_s: float
    request_examples: int = 32
    in_flight: int = 1  # requests at once: the loader configuration ...
    prefetch: int = 0  # ... and finished requests held ahead of the consumer


# ----------------------------------------------------------------------------- Data
@dataclass
class MemoryData:
    """Decoded images in host memory: the fixed training subset and the test set."""
    train: np.ndarray  # (N, H, W, 3) uint8
    train_labels: np.ndarray  # (N,) int64
    wire_bytes: np.ndarray  # (N,) JPEG bytes of each training image: what a read transfers
    test: torch.Tensor  # (M, 3, H, W) uint8
    test_labels: torch.Tensor
    eval_order: torch.Tensor  # a fixed permutation of the test set; its head detects the target
    classes: list[str] = field(default_factory=list)


def balanced_subset(labels: np.ndarray, n: int, seed: int = 2019) -> np.ndarray:
    """``n`` indices, as equal a share of each class as possible, fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    per = [n // len(classes) + (1 if i < n % len(classes) else 0) for i in range(len(classes))]
    picks = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, per)]
    return np.sort(np.concatenate(picks))


def load_data(cfg: SweepConfig) -> MemoryData:
    train_records, test_records = open_records(cfg.data, "train"), open_records(cfg.data, "test")
    if len(train_records) < cfg.train_images:
        raise ConfigError(f"{cfg.data} has {len(train_records)} training images; the sweep's subset needs "
                          f"{cfg.train_images}")
    idx = balanced_subset(np.asarray(train_records.labels), cfg.train_images, cfg.subset_seed)
    train = decode_records(read_records(train_records, idx), cfg.image_size)
    test = decode_records(read_records(test_records, np.arange(len(test_records))), cfg.image_size)
    if len(train.bad) or len(test.bad):
        raise ConfigError(f"unreadable images in {cfg.data}: {(train.bad + test.bad)[:3]}")
    offsets = np.asarray(train_records.offsets)
    return MemoryData(
        train=train.images, train_labels=train.labels, wire_bytes=(offsets[idx + 1] - offsets[idx]),
        test=torch.from_numpy(test.images).permute(0, 3, 1, 2).contiguous(), test_labels=torch.from_numpy(test.labels),
        eval_order=torch.from_numpy(np.random.default_rng(12345).permutation(len(test.labels))),
        classes=list(train_records.classes))


def test_batches(data: MemoryData, n: int | None, device, batch_size: int = 1000):
    """Normalised test batches: the first ``n`` of the fixed order (None: all)."""
    mean, std = torch.tensor(MEAN, device=device), torch.tensor(STD, device=device)
    idx = data.eval_order[:n] if n else data.eval_order
    for part in idx.split(batch_size):
        yield normalize(data.test[part].to(device), mean, std), data.test_labels[part].to(device)


# ----------------------------------------------------------------------------- The input pipeline
# The stream runs on across epochs, as a repeated tf.data pipeline does: epoch k's item
# with training-set index i has the key k * N + i. Keys identify a (example, epoch) pair
# for the augmentation, and a shuffle buffer is filled once per run, not once per epoch.
class IdentityStore:
    """A store whose record for key k is k itself (a request names its byte range)."""

    def __getitem__(self, part):
        return part


def fresh_keys(n: int, seed: int, storage: SlowStorage | None, source: Source | None) -> Iterator[int]:
    """Keys of fresh examples, a new permutation of the ``n`` examples each epoch, read
    through the slow source if any (requests of ``source.request_examples``)."""
    def epochs():
        epoch = 0
        while True:
            yield np.random.default_rng([seed, 7919, epoch]).permutation(n) + epoch * n
            epoch += 1

    if storage is None:
        for keys in epochs():
            yield from keys.tolist()
        return
    parts = (keys[i : i + source.request_examples] for keys in epochs()
             for i in range(0, n, source.request_examples))
    for part in concurrent_reads(storage, parts, in_flight=source.in_flight, prefetch=source.prefetch):
        yield from part.tolist()


def _number_copies(items: Iterator[int]) -> Iterator[tuple[int, int, int]]:
    """(key, copy number, copy number): a key repeats only as an echoed copy."""
    previous, copy = None, 0
    for k in items:
        copy = copy + 1 if k == previous else 0
        previous = k
        yield k, copy, copy


def _batches(items, batch_size: int) -> Iterator[np.ndarray]:
    """(3, B) int64 arrays: keys, augmentation copy keys, copy numbers (0: a fresh item)."""
    group = []
    for item in items:
        group.append(item)
        if len(group) == batch_size:
            yield np.array(group, dtype=np.int64).T
            group = []


def _counted(items, counters: EchoCounters):
    for k in items:
        counters.fresh_examples += 1
        yield k


def pipeline(fresh: Iterator[int], spec: RunSpec, factor, buffer, batch_size: int,
             counters: EchoCounters, clock: Callable[[], float] | None = None) -> Iterator[np.ndarray]:
    """(keys, copy numbers) batches: echo stage, shuffle buffer and batching as in
    ``hasten.stream.echo_stage``. The copy numbers key the augmentation: example-before
    augments every copy afresh, example-after and batch echoing repeat identical copies.
    Row 2 numbers the copies of example echoing (AutoEcho's loss on repeats)."""
    echoing = isinstance(factor, AutoEcho) or factor != 1.0
    if not echoing:
        return _batches(((k, 0, 0) for k in _counted(fresh, counters)), batch_size)
    if spec.variant == "batch":
        batches = _batches(((k, 0, 0) for k in _counted(fresh, counters)), batch_size)
        return echo_batches(batches, factor, seed=spec.seed, counters=counters, clock=clock)
    copies = _number_copies(echo_examples(fresh, factor, seed=spec.seed, counters=counters, clock=clock))
    if spec.variant == "example-after":
        copies = ((k, 0, n) for k, _, n in copies)  # identical copies: one augmentation per example
    return _batches(shuffle_buffer(copies, buffer, seed=spec.seed), batch_size)
