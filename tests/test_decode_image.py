"""decode_image: agrees with Pillow, turns every decoder failure into BadImageError."""

import io
import math

import numpy as np
import pytest
from PIL import Image

from hasten.decode import backends, turbojpeg
from hasten.decode.header import Header, read_header
from hasten.decode.image import Region, decode, decode_fitted, decode_image, fit_scale, resize_center_crop
from hasten.errors import BadImageError


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


# The simplejpeg cases skip, rather than test Pillow twice, where simplejpeg is not installed.
DECODERS = [pytest.param(True, id="simplejpeg", marks=pytest.mark.skipif(
    backends.simplejpeg is None, reason="simplejpeg not installed")), pytest.param(False, id="pillow")]


@pytest.mark.parametrize("use_simplejpeg", DECODERS)
def test_jpeg_matches_pillow_within_decoder_tolerance(monkeypatch, use_simplejpeg):
    if not use_simplejpeg:
        monkeypatch.setattr(backends, "simplejpeg", None)
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


@pytest.mark.parametrize("use_simplejpeg", DECODERS)
def test_damaged_files_raise_bad_image_error_naming_the_file(monkeypatch, use_simplejpeg):
    if not use_simplejpeg:
        monkeypatch.setattr(backends, "simplejpeg", None)
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


@pytest.mark.parametrize("use_simplejpeg", DECODERS)
def test_decompression_bombs_are_refused(monkeypatch, use_simplejpeg):
    if not use_simplejpeg:
        monkeypatch.setattr(backends, "simplejpeg", None)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 40x56 = 2240 pixels counts as a bomb now
    with pytest.raises(BadImageError, match="big.jpg.*DecompressionBomb"):
        decode_image(_encode(_photo()), "big.jpg")


def _textured(n=256, seed=0):
    """Smooth colour regions, a fine sine texture and noise: detail at every scale,
    so a downscale that is not a block average (subsampling, an offset) shows."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (n // 32, n // 32, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(coarse).resize((n, n), Image.BICUBIC)).astype(float)
    x = np.arange(n)
    img += 20 * np.sin(x / 5.0)[None, :, None] + rng.normal(0, 6, (n, n, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _block_average(array, f):
    """The true f-times downscale: the mean of each f x f block, in float."""
    h, w, c = array.shape
    return array.reshape(h // f, f, w // f, f, c).astype(float).mean(axis=(1, 3))


@pytest.mark.parametrize("use_simplejpeg", DECODERS)
@pytest.mark.parametrize("factor", [2, 4, 8])
def test_fitted_decode_is_the_block_average_within_dct_scaling_error(monkeypatch, use_simplejpeg, factor):
    """With simplejpeg the image is decoded at 1/factor scale in the DCT domain; without
    it, fully decoded and resized (Pillow bicubic with antialiasing). Either way the
    result must be the true block average of what the decoder sees (its own full-size
    decode), up to: rounding to uint8 (mean 0.25) and, for the DCT path, libjpeg's
    reduced IDCT, which keeps only the lowest 8/factor frequencies of each 8x8 block
    (exactly the block mean at 1/8; at 1/2 and 1/4 higher frequencies leak in, measured
    at mean 0.5, max 4.3 on this image). Tolerance: mean 1.0, max 8. Pillow's bicubic
    kernel is not a box (4 x factor taps, negative lobes): measured mean 1.09 at
    factor 2, so 1.5 on that path. Subsampling instead of averaging is off by more
    than 3 in the mean here."""
    if not use_simplejpeg:
        monkeypatch.setattr(backends, "simplejpeg", None)
    original = _textured()
    data = _encode(original, quality=95, subsampling=0)  # 4:4:4: no chroma upsampling on top
    size = 256 // factor
    fitted = decode_fitted(data, "big.jpg", size).astype(float)
    assert fitted.shape == (size, size, 3)
    full = decode_image(data, "big.jpg").astype(float)
    error = np.abs(fitted - _block_average(full, factor))
    tolerance = 1.0 if use_simplejpeg else 1.5
    assert error.mean() < tolerance and error.max() <= 8, (error.mean(), error.max())
    # Against the original pixels: JPEG's own error (the full decode, averaged) plus the above.
    jpeg_error = np.abs(_block_average(full, factor) - _block_average(original, factor)).mean()
    assert np.abs(fitted - _block_average(original, factor)).mean() < jpeg_error + tolerance
    # The tolerance rejects plain subsampling, the error a downscale without averaging makes.
    assert np.abs(full[::factor, ::factor] - _block_average(full, factor)).mean() > 3.0


def _before(data, decoder, scale=1, region=None):
    """What hasten decoded before its decoders shared one entry, written out with the
    libraries it called: the region's rows and columns by libturbojpeg, else the whole
    image at 1/scale by simplejpeg (min_height/min_width), else by Pillow (``draft``)."""
    pil = Image.open(io.BytesIO(data))
    w, h = pil.size
    if region is not None and decoder == "turbojpeg" and pil.format == "JPEG":
        top, left, bh, bw = region
        rows, (_, r_left) = turbojpeg.decode_region(data, region, (1, scale))
        return rows[:, left - r_left:left - r_left + bw]
    if pil.format == "JPEG" and decoder != "pillow":
        whole = backends.simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True, min_height=-(-h // scale),
                                                min_width=-(-w // scale)) if scale > 1 else \
            backends.simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    else:
        if scale > 1:
            pil.draft("RGB", (max(1, w // scale), max(1, h // scale)))
        whole = np.asarray(pil.convert("RGB"))
    if region is None:
        return whole
    top, left, bh, bw = region
    return whole[top:top + bh, left:left + bw]


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_the_entry_gives_the_pixels_of_the_decoders_it_replaced(decoder, fmt):
    """Whole, scaled and region decodes through ``decode`` are, pixel for pixel, what the
    same bytes gave before (``_before``), for each decoder in turn; and a region decided
    from the header by a function is the region given directly."""
    for seed, (h, w) in enumerate([(375, 500), (97, 131), (600, 451)]):
        data = _encode(_photo(h, w, seed), fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        header = read_header(data, "x")
        assert (header.format, header.height, header.width) == (fmt.lower(), h, w)
        assert np.array_equal(decode(data, "x"), _before(data, decoder))
        scales = (1, 2, 4, 8) if fmt == "JPEG" else (1,)
        for f in scales:
            sh, sw = header.scaled((1, f))
            if f > 1:
                assert np.array_equal(decode(data, "x", scale=(1, f)), _before(data, decoder, f))
            for region in [(0, 0, sh, sw), (sh // 3, sw // 5, sh // 2, sw // 3), (sh - 3, sw - 5, 3, 5)]:
                ours = decode(data, "x", header=header, scale=(1, f), region=Region(*region))
                assert np.array_equal(ours, _before(data, decoder, f, region)), (seed, f, region)
                by_window = decode(data, "x", region=lambda hd, f=f, region=region: ((1, f), Region(*region)))
                assert np.array_equal(by_window, ours)
        if fmt == "PNG":
            with pytest.raises(ValueError, match="full size only"):
                decode(data, "x.png", scale=(1, 2))


def test_fitted_scale_is_the_smallest_eighth_that_covers_the_size():
    header = read_header(_encode(_photo(375, 500)), "x")
    for size in (32, 47, 48, 100, 141, 142, 224, 375, 400):
        n, d = fit_scale(header, size)
        assert min(header.scaled((n, d))) >= size or (n, d) == (1, 1)
        smaller = [k for k in range(1, 8) if k / 8 < n / d]
        assert all(min(header.scaled((k, 8))) < size for k in smaller)
    assert fit_scale(read_header(_encode(_photo(375, 500), "PNG"), "x"), 32) == (1, 1)  # PNGs do not scale


def test_fitted_scale_holds_for_every_shape_and_size():
    """The closed form against its definition over a grid of sides and sizes, small and
    odd ones included (off-by-one at ceil(side * n / 8) == size is where it would break)."""
    for h in range(1, 300, 7):
        for w in range(1, 300, 11):
            header = Header("jpeg", h, w)
            for size in (1, 2, 7, 8, 9, 16, 31, 32, 33, 64, 127, 224):
                n, d = fit_scale(header, size)
                covers = [k for k in range(1, 8) if min(header.scaled((k, 8))) >= size]
                assert (n, d) == ((covers[0] // math.gcd(covers[0], 8), 8 // math.gcd(covers[0], 8))
                                  if covers else (1, 1)), (h, w, size)


@pytest.mark.parametrize("use_simplejpeg", DECODERS)
def test_fitted_decode_refuses_decompression_bombs_too(monkeypatch, use_simplejpeg):
    if not use_simplejpeg:
        monkeypatch.setattr(backends, "simplejpeg", None)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(BadImageError, match="big.jpg"):
        decode_fitted(_encode(_photo()), "big.jpg", 8)


def test_header_reads_format_size_and_subsampling_and_names_bad_files(monkeypatch):
    for code, name in ((0, "444"), (1, "422"), (2, "420")):
        data = _encode(_photo(), quality=90, subsampling=code)
        seen = {read_header(data, "x").subsampling}
        monkeypatch.setattr(turbojpeg, "_lib", None)
        seen.add(read_header(data, "x").subsampling)
        monkeypatch.setattr(backends, "simplejpeg", None)
        seen.add(read_header(data, "x").subsampling)
        monkeypatch.undo()
        assert seen == {name}
    assert read_header(_encode(_photo(9, 7), "PNG"), "x") == Header("png", 9, 7, "")
    for data, why in ((b"GIF89a" + bytes(20), "not a JPEG or PNG"), (b"\xff\xd8\xff" + bytes(64), "damaged")):
        with pytest.raises(BadImageError, match=f"bad.jpg: {why}"):
            read_header(data, "bad.jpg")
