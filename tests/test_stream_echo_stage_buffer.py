"""EchoStage's default shuffle buffer after echoing: sized from e and the batch,
following AutoEcho's e, and a warning for a buffer too small for a fixed e."""

import io
import warnings

import numpy as np
import pytest
from conftest import write_image_folder
from PIL import Image

from hasten.echo import default_shuffle_buffer
from hasten.echo.auto import AutoEcho
from hasten.stream.echo_stage import EchoStage
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.sources import open_source


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """120 random 8x8 JPEGs in train/<class>/ (and 3 in test/<class>/, which the layout needs)."""
    rng = np.random.default_rng(0)

    def jpeg(c, i):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, format="JPEG")
        return buf.getvalue()

    return open_source(write_image_folder(tmp_path_factory.mktemp("images"), ("a", "b", "c"),
                                          {"train": 40, "test": 1}, jpeg))


def stage(store, batch_size, echo=1, *, crop="pad-crop", **kwargs):
    return EchoStage(ShardLoader(store, batch_size=batch_size, image_size=8, crop=crop), echo, **kwargs)


def test_default_buffer_is_sized_from_e_and_batch(store):
    assert stage(store, 8).buffer == 0  # no echoing: nothing to mix
    assert stage(store, 8, 4).buffer == default_shuffle_buffer(4, 8)
    assert stage(store, 32, 4).buffer == default_shuffle_buffer(4, 32)
    assert stage(store, 8, 3, variant="batch").buffer == 0


def test_default_buffer_follows_autoecho(store):
    auto = AutoEcho(e_max=8)
    s = stage(store, 8, auto)
    assert s.buffer() == 0  # e = 1 at the start: no fresh example is held back
    auto.factor = 5.0
    assert s.buffer() == default_shuffle_buffer(5.0, 8)


def test_default_buffer_keeps_copies_apart(store):
    rates = {}
    for name, size in (("none", 0), ("default", None)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # buffer 0 warns, deliberately
            s = stage(store, 8, 4, shuffle_buffer=size, crop="whole")
        list(s)
        rates[name] = s.counters.duplicate_rate
    # Without mixing, the 4 copies of an example sit next to each other: 3/4 of a batch
    # repeats. The default buffer holds the whole (small) epoch, so copies are spread as
    # in a full shuffle: (e - 1)(B - 1)/(N e - 1) ~ 3*7/479 ~ 4% expected.
    assert rates["none"] == pytest.approx(0.75)
    assert rates["default"] < 0.08


def test_small_buffer_for_fixed_e_warns(store):
    with pytest.warns(UserWarning, match="repeated copies"):
        stage(store, 8, 4, shuffle_buffer=16)
