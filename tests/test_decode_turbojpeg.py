import io

import numpy as np
import pytest
from PIL import Image

from hasten.decode import turbojpeg as tj
from hasten.errors import BadImageError
from hasten.stream import fused_crop as fc

needs_lib = pytest.mark.skipif(not tj.available(), reason="no libturbojpeg 3 (pip install turbojpeg)")


def _jpeg(h=375, w=500, subsampling="4:2:0", seed=0, mode="RGB"):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) % 256], axis=-1).astype(np.float64)
    img = np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    picture = Image.fromarray(img)
    if mode == "CMYK":
        picture = picture.convert("CMYK")
        picture.save(buf, "JPEG", quality=90)
    else:
        picture.save(buf, "JPEG", quality=90, subsampling=subsampling)
    return buf.getvalue()


@needs_lib
@pytest.mark.parametrize("subsampling", ["4:4:4", "4:2:0", "4:2:2"])
@pytest.mark.parametrize("scale", [(1, 1), (1, 2), (1, 4), (1, 8)])
def test_region_is_the_full_decode_cut_to_the_box(subsampling, scale):
    data = _jpeg(subsampling=subsampling)
    full, origin = tj.decode_region(data, None, scale)
    assert origin == (0, 0) and full.shape[:2] == (tj.scaled(375, *scale), tj.scaled(500, *scale))
    h, w = full.shape[:2]
    for top, left, bh, bw in [(0, 0, h, w), (h // 3, w // 5, h // 2, w // 3), (h - 7, w - 9, 7, 9), (5, 17, 1, 1)]:
        region, (r_top, r_left) = tj.decode_region(data, (top, left, bh, bw), scale)
        # The region starts on an iMCU boundary at or left of the box and covers it.
        assert r_top == top and r_left <= left and left - r_left < 32
        assert region.shape[0] == bh and region.shape[1] == left + bw - r_left
        # The box holds the very pixels of the full decode, edges included: decoded alone, a
        # region's first and last rows and columns are upsampled without their neighbours (a
        # few levels off); decode_region decodes a margin around the box (tj.EDGE).
        assert np.array_equal(region[:, left - r_left:], full[top:top + bh, left:left + bw]), (top, left, bh, bw)
    rng = np.random.default_rng(len(subsampling) + scale[1])
    for _ in range(40):
        bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        top, left = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        region, (_, r_left) = tj.decode_region(data, (top, left, bh, bw), scale)
        assert np.array_equal(region[:, left - r_left:], full[top:top + bh, left:left + bw]), (top, left, bh, bw)


@needs_lib
def test_full_decode_matches_pillow():
    data = _jpeg(subsampling="4:4:4")
    ours, _ = tj.decode_region(data)
    theirs = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    assert np.abs(ours.astype(int) - theirs).mean() < 0.5


@needs_lib
def test_header_and_bad_inputs_are_named_bad_images():
    data = _jpeg()
    h = tj.read_header(data, "a.jpg")
    assert (h.height, h.width, h.subsampling) == (375, 500, 2)
    for bad in (b"hello world" * 20, data[:2] + b"\0" * 200, data[:len(data) // 3]):
        with pytest.raises(BadImageError, match="bad.jpg"):
            tj.decode_region(bad, name="bad.jpg")
    with pytest.raises(ValueError, match="outside"):
        tj.decode_region(data, (300, 0, 100, 10))
    with pytest.raises(ValueError, match="scaling factor"):
        tj.decode_region(data, None, (3, 7))


@needs_lib
def test_cmyk_is_refused_here_and_decoded_by_the_fallback():
    data = _jpeg(mode="CMYK")
    with pytest.raises(BadImageError, match="CMYK"):
        tj.decode_region(data, name="c.jpg")
    out = fc.fused_crop(data, "c.jpg", 64, rng=fc.example_rng(0, 0, 1))
    assert out.shape == (64, 64, 3) and out.std() > 5


@needs_lib
def test_corrupt_image_through_fused_crop_is_one_bad_image_error():
    data = _jpeg()
    with pytest.raises(BadImageError, match="cut.jpg"):
        fc.fused_crop(data[:len(data) // 2], "cut.jpg", 64, rng=fc.example_rng(0, 0, 1))


def test_library_lookup(monkeypatch, tmp_path):
    assert tj._is_library("turbojpeg.libs/libturbojpeg-dd00d054.so.0.3.0")
    assert tj._is_library("turbojpeg.libs/turbojpeg-1a2b.dll") and tj._is_library("libturbojpeg.0.dylib")
    assert not tj._is_library("turbojpeg.cpython-311-x86_64-linux-gnu.so")
    assert not tj._is_library("turbojpeg.cp311-win_amd64.pyd") and not tj._is_library("turbojpeg.py")
    # No loadable candidate: not available, and hasten decodes in full instead.
    monkeypatch.setattr(tj, "_candidates", lambda: [str(tmp_path / "missing.so")])
    monkeypatch.setattr(tj, "_lib", False)
    assert not tj.available() and tj.library_path() is None
    out = fc.fused_crop(_jpeg(), "x.jpg", 48, rng=fc.example_rng(0, 0, 2))
    assert out.shape == (48, 48, 3)


@needs_lib
def test_env_variable_names_the_library_first(monkeypatch):
    path = tj.library_path()
    monkeypatch.setenv(tj.ENV, path)
    assert tj._candidates()[0] == path


@needs_lib
def test_a_valid_file_decodes_after_a_corrupt_one():
    """A failed decode leaves state in a TurboJPEG handle: without a fresh one, every later
    (valid) file of that worker failed with "Premature end of JPEG file"."""
    data = _jpeg()
    with pytest.raises(BadImageError):
        tj.decode_region(data[:len(data) // 3], name="cut.jpg")
    ours, _ = tj.decode_region(data)
    assert ours.shape == (375, 500, 3)
    assert tj.read_header(data).width == 500
