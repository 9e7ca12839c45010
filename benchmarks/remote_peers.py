"""The peers of ``remote_shards.py``: WebDataset and LitData reading the same images, each its own way.

Both decode as their documentation shows a user doing it without torchvision (not a
dependency here): Pillow opens and fully decodes the JPEG, then a random-resized crop
(torchvision's ``RandomResizedCrop`` parameters, ``hasten.stream.fused_crop.random_resized_box``),
a bilinear resize to the output size and a flip, into a uint8 (S, S, 3) tensor; batches
are (B, S, S, 3) uint8 and int64 labels, as hasten's loader gives (a channels_last view).

- WebDataset 1.0.2 reads the same tar shards from the same web server (its ``http://``
  URLs are read by ``curl`` in a pipe, its default), shard-shuffled, a 1000-example
  shuffle buffer, ``torch.utils.data.DataLoader`` workers splitting the shards;
  ``cache_dir`` keeps each shard it downloads, so epoch 2 reads them from the disk.
- LitData 0.2.76 needs its own chunked format: ``convert_litdata`` runs ``litdata.optimize``
  once over the same JPEG bytes (stored as they are, not re-encoded) with 64 MB chunks,
  and the result is served by an S3-API server (moto; LitData reads ``s3://`` but not
  plain HTTP), read by ``StreamingDataset`` + ``StreamingDataLoader`` with a local
  ``cache_dir`` big enough for the whole set (epoch 2 from it).

The benchmark imports these in its reader process only (``pip install --no-deps
webdataset==1.0.2 litdata==0.2.76`` and their small dependencies: pyproject's
``bench-remote`` extra says why not plain pip).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hasten.stream.fused_crop import random_resized_box

from _common import ProcessRng


class PillowCrop:
    """JPEG bytes -> uint8 (S, S, 3) random-resized crop with flip; one generator per process."""

    def __init__(self, size: int):
        self.size, self.rng = size, ProcessRng()

    def __call__(self, data) -> torch.Tensor:
        rng = self.rng()
        img = data if isinstance(data, Image.Image) else Image.open(io.BytesIO(data))
        img = img.convert("RGB")
        b = random_resized_box(img.height, img.width, rng)
        img = img.resize((self.size, self.size), Image.BILINEAR, box=(b.left, b.top, b.left + b.width,
                                                                      b.top + b.height))
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy())


def webdataset_loader(urls: list[str], *, cache_dir: str | None, batch: int, workers: int, size: int, seed: int):
    import webdataset as wds

    crop = PillowCrop(size)
    dataset = (wds.WebDataset(urls, shardshuffle=len(urls), cache_dir=cache_dir, seed=seed, empty_check=False,
                              nodesplitter=wds.split_by_node)
               .shuffle(1000)
               .decode("pil")
               .to_tuple("jpg", "cls")
               .map_tuple(crop, int)
               .batched(batch, partial=True))
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)


def convert_litdata(shard_dir: Path, out: Path) -> Path:
    """The training examples of the packed shards in LitData's format at ``out`` (once)."""
    if (out / "index.json").is_file():
        return out
    import litdata

    from hasten.stream.shard_store import open_shards
    from hasten.stream.tar_members import read_shard

    store = open_shards(shard_dir, "train")
    inputs = list(range(len(store)))

    def examples(i: int):
        for r in read_shard(store[i], store.names[i]):
            if r.reason is None:
                yield {"image": r.data, "label": r.label}  # the JPEG bytes as they are

    litdata.optimize(fn=examples, inputs=inputs, output_dir=str(out), chunk_bytes="64MB", num_workers=1,
                     verbose=False, start_method="fork")
    return out


def litdata_loader(input_dir: str, *, cache_dir: str | None, batch: int, workers: int, size: int, seed: int):
    from litdata import StreamingDataLoader, StreamingDataset

    import litdata.streaming.downloader as downloader

    # The local S3 server speaks plain http; LitData's obstore client options (module-level,
    # inherited by its forked workers) forbid it unless told. A real bucket is https.
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
    crop = PillowCrop(size)

    class Cropped(StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return crop(item["image"]), int(item["label"])

    remote = "://" in input_dir
    dataset = Cropped(input_dir, cache_dir=cache_dir if remote else None, shuffle=True, seed=seed,
                      max_cache_size="100GB" if remote else None)
    return StreamingDataLoader(dataset, batch_size=batch, num_workers=workers)
