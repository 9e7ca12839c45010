"""Decoding chunks of shard records in worker processes: decode + crop into batches.

``pack_chunk`` copies a chunk's image bytes once into a reused shared-memory buffer
(``PackedChunk``: the worker receives a file descriptor, not the bytes through a pipe);
``decode_chunk`` decodes each record as its ``crop`` says, in a worker of
``hasten.data.workers.ordered_map``, writing the crops into the chunk's reused batch
(``DecodedChunk``). The crops (``CROPS``):

- ``random-resized``: fused decode + random-resized crop + flip (``hasten.stream.fused_crop``),
  the ImageNet training augmentation;
- ``center``: the fused centre crop, for evaluation;
- ``pad-crop``: the whole image resized to the size (shorter side, then the centre square;
  ``hasten.decode.image.decode_fitted``), then a random crop of it reflect-padded by 4 and a
  flip (``hasten.data.host_augment.keyed_crop_flip``): the CIFAR augmentation, for small images;
- ``whole``: the whole image resized, no augmentation (small images' evaluation, and the
  decode before an example-before echo stage, which then augments each copy itself).

Every random choice is keyed by (seed, epoch, example): a crop does not depend on the
worker that made it, on the chunk it was in, or on a resume. Records that
``hasten.stream.tar_members.scan_shard`` left in their shard file are read here, where
they are decoded. ``default_image_size`` picks the
training size from the images when none is given.

Bad input: an undecodable image, or one whose bytes cannot be read, is listed in
``DecodedChunk.bad`` by name with its reason, never raised: the loader counts it.

Changes the training math: no (the crops are the usual augmentations, keyed per example).
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass, field

import numpy as np
import torch

from hasten.data.bad_files import bad_reason
from hasten.data.host_augment import keyed_crop_flip
from hasten.decode.header import read_header
from hasten.decode.image import decode_fitted
from hasten.errors import BadImageError
from hasten.stream.fused_crop import ExampleRngs, fused_crop
from hasten.stream.shared_buffers import BatchPool, BufferPool, shared_uint8
from hasten.stream.tar_members import Record, read_shard, with_bytes


CROPS = ("random-resized", "center", "pad-crop", "whole")
# Each crop without its augmentation: what an example-before echo stage decodes before it.
UNAUGMENTED = {"center": "center", "pad-crop": "whole", "whole": "whole"}


def check_crop(crop: str) -> str:
    if crop not in CROPS:
        raise ValueError(f"unknown crop {crop!r}; accepted: {', '.join(CROPS)}")
    return crop


def pad_crop_seed(seed: int, epoch: int) -> int:
    """The seed of ``keyed_crop_flip`` for the ``pad-crop`` of ``epoch``: one function for the
    decode workers and for an echo stage that augments after them, so that echoing with e = 1
    trains on exactly the crops of no echoing."""
    return seed * 1_000_003 + epoch


@dataclass
class DecodedChunk:
    images: torch.Tensor | None  # (k, S, S, 3) uint8; None: written into the chunk's BatchPool buffer
    labels: np.ndarray  # int64 (k,)
    keys: np.ndarray  # int64 (k,) global example numbers
    places: np.ndarray  # int64 (k,) place in the rank's order
    end: int  # place after the chunk's last record (good or bad)
    bad: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class PackedChunk:
    """A chunk on its way to a decode worker: the records without their bytes, and the
    bytes of all of them in one shared-memory buffer (record i is ``buffer[ends[i-1]:ends[i]]``).
    The worker receives a file descriptor instead of about 100 KB per image written
    through a pipe and unpickled, which cost the loading process more CPU than anything
    else it did."""
    buffer: torch.Tensor  # uint8, in shared memory
    ends: np.ndarray  # int64 (k,)
    records: list[tuple[int, Record]]  # (place, Record with data=None)
    out: torch.Tensor | None = None  # a BatchPool buffer (shared) for the crops, or None: a new one

    def __len__(self) -> int:
        return len(self.records)

    def unpacked(self) -> list[tuple[int, Record]]:
        view, start, out = self.buffer.numpy(), 0, []
        for (place, r), end in zip(self.records, self.ends.tolist()):
            if r.where is not None or r.reason is not None:
                out.append((place, with_bytes(r)))  # the worker reads the image itself
            else:
                out.append((place, Record(r.key, r.name, view[start:end].tobytes(), r.label)))
            start = end
        return out


def pack_chunk(chunk: list[tuple[int, Record]], pool: BufferPool | None = None,
               batches: BatchPool | None = None) -> PackedChunk:
    """``chunk``'s bytes copied once into a shared-memory buffer (see ``PackedChunk``)."""
    ends = np.cumsum([len(r.data) if r.reason is None and r.data is not None else 0 for _, r in chunk],
                     dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    buffer = pool.take(total) if pool is not None else shared_uint8((max(1, total),))
    view, start = buffer.numpy(), 0
    for (_, r), end in zip(chunk, ends.tolist()):
        if end > start:
            view[start:end] = np.frombuffer(r.data, np.uint8)
        start = end
    return PackedChunk(buffer, ends, [(place, Record(r.key, r.name, None, r.label, r.reason, r.where))
                                      for place, r in chunk], batches.take() if batches is not None else None)


def decode_chunk(chunk: list[tuple[int, Record]] | PackedChunk, *, image_size: int, seed: int, epoch: int,
                 crop: str, antialias: bool = False) -> DecodedChunk:
    """Decode + ``crop`` (``CROPS``) of a list of (place, Record); bad ones are listed, not raised."""
    if mp.parent_process() is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)  # one thread per worker process, as in DataLoader workers
    out = chunk.out if isinstance(chunk, PackedChunk) else None
    chunk = chunk.unpacked() if isinstance(chunk, PackedChunk) else [(place, with_bytes(r)) for place, r in chunk]
    labels, keys, places, bad = [], [], [], []
    shape = (len(chunk), image_size, image_size, 3)
    if out is not None and (out.shape[0] < len(chunk) or tuple(out.shape[1:]) != shape[1:]):
        out = None  # (not this chunk's size: a new batch)
    # In a worker, in shared memory from the start: the chunk then travels to the consumer as
    # a file descriptor (torch's pickling of shared tensors), not as bytes through a pipe; or
    # into the loading process's reused buffer, which does not travel back at all.
    if out is not None:
        stacked = out[:len(chunk)]
    elif mp.parent_process() is not None:
        stacked = shared_uint8(shape)
    else:
        stacked = torch.empty(shape, dtype=torch.uint8)
    view = stacked.numpy()
    rngs = ExampleRngs()  # example_rng's streams, without making a generator per example
    for place, r in chunk:
        if r.reason is not None:
            bad.append((r.name, r.reason))
            continue
        try:
            if crop in ("random-resized", "center"):
                rng = rngs(seed, epoch, r.key) if crop == "random-resized" else None
                # Each crop is written straight into its slot of the chunk (no second copy).
                fused_crop(r.data, r.name, image_size, rng=rng, out=view[len(keys)], antialias=antialias)
            else:
                view[len(keys)] = _whole(r.data, r.name, image_size)
        except BadImageError as e:
            bad.append((r.name, bad_reason(e, r.name)))
            continue
        labels.append(r.label)
        keys.append(r.key)
        places.append(place)
    if crop == "pad-crop" and keys:
        good = view[:len(keys)]
        good[...] = keyed_crop_flip(good, np.asarray(keys, np.int64), seed=pad_crop_seed(seed, epoch))
    return DecodedChunk(stacked[:len(keys)] if out is None else None, np.asarray(labels, np.int64),
                        np.asarray(keys, np.int64), np.asarray(places, np.int64), chunk[-1][0] + 1 if chunk else 0,
                        bad)


def _whole(data: bytes, name: str, size: int) -> np.ndarray:
    array = decode_fitted(data, name, size)
    if array.shape != (size, size, 3):  # (decode_fitted resizes whatever is not size x size)
        raise BadImageError(f"{name}: decoded to {array.shape}, not {size}x{size}x3")
    return array


def default_image_size(store, *, largest: int = 224, samples: int = 64) -> int:
    """The training size when none is given: ``largest`` (ImageNet's 224), or the
    shorter side of the images when even the biggest of the first ``samples``
    examples (first shard, from the image headers) is smaller. Small images
    (CIFAR-10's 32 px) then train at their own size instead of being upsampled
    to 224 px: 49x the pixels for the model, the resize and the normalisation, and no
    more information."""
    if not len(store):
        return largest
    direct = getattr(type(store), "shard_records", None)  # (a folder: its files, not a tar built of them)
    records = direct(store, 0) if direct is not None else read_shard(store[0], store.names[0])
    sides = []
    for r in records[:samples]:
        if r.reason is None:
            try:
                header = read_header(r.data, r.name)
                sides.append(min(header.height, header.width))
            except BadImageError:
                continue  # counted where it is decoded
    return min(largest, max(sides)) if sides else largest
