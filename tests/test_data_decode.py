"""decode_image: agrees with Pillow, turns every decoder failure into BadImageError."""

import io

import numpy as np
import pytest
from PIL import Image

from hasten.data import decode
from hasten.data.decode import BadImageError, decode_fitted, decode_image, resize_center_crop


def _photo(h=40, w=56, seed=0):
    """A smooth image with some texture: what JPEG is built for."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (h + w)], axis=-1)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


def _encode(array, fmt="JPEG", **kwargs):
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **kwargs)
    return buf.getvalue()


@pytest.mark.parametrize("use_simplejpeg", [True, False])
def test_jpeg_matches_pillow_within_decoder_tolerance(monkeypatch, use_simplejpeg):
    if not use_simplejpeg:
        monkeypatch.setattr(decode, "simplejpeg", None)
    elif decode.simplejpeg is None:
        pytest.skip("simplejpeg not installed")
    data = _encode(_photo(), quality=75)  # Pillow's defaults: q75, 4:2:0, like CIFAR-10-JPEG
    ours = decode_image(data, "photo.jpg")
    pillow = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert ours.shape == pillow.shape == (40, 56, 3) and ours.dtype == np.uint8
    # libjpeg-turbo builds may differ by rounding in the IDCT/upsampling only.
    assert np.abs(ours.astype(int) - pillow.astype(int)).max() <= 2


def test_png_is_lossless_and_converted_to_rgb():
    rgb = _photo(9, 7)
    assert np.array_equal(decode_image(_encode(rgb, "PNG")), rgb)
    gray = rgb[..., 0]
    out = decode_image(_encode(gray, "PNG"))
    assert out.shape == (9, 7, 3) and np.array_equal(out[..., 1], gray)
    rgba = np.concatenate([rgb, np.full((9, 7, 1), 128, np.uint8)], axis=-1)
    assert np.array_equal(decode_image(_encode(rgba, "PNG")), rgb)


@pytest.mark.parametrize("use_simplejpeg", [True, False])
def test_damaged_files_raise_bad_image_error_naming_the_file(monkeypatch, use_simplejpeg):
    if not use_simplejpeg:
        monkeypatch.setattr(decode, "simplejpeg", None)
    jpeg = _encode(_photo(), quality=90)
    png = _encode(_photo(), "PNG")
    cases = {
        "truncated.jpg": jpeg[: len(jpeg) // 2],
        "header-only.jpg": jpeg[:20],
        "garbled.jpg": jpeg[:200] + bytes(len(jpeg) - 200),
        "truncated.png": png[: len(png) // 2],
        "notes.jpg": b"this is a text file",
        "empty.png": b"",
    }
    for name, data in cases.items():
        with pytest.raises(BadImageError, match=name.replace(".", r"\.")):
            decode_image(data, name)


def test_resize_center_crop_takes_the_middle():
    wide = np.zeros((8, 16, 3), np.uint8)
    wide[:, 4:12] = 200  # the centre 8 columns
    out = resize_center_crop(wide, 8)
    assert out.shape == (8, 8, 3) and (out == 200).all()
    big = _photo(20, 30)
    out = decode_image(_encode(big, "PNG"), image_size=10)
    assert out.shape == (10, 10, 3)
    expected = np.asarray(Image.fromarray(big).resize((15, 10), Image.BICUBIC))[:, 2:12]
    assert np.array_equal(out, expected)


@pytest.mark.parametrize("use_simplejpeg", [True, False])
def test_decompression_bombs_are_refused(monkeypatch, use_simplejpeg):
    if not use_simplejpeg:
        monkeypatch.setattr(decode, "simplejpeg", None)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 40x56 = 2240 pixels counts as a bomb now
    with pytest.raises(BadImageError, match="big.jpg.*DecompressionBomb"):
        decode_image(_encode(_photo()), "big.jpg")


def test_fused_downscale_decode_matches_plain_decode():
    rng = np.random.default_rng(1)
    smooth = np.kron(rng.integers(0, 256, (16, 16, 3)), np.ones((16, 16, 1))).astype(np.uint8)  # 256x256
    buf = io.BytesIO()
    Image.fromarray(smooth).save(buf, format="JPEG", quality=95)
    fused = decode_fitted(buf.getvalue(), "big.jpg", 64)
    plain = decode_image(buf.getvalue(), "big.jpg", image_size=64)
    assert fused.shape == plain.shape == (64, 64, 3)
    assert np.abs(fused.astype(int) - plain.astype(int)).mean() < 8

