"""StreamLoader's default shuffle buffer after echoing: sized from e and the batch,
following AutoEcho's e, and a warning for a buffer too small for a fixed e."""

import io
import warnings

import numpy as np
import pytest
from conftest import write_image_folder
from PIL import Image

from hasten.echo import default_shuffle_buffer
from hasten.echo.auto import AutoEcho
from hasten.stream.loader import StreamLoader
from hasten.stream.records import open_records


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """120 random 8x8 JPEGs in train/<class>/ (and 3 in test/<class>/, which the layout needs)."""
    rng = np.random.default_rng(0)

    def jpeg(c, i):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, format="JPEG")
        return buf.getvalue()

    return open_records(write_image_folder(tmp_path_factory.mktemp("images"), ("a", "b", "c"),
                                           {"train": 40, "test": 1}, jpeg))


def test_default_buffer_is_sized_from_e_and_batch(records):
    assert StreamLoader(records, batch_size=8).buffer == 0  # no echoing: nothing to mix
    assert StreamLoader(records, batch_size=8, echo=4).buffer == default_shuffle_buffer(4, 8)
    assert StreamLoader(records, batch_size=32, echo=4).buffer == default_shuffle_buffer(4, 32)
    assert StreamLoader(records, batch_size=8, echo=3, variant="batch").buffer == 0


def test_default_buffer_follows_autoecho(records):
    auto = AutoEcho(e_max=8)
    loader = StreamLoader(records, batch_size=8, echo=auto)
    assert loader.buffer() == 0  # e = 1 at the start: no fresh example is held back
    auto.factor = 5.0
    assert loader.buffer() == default_shuffle_buffer(5.0, 8)


def test_default_buffer_keeps_copies_apart(records):
    rates = {}
    for name, size in (("none", 0), ("default", None)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # buffer 0 warns, deliberately
            loader = StreamLoader(records, batch_size=8, echo=4, shuffle_buffer=size, augment=False)
        list(loader)
        rates[name] = loader.counters.duplicate_rate
    # Without mixing, the 4 copies of an example sit next to each other: 3/4 of a batch
    # repeats. The default buffer holds the whole (small) epoch, so copies are spread as
    # in a full shuffle: (e - 1)(B - 1)/(N e - 1) ~ 3*7/479 ~ 4% expected.
    assert rates["none"] == pytest.approx(0.75)
    assert rates["default"] < 0.08


def test_small_buffer_for_fixed_e_warns(records):
    with pytest.warns(UserWarning, match="repeated copies"):
        StreamLoader(records, batch_size=8, echo=4, shuffle_buffer=16)
