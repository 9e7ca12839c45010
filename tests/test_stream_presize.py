import io
import json

import numpy as np
import pytest
from PIL import Image

from hasten.decode import backends
from hasten.stream import presize as ps
from hasten.stream.pack import pack
from test_stream_pack import _packed_examples, _source_examples

ENCODERS = ["pillow", pytest.param("simplejpeg", marks=pytest.mark.skipif(
    backends.simplejpeg is None, reason="simplejpeg is not installed"))]


@pytest.fixture(params=ENCODERS)
def encoder(request, monkeypatch):
    if request.param == "pillow":
        monkeypatch.setattr(backends, "simplejpeg", None)
    return request.param


def _size(data):
    with Image.open(io.BytesIO(data)) as img:
        return img.size  # (width, height)


def _pixels(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


@pytest.mark.parametrize("hw", [(375, 500), (500, 375), (300, 300), (257, 256), (1000, 61), (40, 900)])
def test_longer_side_is_bounded_aspect_kept_and_the_picture_is_the_same(photo_jpeg, encoder, hw):
    h, w = hw
    data = photo_jpeg(np.random.default_rng(h * w), h, w)
    out = ps.presize(data, "x.jpg", 256)
    assert out.resized and not out.kept_because
    new_w, new_h = _size(out.data)
    scale = 256 / max(h, w)
    assert max(new_w, new_h) == 256
    assert abs(new_w - w * scale) <= 0.5 and abs(new_h - h * scale) <= 0.5  # aspect kept within a pixel
    # The same picture: against a Lanczos resize of the decoded source only the re-encoding's
    # loss remains (measured 1.7-2.3 levels of 255 on these noisy photos; the same output
    # shifted by one pixel is 3.2-5.7 off, a wrong scale or crop far more).
    ref = np.asarray(Image.fromarray(_pixels(data).astype(np.uint8)).resize((new_w, new_h), Image.LANCZOS))
    assert np.abs(_pixels(out.data) - ref.astype(int)).mean() < 2.8


def test_images_within_the_bound_are_the_same_bytes(photo_jpeg, encoder):
    for h, w in ((256, 200), (100, 256), (32, 32)):
        data = photo_jpeg(np.random.default_rng(0), h, w)
        out = ps.presize(data, "x.jpg", 256)
        assert out.data is data and not out.resized and not out.kept_because


def test_source_chroma_subsampling_is_kept(encoder):
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8))
    for code, name in ((0, "444"), (2, "420")):
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=95, subsampling=code)
        out = ps.presize(buf.getvalue(), "x.jpg", 128)
        from PIL import JpegImagePlugin

        assert JpegImagePlugin.get_sampling(Image.open(io.BytesIO(out.data))) == code, name


def test_unreadable_and_non_jpeg_images_are_kept_with_a_reason(photo_jpeg, encoder):
    big = photo_jpeg(np.random.default_rng(1), 400, 300)
    png = io.BytesIO()
    Image.fromarray(np.zeros((300, 400, 3), np.uint8)).save(png, "PNG")
    cases = {"truncated.jpg": (big[: len(big) // 2], "truncated"),
             "text.jpg": (b"not an image at all", "not a JPEG or PNG"),
             "header.jpg": (b"\xff\xd8\xff" + b"\x00" * 64, "damaged"),
             "big.png": (png.getvalue(), "only JPEGs are re-encoded")}
    for name, (data, why) in cases.items():
        out = ps.presize(data, name, 128)
        assert out.data is data and not out.resized and why in out.kept_because and "\n" not in out.kept_because


@pytest.mark.parametrize("bad", [0, -5, 31, 12.5, "256", True, None])
def test_bad_max_side_is_a_value_error(photo_jpeg, tmp_path, photo_folder, bad):
    with pytest.raises(ValueError, match="max_side"):
        ps.presize(photo_jpeg(np.random.default_rng(0), 64, 64), "x.jpg", bad)
    if bad is not None:
        with pytest.raises(ValueError, match="max_side"):
            pack(photo_folder, tmp_path / "o", max_side=bad)
    with pytest.raises(ValueError, match="quality"):
        pack(photo_folder, tmp_path / "o", max_side=64, quality=0)


def test_pack_with_max_side_keeps_labels_and_order_and_records_it(photo_folder, tmp_path):
    bound = 128  # photo_folder's images are 90..199 px a side: some are resized, some not
    plain = pack(photo_folder, tmp_path / "plain", shard_bytes=60_000, seed=3)
    sized = pack(photo_folder, tmp_path / "sized", shard_bytes=60_000, seed=3, max_side=bound)
    assert plain["max_side"] is None and "presize" not in plain
    assert sized["max_side"] == bound and json.loads((tmp_path / "sized" / "index.json").read_text()) == sized
    resized = bytes_in = bytes_out = 0
    for split in ("train", "test"):
        source, _ = _source_examples(photo_folder, split)
        a, _ = _packed_examples(tmp_path / "plain", split)
        b, _ = _packed_examples(tmp_path / "sized", split)
        assert [label for _, label in a] == [label for _, label in b]  # the same examples in the same order
        assert sized["splits"][split]["examples"] == plain["splits"][split]["examples"] == len(source)
        for (orig, _), (stored, _) in zip(a, b):
            w, h = _size(orig)
            bytes_in, bytes_out = bytes_in + len(orig), bytes_out + len(stored)
            if max(w, h) <= bound:
                assert stored == orig
            else:
                resized += 1
                assert max(_size(stored)) == bound
    assert 0 < resized < sum(sized["splits"][split]["examples"] for split in ("train", "test"))
    info = sized["presize"]
    assert (info["resized"], info["bytes_in"], info["bytes_out"], info["kept"]) == (resized, bytes_in, bytes_out, [])
    assert info["quality"] == ps.DEFAULT_QUALITY and bytes_out < bytes_in
    again = pack(photo_folder, tmp_path / "again", shard_bytes=60_000, seed=3, max_side=bound)
    assert again == sized  # deterministic, re-encoding included
    for s in sized["splits"]["train"]["shards"]:
        assert (tmp_path / "sized" / s["name"]).read_bytes() == (tmp_path / "again" / s["name"]).read_bytes()


def test_pack_counts_a_corrupt_image_and_stores_it_as_it_is(tmp_path, photo_jpeg, caplog):
    root = tmp_path / "src"
    for split in ("train", "test"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(3):
                (root / split / c / f"{i}.jpg").write_bytes(photo_jpeg(np.random.default_rng(i), 200, 150))
    broken = photo_jpeg(np.random.default_rng(9), 300, 400)[:2000]
    (root / "train" / "b" / "broken.jpg").write_bytes(broken)
    index = pack(root, tmp_path / "out", max_side=64)
    assert index["presize"]["resized"] == 12
    (name, reason), = index["presize"]["kept"]
    assert name == "train/b/broken.jpg" and "truncated" in reason
    assert "broken.jpg" in caplog.text and "stored as they are" in caplog.text
    stored, _ = _packed_examples(tmp_path / "out", "train")
    assert broken in [data for data, _ in stored]
    assert sorted(label for _, label in stored) == [0, 0, 0, 1, 1, 1, 1]
