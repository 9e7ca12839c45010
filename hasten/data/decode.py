"""Decode one JPEG or PNG file to an RGB uint8 array, or raise ``BadImageError``.

JPEGs go through simplejpeg (libjpeg-turbo, about 2x faster than Pillow on small
images) when it is installed, else Pillow; PNGs through Pillow. Both use the
accurate integer DCT and fancy upsampling, so their pixels agree with Pillow's
within JPEG decoder tolerance. Every exception a decoder can raise is turned
into a ``BadImageError`` naming the file, so a damaged file costs one counted
skip, never a traceback from inside a decoder. Truncated JPEGs are refused
(simplejpeg ``strict=True``; Pillow's default of not loading truncated images)
rather than silently padded with grey. ``decode_fitted`` decodes a large JPEG at
a reduced DCT scale that still covers the target size before resizing (decode
and downscale fused, as TF's ``decode_and_crop_jpeg`` does for ImageNet): the
streaming pipeline's decoder, since it decodes every epoch.

Bad input policy, one for every reader: a bad file is skipped and listed by
name with its reason, until more than ``max_bad_fraction`` of the files were
bad; then ``check_bad_fraction`` stops the read with one ``DataError`` naming them.
"""

from __future__ import annotations

import io
import warnings

import numpy as np

from hasten.errors import DataError

try:
    import simplejpeg
except ImportError:  # a default dependency; Pillow decodes where no simplejpeg wheel exists
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


def decode_fitted(data: bytes, name: str, image_size: int | None) -> np.ndarray:
    """``decode_image``, but a JPEG larger than ``image_size`` is decoded at the
    smallest DCT scale (1/2, 1/4, 1/8) that still covers it: fewer pixels to decode
    and to resize. Pixels differ from ``decode_image``'s within resampling tolerance."""
    if image_size is not None and simplejpeg is not None and image_format(data) == "jpeg":
        try:
            array = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=image_size, min_width=image_size)
        except Exception:  # noqa: BLE001 - decode_image retries with Pillow and names the reason
            array = None
        if array is not None:
            if array.shape[:2] == (image_size, image_size):
                return array
            return resize_center_crop(array, image_size, name)
    return decode_image(data, name, image_size=image_size)


def bad_reason(error: BadImageError, name: str) -> str:
    """The reason in a ``BadImageError`` about ``name``, without the name."""
    return str(error).removeprefix(f"{name}: ")


def describe_skipped(skipped: list[tuple[str, str]], show: int = 10) -> str:
    """"name (reason); name (reason); and N more" for the first ``show`` bad files."""
    shown = "; ".join(f"{n} ({r})" for n, r in skipped[:show])
    return shown + (f"; and {len(skipped) - show} more" if len(skipped) > show else "")


def check_bad_fraction(skipped: list[tuple[str, str]], total: int, max_bad_fraction: float, source: str = "", *,
                       min_total: int = 0) -> None:
    """Raise a ``DataError`` naming the bad files once they are more than
    ``max_bad_fraction`` of ``total`` files. ``min_total``: count at least this
    many, so that a stream does not stop on one bad file among its first few."""
    if len(skipped) > max_bad_fraction * max(total, min_total):
        where = f"{source}: " if source else ""
        raise DataError(f"{where}{len(skipped)} of {total} files ({len(skipped) / max(total, 1):.1%}) are not "
                        f"readable images, more than max_bad_fraction={max_bad_fraction:g}: "
                        f"{describe_skipped(skipped)}")


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
