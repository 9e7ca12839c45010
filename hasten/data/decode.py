"""Decode one JPEG or PNG file to an RGB uint8 array, or raise ``BadImageError``.

JPEGs go through simplejpeg (libjpeg-turbo, about 2x faster than Pillow on small
images) when it is installed, else Pillow; PNGs through Pillow. Both use the
accurate integer DCT and fancy upsampling, so their pixels agree with Pillow's
within JPEG decoder tolerance. Every exception a decoder can raise is turned
into a ``BadImageError`` naming the file, so a damaged file costs one counted
skip, never a traceback from inside a decoder. Truncated JPEGs are refused
(simplejpeg ``strict=True``; Pillow's default of not loading truncated images)
rather than silently padded with grey.
"""

from __future__ import annotations

import io
import warnings

import numpy as np

from hasten.errors import DataError

try:
    import simplejpeg
except ImportError:  # optional: `pip install hasten[fast]`
    simplejpeg = None

JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class BadImageError(DataError):
    """A file that is not a readable JPEG or PNG image."""


def image_format(data: bytes) -> str | None:
    """"jpeg", "png" or None, from the file's magic bytes (not its name)."""
    if data.startswith(JPEG_MAGIC):
        return "jpeg"
    if data.startswith(PNG_MAGIC):
        return "png"
    return None


def decode_image(data: bytes, name: str = "<bytes>", image_size: int | None = None) -> np.ndarray:
    """Decode ``data`` to an (H, W, 3) uint8 RGB array.

    With ``image_size=S`` the shorter side is resized to S (Pillow bicubic with
    antialiasing) and the centre SxS is cropped; an image that is already SxS is
    returned untouched.
    """
    fmt = image_format(data)
    if fmt is None:
        raise BadImageError(f"{name}: not a JPEG or PNG file")
    array = None
    if fmt == "jpeg" and simplejpeg is not None:
        try:
            h, w, _, _ = simplejpeg.decode_jpeg_header(data)
            if h * w <= max_pixels():  # larger ones go to Pillow, which refuses them by name
                array = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
        except Exception:  # noqa: BLE001 - retry with Pillow, which reports the reason
            array = None
    if array is None:
        array = _decode_pillow(data, name)
    if image_size is not None and array.shape[:2] != (image_size, image_size):
        array = resize_center_crop(array, image_size, name)
    return array


def max_pixels() -> int:
    """Pillow's decompression-bomb limit, applied to both decoders."""
    from PIL import Image

    return Image.MAX_IMAGE_PIXELS or 2**62


def _decode_pillow(data: bytes, name: str) -> np.ndarray:
    from PIL import Image

    try:
        with warnings.catch_warnings():
            # Pillow warns (then errors) on decompression bombs; a warning is a refusal here.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
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


def resize_center_crop(array: np.ndarray, size: int, name: str = "<bytes>") -> np.ndarray:
    """Resize the shorter side of an (H, W, 3) uint8 image to ``size``, then crop
    the centre ``size`` x ``size`` (the usual evaluation transform)."""
    from PIL import Image

    h, w = array.shape[:2]
    scale = size / min(h, w)
    new_h, new_w = max(size, round(h * scale)), max(size, round(w * scale))
    try:
        img = Image.fromarray(array).resize((new_w, new_h), Image.BICUBIC)
    except Exception as e:  # noqa: BLE001
        raise BadImageError(f"{name}: cannot resize: {type(e).__name__}: {e}") from None
    top, left = (new_h - size) // 2, (new_w - size) // 2
    return np.asarray(img, dtype=np.uint8)[top : top + size, left : left + size]
