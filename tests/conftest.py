import os
import signal
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from hasten.decode import backends, turbojpeg

# Tests must be quick and deterministic on 2 shared cores.
torch.set_num_threads(min(2, os.cpu_count() or 1))
os.environ.setdefault("HASTEN_PROGRESS", "0")


def pytest_collection_modifyitems(config, items):
    _files_slowest_first(items)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none is available")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _files_slowest_first(items):
    """The files holding a test marked slow first, then the rest, each group by its number of
    tests, most first (xdist's own order). A file runs whole on one worker (--dist loadfile, in
    this order: --no-loadscope-reorder): a file of a minute handed out last runs on alone after the
    other worker has finished; handed out first, the many short files even the two workers out."""
    tests = Counter(item.path for item in items)
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path not in slow, -tests[item.path]))  # stable: a file stays whole


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path, monkeypatch):
    """Keep caches and run directories of every test inside its tmp_path."""
    monkeypatch.setenv("HASTEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HASTEN_RUNS", str(tmp_path / "runs"))


@pytest.fixture(autouse=True)
def _restored_signal_dispositions():
    """Put SIGINT and SIGTERM back as they were after every test. hasten train leaves SIGTERM
    ignored after a peer failure, rightly for a process on its way out; in a test process it
    would outlive the test, and hasten (which leaves a non-default disposition alone) and
    every subprocess started later (SIG_IGN is inherited) would ignore SIGTERM."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in before.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    """Two classes a small network separates in a few steps: reddish and bluish noise."""
    root = tmp_path_factory.mktemp("colours")
    rng = np.random.default_rng(0)
    for split, n in (("train", 96), ("test", 24)):
        for label, name in enumerate(("red", "blue")):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 120, (16, 16, 3), dtype=np.uint8)
                img[..., 0 if label == 0 else 2] += 120
                Image.fromarray(img).save(root / split / name / f"{i:03d}.png")
    return root


@pytest.fixture
def one_thread():
    """As ``hasten echo --threads 1``: on 2 shared cores a second torch thread slows small steps down."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _photo(rng, h: int, w: int) -> np.ndarray:
    """Photo-like pixels: smooth waves of colour plus mild noise (real JPEG structure)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 60 * np.sin(a * x / 37 + b * y / 29 + 6 * p) + 30 * np.cos((x + y * b) / (11 + 9 * abs(a)))
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


@pytest.fixture(scope="session")
def photo_jpeg():
    """``photo_jpeg(rng, h, w, quality=90) -> bytes``: a photo-like JPEG."""
    import io

    def make(rng, h, w, quality=90):
        buf = io.BytesIO()
        Image.fromarray(_photo(rng, h, w)).save(buf, "JPEG", quality=quality)
        return buf.getvalue()

    return make


def write_image_folder(root, classes, per_class: dict, image_bytes, name="{i:03d}.jpg"):
    """``root/<split>/<class>/<name>`` for each split of ``per_class`` ({"train": n, "test": m}
    images per class), each file ``image_bytes(class, i)``, made in split, class, index order
    (so a seeded generator inside ``image_bytes`` gives the same files every time)."""
    for split, n in per_class.items():
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                (root / split / c / name.format(c=c, i=i)).write_bytes(image_bytes(c, i))
    return root


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory, photo_jpeg):
    """train/ and test/ folders of 3 classes of photo-like JPEGs of varied sizes (18 + 6 per class)."""
    rng = np.random.default_rng(1)

    def photo(c, i):
        h, w = (int(v) for v in rng.integers(90, 200, 2))
        return photo_jpeg(rng, h, w)

    return write_image_folder(tmp_path_factory.mktemp("photos"), ("ant", "bee", "cat"), {"train": 18, "test": 6},
                              photo, name="{c}{i:02d}.jpg")


# The fused crop's JPEG decoders, each forced in turn (hasten picks the first that works).
FUSED_DECODERS = ["pillow", pytest.param("simplejpeg", marks=pytest.mark.skipif(
    backends.simplejpeg is None, reason="simplejpeg is not installed")),
    pytest.param("turbojpeg", marks=pytest.mark.skipif(
        not turbojpeg.available(), reason="no libturbojpeg 3 (pip install turbojpeg)"))]


@pytest.fixture(params=FUSED_DECODERS)
def decoder(request, monkeypatch):
    """The decoder ``hasten.stream.fused_crop`` uses: libturbojpeg's partial decode,
    simplejpeg (libturbojpeg made unavailable) or Pillow (neither)."""
    if request.param != "turbojpeg":  # the partial decoder is preferred whenever it loads
        monkeypatch.setattr(turbojpeg, "_lib", None)
    if request.param == "pillow":
        monkeypatch.setattr(backends, "simplejpeg", None)
    return request.param
