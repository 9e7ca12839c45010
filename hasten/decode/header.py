"""An image's header, read once: its format, size and chroma subsampling.

The format comes from the file's magic bytes (not its name); the rest from the first
reader that can: libjpeg-turbo 3 (``hasten.decode.turbojpeg``) or simplejpeg for a JPEG,
and otherwise Pillow, which also says why a file is bad (``BadImageError`` naming it).
A caller that picks a crop box or a DCT scale from the size hands the ``Header`` on to
``hasten.decode.image.decode``, which then reads nothing again to choose its decoder.

Changes the training math: no.
"""

from __future__ import annotations

from dataclasses import dataclass

from hasten.decode import backends, turbojpeg
from hasten.errors import BadImageError

JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# TurboJPEG's TJSAMP_* codes, as simplejpeg names them.
_TJSAMP = ("444", "422", "420", "gray", "440", "411", "441")


def image_format(data: bytes) -> str | None:
    """"jpeg", "png" or None, from the file's magic bytes (not its name)."""
    if data.startswith(JPEG_MAGIC):
        return "jpeg"
    if data.startswith(PNG_MAGIC):
        return "png"
    return None


@dataclass(frozen=True)
class Header:
    """What an image's header says. ``subsampling``: a JPEG's chroma subsampling ("444",
    "422", "420", "gray", ...), "" when unknown or not a JPEG."""

    format: str
    height: int
    width: int
    subsampling: str = ""

    @property
    def scalable(self) -> bool:
        """Whether it decodes at a reduced scale in the DCT domain (JPEG only)."""
        return self.format == "jpeg"

    @property
    def pixels(self) -> int:
        return self.height * self.width

    def scaled(self, scale: tuple[int, int]) -> tuple[int, int]:
        """(height, width) decoded at ``scale`` = (num, denom): rounded up, as libjpeg's
        scaled IDCT outputs it."""
        return turbojpeg.scaled(self.height, *scale), turbojpeg.scaled(self.width, *scale)


def read_header(data: bytes, name: str = "<bytes>") -> Header:
    """The ``Header`` of ``data``; ``BadImageError`` naming ``name`` if it is not a
    readable JPEG or PNG header."""
    fmt = image_format(data)
    if fmt is None:
        raise BadImageError(f"{name}: not a JPEG or PNG file")
    if fmt == "jpeg":
        # simplejpeg's header read first: about 1 us against 4-5 us through libturbojpeg's
        # ctypes call, which counts for small images (CIFAR's 32 px decode in ~8 us).
        if backends.simplejpeg is not None:
            try:
                return Header(fmt, *backends.simplejpeg_header(data))
            except Exception:  # noqa: BLE001 - the readers below name the reason
                pass
        if turbojpeg.available():
            try:
                h = turbojpeg.read_header(data, name)
                subsampling = _TJSAMP[h.subsampling] if 0 <= h.subsampling < len(_TJSAMP) else ""
                return Header(fmt, h.height, h.width, subsampling)
            except BadImageError:
                pass  # Pillow below names the reason
    return Header(fmt, *backends.pillow_header(data, name))
