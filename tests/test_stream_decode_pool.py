"""decode_stream: records decoded in the worker pool, in order, bad files counted by name."""

import io

import numpy as np
import pytest
from PIL import Image

from hasten.errors import DataError
from hasten.stream.decode_pool import decode_records, decode_stream


def _records(n, bad=(), size=8):
    """[(name, png bytes, label)]; the indices in ``bad`` hold broken bytes."""
    out = []
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(np.full((size, size, 3), i, np.uint8)).save(buf, format="PNG")
        out.append((f"img{i}.png", b"\x89PNG\r\n\x1a\n broken" if i in bad else buf.getvalue(), i % 3))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_chunks_come_in_order_with_their_labels_and_keys(workers):
    records = _records(20)
    chunks = [np.arange(i, min(i + 6, 20)) for i in range(0, 20, 6)]
    got = list(decode_stream(records, chunks, workers=workers, prefetch=2))
    keys = np.concatenate([c.keys for c in got])
    assert keys.tolist() == list(range(20))
    assert np.concatenate([c.labels for c in got]).tolist() == [i % 3 for i in range(20)]
    assert all((c.images[j] == k).all() for c in got for j, k in enumerate(c.keys))  # image i is filled with i


def test_augment_runs_on_each_decoded_chunk_with_its_keys():
    seen = []

    def augment(images, keys):
        seen.append(keys.tolist())
        return 255 - images

    (chunk,) = decode_stream(_records(4), [np.array([3, 1])], augment=augment)
    assert seen == [[3, 1]] and (chunk.images[0] == 252).all()


def test_bad_records_are_named_and_counted_against_at_least_100():
    reported = []
    chunks = [np.arange(i, i + 10) for i in range(0, 30, 10)]
    # 1 bad of 30: 1% of 100 counted, so it passes; 2 do not.
    decoded = list(decode_stream(_records(30, bad={4}), chunks, max_bad_fraction=0.01, on_bad=reported.extend))
    assert sum(len(c.keys) for c in decoded) == 29
    assert reported == [("img4.png", reported[0][1])] and not reported[0][1].startswith("img4.png")
    with pytest.raises(DataError, match=r"2 of 20 files .*max_bad_fraction=0.01: img4\.png .*img17\.png"):
        list(decode_stream(_records(30, bad={4, 17}), chunks, max_bad_fraction=0.01))


def test_images_of_different_sizes_need_image_size():
    records = _records(2) + _records(1, size=12)
    with pytest.raises(DataError, match="image_size"):
        decode_records([(i, n, d, lab) for i, (n, d, lab) in enumerate(records)])
    chunk = decode_records([(i, n, d, lab) for i, (n, d, lab) in enumerate(records)], image_size=6)
    assert chunk.images.shape == (3, 6, 6, 3)
