"""Data echoing as a stage of the streaming pipeline: ``EchoStage(ShardLoader(...), e)``.

    store of shards -> ShardLoader: plan, read, decode [+ augment] in workers, batch
    -> EchoStage: [unbatch -> echo -> shuffle buffer -> batch -> augment] or [echo batches]
    -> pinned memory -> device

Where the echo stage sits is the variant (Choi et al., 2019):

- ``example-before``: the loader decodes without augmentation (its ``pad-crop`` decodes
  ``whole``), the stage echoes the decoded examples and augments every copy afresh, keyed
  by (seed, epoch, example, copy) (``hasten.data.host_augment.keyed_crop_flip``). The fused
  random-resized crop has no decode without its crop, so this variant needs ``pad-crop``;
- ``example-after``: the loader decodes and augments; the stage echoes augmented examples
  (identical copies);
- ``batch``: the stage echoes whole batches.

After an example echo, a shuffle buffer (``hasten.echo.shuffle_buffer``) spreads the copies
apart, sized by default so that about 1% of a batch are repeated copies
(``hasten.echo.default_shuffle_buffer``; with ``AutoEcho`` it follows the current e).
Without echoing the stage hands the loader's batches on (re-mixed through the buffer
only when one is given). The augmentation is a function of (seed, epoch, example, copy),
not of where it runs, so echoing at e = 1 (``AutoEcho`` switched off) trains on exactly
the batches of no echoing.

``AutoEcho``: the stage reports each batch from the consumer's side (the wait for it, the
consumer's own time until it asks for the next, its items), so that on CUDA, where the
pipeline runs on the pinning thread of ``to_device``, AutoEcho hears the training step and
not the pinning; and it creates AutoEcho's own process group on the training thread before
that thread starts (``AutoEcho.setup_distributed``), so that the ranks agree on e without
touching DDP's group from another thread.

Position: the loader's (``stage.loader.state_dict()``). Without echoing and without a
buffer in the stage, it is exact, as the loader's own; with echoing it counts the
examples the stage took from the loader, some of which may still sit in its buffer.

Based on: Choi, Passos, Shallue, Dahl, "Faster Neural Network Training with Data Echoing"
(2019, arXiv:1907.05550).

Changes the training math: no without echoing; yes with echoing (see hasten.echo.stages).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat

import numpy as np
import torch

from hasten.data.host_augment import keyed_crop_flip
from hasten.echo.auto import AutoEcho
from hasten.echo.counters import EchoCounters
from hasten.echo.stages import (
    Factor,
    auto_shuffle_buffer,
    check_factor,
    check_variant,
    default_shuffle_buffer,
    echo_batches,
    echo_examples,
    warn_if_small_buffer,
)
from hasten.stream.chunk_decode import UNAUGMENTED, DecodedChunk, pad_crop_seed
from hasten.stream.device_copy import to_device
from hasten.echo.shuffle_buffer import check_buffer_size, shuffle_buffer


class EchoStage:
    """``loader``'s batches echoed ``echo`` times (a factor >= 1 or an ``AutoEcho``) at the
    place ``variant`` names (module docstring); an iterable of batches like the loader's
    own: (images uint8 (B, 3, S, S) channels_last, labels int64 (B,)), with the loader's
    ``with_keys`` also the global example numbers, on the loader's device.

    ``shuffle_buffer``: items (examples; batches for batch echoing) mixed after the echo
    stage; None: sized from e and the batch (``default_shuffle_buffer``; following e with
    ``AutoEcho``), 0 without echoing and for batch echoing. A given size too small for a
    fixed e warns. ``clock``: the seconds the echo stage's timings (and AutoEcho's) are read
    from (default ``time.perf_counter``). ``counters`` accumulate over epochs; call
    ``set_epoch`` as on the loader (iterating also advances it). ``with_copies``: each
    batch also carries its items' copy numbers (int64 (B,), last; 0: the first copy of
    its example, 1 the first repeat, ...; all 0 for batch echoing and without echoing),
    which ``hasten.echo.repeat_value.gradient_dots`` takes to measure what a repeat is
    worth for ``AutoEcho``.
    """

    def __init__(self, loader, echo: Factor = 1, *, variant: str = "example-before",
                 shuffle_buffer: int | None = None, clock: Callable[[], float] | None = None,
                 with_copies: bool = False):
        self.loader = loader
        self.with_copies = bool(with_copies)
        self.echo = check_factor(echo)
        self.variant = check_variant(variant)
        self.batch_size = loader.batch_size
        self.clock = clock
        if self._augments_late() and UNAUGMENTED.get(loader.crop) is None:
            raise ValueError(f"example-before echoing augments each copy after the echo stage, and the loader's "
                             f"crop {loader.crop!r} is fused with its decode: use crop='pad-crop', or the "
                             "example-after or batch variant")
        self.buffer = self._buffer_size(shuffle_buffer)
        self.counters = EchoCounters()

    @property
    def echoing(self) -> bool:
        return isinstance(self.echo, AutoEcho) or self.echo != 1

    def _augments_late(self) -> bool:
        crop = self.loader.crop
        return self.echoing and self.variant == "example-before" and UNAUGMENTED.get(crop) != crop

    def _buffer_size(self, size: int | None):
        """The shuffle buffer after echoing: an int, or a function of AutoEcho's current e."""
        example_echo = self.variant != "batch"
        if size is not None:
            size = check_buffer_size(size)
            if example_echo and not isinstance(self.echo, AutoEcho):
                warn_if_small_buffer(size, self.echo, self.batch_size, stacklevel=4)
            return size
        if not example_echo:
            return 0
        if isinstance(self.echo, AutoEcho):
            # Follows e: a buffer sized for e_max while e is still 1 would hold back
            # thousands of fresh examples before the first step.
            return auto_shuffle_buffer(self.echo, self.batch_size)
        return default_shuffle_buffer(self.echo, self.batch_size) if self.echo > 1 else 0

    @property
    def epoch(self) -> int:
        return self.loader.epoch

    @property
    def skipped(self) -> list[tuple[str, str]]:
        return self.loader.skipped

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches per epoch without echoing (echoing adds about (e - 1) times as many)."""
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        loader, c = self.loader, self.counters
        epoch = loader.epoch
        late = self._augments_late()
        seed = (loader.seed * 1_000_003 + epoch) * 1_000_003 + loader.rank
        chunks = loader.host_batches(augment=not late)
        example_echo = self.echoing and self.variant != "batch"
        if example_echo or (not self.echoing and (callable(self.buffer) or self.buffer > 1)):
            examples = _examples(chunks)
            if example_echo:
                examples = echo_examples(examples, self.echo, seed=loader.seed, epoch=epoch, counters=c,
                                         clock=self.clock)
                examples = _number_copies(examples)
            else:
                examples = _count_fresh(examples, c)
            examples = shuffle_buffer(examples, self.buffer, seed=seed)
            batches = batch_examples(examples, self.batch_size, drop_last=loader.drop_last, counters=c)
            if late:
                batches = _augment_batches(batches, pad_crop_seed(loader.seed, epoch))
        else:
            batches = _fresh_batches(chunks, c)
            if self.echoing:
                batches = echo_batches(batches, self.echo, seed=loader.seed, epoch=epoch, counters=c,
                                       clock=self.clock)
                batches = shuffle_buffer(batches, self.buffer, seed=seed)
        batches = to_device(_as_tensors(batches, loader.with_keys, self.with_copies, c), loader.device, depth=2)
        if isinstance(self.echo, AutoEcho):
            # Here, on the training thread: before the pipeline may start on a thread of its own
            # (to_device on CUDA), and the one place that sees the training step's own time.
            self.echo.setup_distributed()
            batches = _reported(batches, self.echo, per_batch=self.variant == "batch")
        return batches


def batch_examples(
    examples: Iterable[tuple], batch_size: int, *, drop_last: bool = False, counters: EchoCounters | None = None,
) -> Iterator[tuple[np.ndarray, ...]]:
    """Group (image HWC, label, key, ...) tuples into (images NHWC, labels, keys, ...) arrays.

    Fields after the image become int64 arrays; ``key`` identifies the example and feeds
    the within-batch duplicate count of ``counters``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1; got {batch_size!r}")
    return _batched(examples, batch_size, drop_last, counters)


def _batched(examples, batch_size, drop_last, counters):
    group = []
    for example in examples:
        group.append(example)
        if len(group) == batch_size:
            yield _collate(group, counters)
            group = []
    if group and not drop_last:
        yield _collate(group, counters)


def _collate(group, counters):
    fields = list(zip(*group))
    if counters is not None:
        counters.record_batch(fields[2])
    return (np.stack(fields[0]), *(np.asarray(f, dtype=np.int64) for f in fields[1:]))


def _examples(chunks: Iterator[DecodedChunk]) -> Iterator[tuple[np.ndarray, int, int, int]]:
    # Each image a view of its batch: the loader's BatchPool does not reuse a batch while
    # a view of it waits in the buffer.
    try:
        for chunk in chunks:
            yield from zip(chunk.images.numpy(), chunk.labels.tolist(), chunk.keys.tolist(), repeat(0))
    finally:
        chunks.close()


def _fresh_batches(chunks: Iterator[DecodedChunk], counters: EchoCounters):
    try:
        for chunk in chunks:
            counters.fresh_examples += len(chunk.keys)
            counters.record_batch(chunk.keys.tolist())
            yield chunk.images.numpy(), chunk.labels, chunk.keys, None
    finally:
        chunks.close()


def _number_copies(examples) -> Iterator[tuple[np.ndarray, int, int, int]]:
    """Number the echoed copies of each example (the echo stage repeats the same object)."""
    previous, copy = None, 0
    for example in examples:
        copy = copy + 1 if example is previous else 0
        previous = example
        yield example[:3] + (copy,)


def _count_fresh(examples, counters: EchoCounters):
    for example in examples:
        counters.fresh_examples += 1
        yield example


def _augment_batches(batches, seed: int):
    for images, labels, keys, copies in batches:
        yield keyed_crop_flip(images, keys, seed=seed, copies=copies), labels, keys, copies


def _as_tensors(batches, with_keys: bool, with_copies: bool, counters: EchoCounters,
                ) -> Iterator[tuple[torch.Tensor, ...]]:
    for images, labels, keys, copies in batches:
        counters.batches_emitted += 1
        # A (B, 3, H, W) view in channels_last memory format: no copy (a contiguous
        # NCHW copy of uint8 costs more than decoding on CPU); convolutions take it as is.
        batch = (torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(labels))
        if with_keys:
            batch += (torch.from_numpy(keys),)
        if with_copies:
            batch += (torch.zeros(len(labels), dtype=torch.int64) if copies is None else torch.from_numpy(copies),)
        yield batch


def _reported(batches, auto: AutoEcho, per_batch: bool):
    """Report each batch to ``auto`` from the consumer's side of the pipeline: the wait
    for it, the consumer's time until it asks for the next (less time in ``auto.paused()``),
    its items (``record_step``). On CUDA the pipeline,
    echo stage included, runs on the pinning thread, whose own time between items is
    pinning and queueing, not the training step (hasten.echo.auto)."""
    it = iter(batches)
    auto.expect_step_reports()  # windows before the first step wait for it (a filling buffer)
    try:
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = time.perf_counter()
            paused = auto.paused_s
            yield batch
            step = time.perf_counter() - t1 - (auto.paused_s - paused)
            items = 1 if per_batch else len(batch[1])
            auto.record_step(t1 - t0, max(step, 0.0), items)
    finally:
        it.close()  # a consumer that stops early stops the pipeline's thread now, not at collection
