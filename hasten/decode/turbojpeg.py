"""Partial JPEG decoding: only the rows and columns of a crop box, at a DCT scale.

A random-resized crop keeps on average under half of the picture, and the
decoder's cost is proportional to the pixels it produces. libjpeg-turbo 3's
TurboJPEG API decodes a region (``tj3SetCroppingRegion``: columns through
``jpeg_crop_scanline``, rows by skipping ``jpeg_skip_scanlines``) at any of its
n/8 scaling factors (``tj3SetScalingFactor``: the IDCT itself outputs fewer
pixels). Neither simplejpeg nor Pillow exposes this; PyTurboJPEG's ``crop()`` is a
lossless transform followed by a full decode. So this module is a small
``ctypes`` binding of the seven TurboJPEG 3 functions it needs.

The library: ``$HASTEN_TURBOJPEG`` (a path to ``libturbojpeg``) if set, else the
copy that the ``turbojpeg`` wheel bundles (a dependency of hasten where it has
wheels; the library only, its own Python module is never imported), else a system
``libturbojpeg`` of version 3. None of them: ``available()`` is False and
``hasten.decode.image.decode`` decodes whole images with simplejpeg or Pillow.

Columns can only start on an iMCU boundary (8 or 16 pixels at full scale, times
the scaling factor), so the decoded region starts at or left of the box and
``decode_region`` says where: the caller resizes the box from that region.

Changes the training math: no. The pixels of the region are those a full decode
at the same scale gives (tested in ``tests/test_decode_turbojpeg.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import threading
from dataclasses import dataclass

import numpy as np

from hasten.errors import BadImageError

ENV = "HASTEN_TURBOJPEG"
# TurboJPEG 3's constants (turbojpeg.h).
_TJINIT_DECOMPRESS = 1
_TJPARAM_STOPONWARNING, _TJPARAM_SUBSAMP, _TJPARAM_JPEGWIDTH, _TJPARAM_JPEGHEIGHT = 0, 4, 5, 6
_TJPARAM_COLORSPACE = 8
_TJPF_RGB = 0
_TJCS_CMYK, _TJCS_YCCK = 3, 4
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)  # tjMCUWidth per TJSAMP_* (444, 422, 420, GRAY, 440, 411, 441)
_MCU_HEIGHT = (8, 8, 16, 8, 16, 8, 32)
# Pillow's decompression-bomb limit: a header that claims more pixels is refused before decoding.
MAX_PIXELS = 89_478_485


class _ScalingFactor(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


def _candidates() -> list[str]:
    """Library paths to try, in order."""
    paths = []
    if os.environ.get(ENV):
        paths.append(os.environ[ENV])
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            dist = distribution("turbojpeg")
            paths += [str(dist.locate_file(f)) for f in (dist.files or []) if _is_library(f.name)]
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover - Python < 3.8
        pass
    found = ctypes.util.find_library("turbojpeg")
    if found:
        paths.append(found)
    return paths


def _is_library(filename: str) -> bool:
    """The shared library among a wheel's files (not its Python extension module)."""
    name = filename.lower()
    shared = name.endswith((".dylib", ".dll")) or ".so" in name
    return shared and "turbojpeg" in name and "cpython" not in name and not name.endswith((".py", ".pyd"))


def _load() -> ctypes.CDLL | None:
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if not hasattr(lib, "tj3SetCroppingRegion"):
            continue  # libjpeg-turbo 2.x: no TurboJPEG 3 API
        lib.tj3Init.argtypes, lib.tj3Init.restype = [ctypes.c_int], ctypes.c_void_p
        lib.tj3Destroy.argtypes, lib.tj3Destroy.restype = [ctypes.c_void_p], None
        lib.tj3DecompressHeader.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.tj3DecompressHeader.restype = ctypes.c_int
        lib.tj3Get.argtypes, lib.tj3Get.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
        lib.tj3Set.argtypes, lib.tj3Set.restype = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int], ctypes.c_int
        lib.tj3SetScalingFactor.argtypes = [ctypes.c_void_p, _ScalingFactor]
        lib.tj3SetScalingFactor.restype = ctypes.c_int
        lib.tj3SetCroppingRegion.argtypes = [ctypes.c_void_p, _Region]
        lib.tj3SetCroppingRegion.restype = ctypes.c_int
        lib.tj3Decompress8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p,
                                       ctypes.c_int, ctypes.c_int]
        lib.tj3Decompress8.restype = ctypes.c_int
        lib.tj3GetErrorStr.argtypes, lib.tj3GetErrorStr.restype = [ctypes.c_void_p], ctypes.c_char_p
        lib._hasten_path = path
        return lib
    return None


_lib: ctypes.CDLL | None | bool = False  # False: not looked for yet
_local = threading.local()  # one TurboJPEG handle per thread (handles are not thread-safe)


def library() -> ctypes.CDLL | None:
    """The loaded libturbojpeg (version 3), or None."""
    global _lib
    if _lib is False:
        _lib = _load()
    return _lib


def available() -> bool:
    return library() is not None


def library_path() -> str | None:
    lib = library()
    return getattr(lib, "_hasten_path", None) if lib is not None else None


def _handle(lib) -> int:
    h = getattr(_local, "handle", None)
    if h is None or getattr(_local, "pid", None) != os.getpid():  # a forked worker makes its own
        h = lib.tj3Init(_TJINIT_DECOMPRESS)
        if not h:
            raise RuntimeError("libturbojpeg: tj3Init failed")
        lib.tj3Set(h, _TJPARAM_STOPONWARNING, 1)  # corrupt data is an error, as simplejpeg's strict=True
        _local.handle, _local.pid = h, os.getpid()
    return h


@dataclass(frozen=True)
class JpegHeader:
    height: int
    width: int
    subsampling: int  # TJSAMP_*; -1 when unknown (no cropping then)


def _error(lib, h, name: str, what: str) -> BadImageError:
    text = lib.tj3GetErrorStr(h)
    error = BadImageError(f"{name}: {what}: {text.decode(errors='replace') if text else 'unknown error'}")
    # A handle that failed keeps part of its state (the next valid file then fails to read
    # "Premature end of JPEG file"): it is dropped, and the next call makes a new one.
    lib.tj3Destroy(h)
    _local.handle = None
    return error


def _with_header(data: bytes, name: str):
    """(library, this thread's handle) with ``data``'s header read into the handle."""
    lib = library()
    if lib is None:
        raise RuntimeError("libturbojpeg 3 is not available")
    h = _handle(lib)
    if lib.tj3DecompressHeader(h, data, len(data)) != 0:
        raise _error(lib, h, name, "cannot read the JPEG header")
    return lib, h


def read_header(data: bytes, name: str = "<bytes>") -> JpegHeader:
    """The JPEG's size and chroma subsampling; ``BadImageError`` if the header is unreadable."""
    lib, h = _with_header(data, name)
    return JpegHeader(lib.tj3Get(h, _TJPARAM_JPEGHEIGHT), lib.tj3Get(h, _TJPARAM_JPEGWIDTH),
                  lib.tj3Get(h, _TJPARAM_SUBSAMP))


EDGE = 2  # pixels decoded beyond each side of a region (see decode_region); 2 measured enough, tests check it


def scaled(dim: int, num: int, denom: int) -> int:
    """TJSCALED: a dimension at scaling factor num/denom (rounded up, as the IDCT outputs it)."""
    return (dim * num + denom - 1) // denom


def decode_region(data: bytes, box: tuple[int, int, int, int] | None = None, scale: tuple[int, int] = (1, 1),
                  name: str = "<bytes>") -> tuple[np.ndarray, tuple[int, int]]:
    """Decode the part of the JPEG under ``box`` = (top, left, height, width), in
    pixels of the *scaled* image (None: all of it), at ``scale`` = (num, denom), one
    of libjpeg-turbo's n/8 factors.

    Returns (RGB uint8 array, (top, left) of the array in the scaled image): the array
    covers the box; it starts left of it when the box's left edge is not on an iMCU
    boundary, and spans the whole width when the subsampling is unknown."""
    lib, h = _with_header(data, name)
    full_h, full_w = lib.tj3Get(h, _TJPARAM_JPEGHEIGHT), lib.tj3Get(h, _TJPARAM_JPEGWIDTH)
    if full_h < 1 or full_w < 1 or full_h * full_w > MAX_PIXELS:
        raise BadImageError(f"{name}: unusable JPEG size {full_w}x{full_h}")
    if lib.tj3Get(h, _TJPARAM_COLORSPACE) in (_TJCS_CMYK, _TJCS_YCCK):
        raise BadImageError(f"{name}: CMYK JPEG")  # the caller falls back to Pillow, which converts it
    g = math.gcd(*scale)
    num, denom = scale[0] // g, scale[1] // g  # libturbojpeg lists factors in lowest terms (1/1, not 8/8)
    if lib.tj3SetScalingFactor(h, _ScalingFactor(num, denom)) != 0:
        raise ValueError(str(_error(lib, h, f"scaling factor {num}/{denom}", "unsupported scaling factor")))
    sh, sw = scaled(full_h, num, denom), scaled(full_w, num, denom)
    top, left, height, width = box if box is not None else (0, 0, sh, sw)
    if not (0 <= top and 0 <= left and height > 0 and width > 0 and top + height <= sh and left + width <= sw):
        raise ValueError(f"box {box} outside the {sw}x{sh} scaled image")
    # A margin around the box inside the image: at the edges of a cropping region,
    # libjpeg-turbo upsamples chroma without the neighbouring samples (the first and
    # last rows, the last column, differ from a full decode by a few levels); decoded
    # with EDGE more pixels on each side, the box's own pixels are a full decode's.
    m_top, m_bottom = min(EDGE, top), min(EDGE, sh - top - height)
    subsamp = lib.tj3Get(h, _TJPARAM_SUBSAMP)
    if 0 <= subsamp < len(_MCU_WIDTH):
        step = scaled(_MCU_WIDTH[subsamp], num, denom)
        start = max(0, left - EDGE)
        x = start - start % step
        w = min(sw, left + width + EDGE) - x
    else:  # unknown subsampling: libturbojpeg refuses column cropping; rows still skip
        x, w = 0, sw
    y, rows = top - m_top, height + m_top + m_bottom
    region = _Region(x, y, w, rows) if (x, y, w, rows) != (0, 0, sw, sh) else _Region(0, 0, 0, 0)
    if lib.tj3SetCroppingRegion(h, region) != 0:
        raise _error(lib, h, name, f"cannot crop to {(x, y, w, rows)}")
    out = np.empty((rows, w, 3), dtype=np.uint8)
    if lib.tj3Decompress8(h, data, len(data), out.ctypes.data, w * 3, _TJPF_RGB) != 0:
        raise _error(lib, h, name, "cannot decode")
    return out[m_top:m_top + height, :left + width - x], (top, x)
