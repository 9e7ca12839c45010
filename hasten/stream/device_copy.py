"""Batches to the device: pinned memory, non-blocking copies, a few batches ahead.

``to_device`` is the last stage of every streaming pipeline (``ShardLoader``, the echo
stage of ``hasten.stream.echo_stage``); ``threaded`` runs an iterator on a thread of its
own, a bounded queue ahead of the consumer, which is where ``to_device`` pins.

Based on: the pinned-memory, non-blocking host-to-device copies of PyTorch's DataLoader
(``pin_memory=True``) and CUDA's asynchronous copies.

Changes the training math: no.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

import torch


def to_device(
    batches: Iterable[tuple[torch.Tensor, ...]], device: torch.device | str, *, depth: int = 2
) -> Iterator[tuple[torch.Tensor, ...]]:
    """Move tuples of CPU tensors to ``device``: pinned memory, non-blocking copies,
    ``depth`` batches in flight ahead of the consumer. On a CPU device, a no-op."""
    device = torch.device(device)
    if device.type == "cpu":
        yield from batches
        return
    for item in threaded(batches, lambda batch: tuple(t.pin_memory() for t in batch), depth=depth):
        yield tuple(t.to(device, non_blocking=True) for t in item)


def threaded(items: Iterable, prepare, *, depth: int = 2) -> Iterator:
    """``prepare(item)`` for each of ``items``, run with the iteration of ``items`` on a
    thread of its own, ``depth`` results ahead of the consumer (``to_device`` pins there)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def pin():
        # Pinning and the copy's setup run off the training thread, overlapping the step.
        try:
            for batch in items:
                item = prepare(batch)
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            q.put(e)

    thread = threading.Thread(target=pin, daemon=True, name="hasten-pin")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
