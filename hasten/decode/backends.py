"""The whole-image decoders behind ``hasten.decode.image.decode``: simplejpeg, then Pillow.

simplejpeg (libjpeg-turbo in a wheel, about 2x faster than Pillow on small JPEGs) is a
default dependency; where it has no wheel it is None here and Pillow decodes every JPEG.
Both decode with the accurate integer DCT and fancy upsampling, so their pixels agree
within JPEG decoder tolerance, and both decode a JPEG at a reduced DCT scale (libjpeg's
scaled IDCT): simplejpeg at the smallest n/8 whose output is at least a given size,
Pillow at 1/2, 1/4 or 1/8 (``Image.draft``). Pillow also decodes PNGs, reads any header
the JPEG libraries cannot, and is the one that says why a file is bad: every exception
it raises becomes a ``BadImageError`` naming the file, and truncated files are refused
(Pillow's default), not padded with grey.

Changes the training math: no (a decoder; the DCT scale is the caller's choice).
"""

from __future__ import annotations

import io
import warnings

import numpy as np

from hasten.errors import BadImageError

try:
    import simplejpeg
except ImportError:  # a default dependency; Pillow decodes where no simplejpeg wheel exists
    simplejpeg = None

# Pillow's codes of JpegImagePlugin.get_sampling, as simplejpeg and hasten.decode.header name them.
_PILLOW_SAMPLING = {0: "444", 1: "422", 2: "420"}


def max_pixels() -> int:
    """Pillow's decompression-bomb limit, applied to every decoder."""
    from PIL import Image

    return Image.MAX_IMAGE_PIXELS or 2**62


def simplejpeg_header(data: bytes) -> tuple[int, int, str]:
    """(height, width, subsampling) from simplejpeg; it raises whatever simplejpeg raises."""
    h, w, _, subsampling = simplejpeg.decode_jpeg_header(data)
    return int(h), int(w), str(subsampling).lower()


def decode_simplejpeg(data: bytes, min_hw: tuple[int, int] | None = None) -> np.ndarray:
    """A JPEG at the smallest n/8 scale whose output is at least ``min_hw`` (None: full
    size); corrupt data raises (``strict``), for Pillow to name the reason."""
    min_h, min_w = min_hw or (0, 0)  # (0: no minimum; the full size could pick 7/8 for a 7-pixel image)
    return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True, min_height=min_h, min_width=min_w)


def pillow_header(data: bytes, name: str) -> tuple[int, int, str]:
    """(height, width, subsampling: "444", "422", "420" or "" when not a JPEG or other),
    reading the header only; ``BadImageError`` naming the file if Pillow cannot."""
    from PIL import Image, JpegImagePlugin

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                w, h = img.size
                sampling = JpegImagePlugin.get_sampling(img) if img.format == "JPEG" else -1
    except Image.UnidentifiedImageError:
        raise BadImageError(f"{name}: damaged image data (Pillow cannot identify it)") from None
    except Exception as e:  # noqa: BLE001 - any header failure is a bad file
        raise BadImageError(f"{name}: cannot read the image header: {type(e).__name__}: {e}") from None
    return h, w, _PILLOW_SAMPLING.get(sampling, "")


def decode_pillow(data: bytes, name: str, draft_wh: tuple[int, int] | None = None) -> np.ndarray:
    """Decode with Pillow to (H, W, 3) uint8 RGB. ``draft_wh``: a JPEG at the largest of
    1/2, 1/4, 1/8 whose output is still at least this (width, height)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            # Pillow warns (then errors) on decompression bombs; a warning is a refusal here.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                if draft_wh is not None:
                    img.draft("RGB", draft_wh)
                img.load()
                rgb = img.convert("RGB")
        array = np.asarray(rgb, dtype=np.uint8)
    except Image.UnidentifiedImageError:
        raise BadImageError(f"{name}: damaged image data (Pillow cannot identify it)") from None
    except Exception as e:  # noqa: BLE001 - any decoder failure is a bad file, by design
        raise BadImageError(f"{name}: {type(e).__name__}: {e}") from None
    if array.ndim != 3 or array.shape[2] != 3 or 0 in array.shape:
        raise BadImageError(f"{name}: decoded to an unusable shape {array.shape}")
    return array
