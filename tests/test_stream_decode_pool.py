"""decode_records: records decoded into one chunk in order, bad files listed by name."""

import io

import numpy as np
import pytest
from PIL import Image

from hasten.errors import DataError
from hasten.stream.decode_pool import decode_records, read_records


def _records(n, bad=(), size=8):
    """[(name, png bytes, label)]; the indices in ``bad`` hold broken bytes."""
    out = []
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(np.full((size, size, 3), i, np.uint8)).save(buf, format="PNG")
        out.append((f"img{i}.png", b"\x89PNG\r\n\x1a\n broken" if i in bad else buf.getvalue(), i % 3))
    return out


def test_records_come_in_order_with_their_labels_and_keys_and_bad_ones_are_named():
    records = _records(12, bad={4})
    chunk = decode_records(read_records(records, np.array([7, 4, 0, 11])))
    assert chunk.keys.tolist() == [7, 0, 11] and chunk.labels.tolist() == [1, 0, 2]
    assert all((chunk.images[j] == k).all() for j, k in enumerate(chunk.keys))  # image i is filled with i
    assert [name for name, _ in chunk.bad] == ["img4.png"] and not chunk.bad[0][1].startswith("img4.png")


def test_images_of_different_sizes_need_image_size():
    records = _records(2) + _records(1, size=12)
    with pytest.raises(DataError, match="image_size"):
        decode_records([(i, n, d, lab) for i, (n, d, lab) in enumerate(records)])
    chunk = decode_records([(i, n, d, lab) for i, (n, d, lab) in enumerate(records)], image_size=6)
    assert chunk.images.shape == (3, 6, 6, 3)
