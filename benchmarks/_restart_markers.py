"""Restart markers added losslessly, and a region decode that entropy-decodes only the crop:
what ``benchmarks/restart_markers.py`` measures (issue 46). Not part of hasten.

Tried as an opt-in of ``hasten data pack`` and not shipped (docs/results/imagenet-pipeline.md):
15% less CPU on a synthetic texture's region decode, nothing measurable on photographs, at
the cost of a check on every crop for every user and of a binding into the private libjpeg
that Pillow bundles, with its struct offsets written below. Kept here so that the negative
result can be measured again.

A baseline JPEG's scan is one Huffman-coded stream with each block's DC coefficient coded
as a difference from the previous block's: to reach a crop box, libjpeg-turbo's partial
decode (``hasten.decode.turbojpeg``) must Huffman-decode every block above the box and
beside it. JPEG's restart intervals (ITU-T T.81: a ``DRI`` segment and ``RSTn`` markers)
end that dependence: at each marker the coder's bit buffer is byte-aligned and the DC
predictions restart from 0, so an interval decodes on its own. ``jpegtran -restart N``
(IJG libjpeg) adds them losslessly: it reads the DCT coefficients and writes them again
with markers, without an inverse or forward DCT.

``add_restart_markers`` does what ``jpegtran -restart -optimize`` does, with the libjpeg that
Pillow bundles (libjpeg-turbo, ABI 62, called by ``ctypes``): intervals of about
``interval_px`` pixels, a whole number of them per MCU row, optimised Huffman tables, the
other application segments (EXIF, ICC) copied. It refuses (returns None) what it cannot
carry over exactly (progressive, arithmetic-coded or lossless JPEGs, CMYK, files a strict
decode refuses) and checks each result: the decoded pixels must equal the input's. An
APP9 segment stores the intervals' lengths, so that a decode need not search the scan for
its markers (they are checked against the markers before use). libjpeg's fatal-error
handler cannot return to Python: the strict decode before each transcode keeps bad input
away from it, and were it reached, the process ends with one line on stderr.

``decode_region`` then decodes a box of such a file through a smaller JPEG made of the
intervals that cover it (plus ``turbojpeg.EDGE`` pixels, for the chroma upsampling at
its edges): the header with the smaller height and width, the intervals copied, their
markers renumbered. Its pixels are those of a full decode cut to the box
(tests/test_benchmarks_restart_markers.py). Measured: libjpeg-turbo's part of a region
decode is a quarter to a third less (the Huffman decoding outside the box is gone, the
per-image set-up and the box's own decoding are not); with this module's Python, 15% less
on the texture and nothing measurable on photographs.

Changes the training math: no. The stored coefficients, so the decoded pixels, are the
same; the files differ in bytes (markers, Huffman tables).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import struct
from dataclasses import dataclass

import numpy as np

from hasten.decode import turbojpeg
from hasten.errors import BadImageError

DEFAULT_INTERVAL_PX = 32  # measured: 16 and 32 px decode alike; 32 costs fewer bytes
# libjpeg's ABI 62 on LP64 (jpeglib.h's sizeof and offsetof, boolean = int); elsewhere: not available().
_COMPRESS_SIZE, _DECOMPRESS_SIZE, _ERROR_MGR_SIZE = 520, 632, 168
_C_OPTIMIZE_CODING, _C_RESTART_INTERVAL = 264, 280
_ERR_OUTPUT_MESSAGE, _ERR_NUM_WARNINGS = 16, 128
_SOF_BASELINE, _SOF_EXTENDED = 0xC0, 0xC1  # the Huffman sequential frames; any other SOFn: refused
_SOS, _DRI, _EOI = 0xDA, 0xDD, b"\xff\xd9"
_KEEP_SEGMENTS = {*range(0xE1, 0xEE), 0xEF, 0xFE}  # APP1-APP13, APP15, COM (libjpeg writes APP0, APP14)
# The intervals' lengths, stored in an APP9 segment before the scan so that a decode need
# not search the scan for its markers (a third of the region decode's Python time).
_INDEX_MARKER, _INDEX_ID = 0xE9, b"hasten restart intervals\0"


@dataclass(frozen=True)
class Layout:
    """What a single-scan Huffman JPEG's header says, as the region decode needs it."""

    sof: int  # offset of the SOF marker
    scan: int  # offset of the first entropy-coded byte
    height: int
    width: int
    mcu_height: int
    mcu_width: int
    interval: int  # MCUs per restart interval; 0: no restart markers
    index: int = 0  # offset of the intervals' lengths (uint16, little-endian); 0: none stored
    sos: int = 0  # offset of the SOS marker

    @property
    def mcu_cols(self) -> int:
        return -(-self.width // self.mcu_width)

    @property
    def mcu_rows(self) -> int:
        return -(-self.height // self.mcu_height)


def layout(data: bytes) -> Layout | None:
    """The ``Layout`` of a sequential Huffman-coded 8-bit JPEG with one scan of all its
    components, or None for anything else (progressive, arithmetic, lossless, damaged)."""
    try:
        if not data.startswith(b"\xff\xd8"):
            return None
        pos, sof, interval, index = 2, None, 0, 0
        while True:
            if data[pos] != 0xFF:
                return None
            marker = data[pos + 1]
            if marker == 0xFF:  # fill byte
                pos += 1
                continue
            length = (data[pos + 2] << 8) | data[pos + 3]
            if marker in (_SOF_BASELINE, _SOF_EXTENDED):
                sof = pos
            elif 0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                return None  # progressive, lossless, arithmetic-coded or hierarchical
            elif marker == _DRI:
                interval = (data[pos + 4] << 8) | data[pos + 5]
            elif marker == _SOS:
                sos, scan = pos, pos + 2 + length
                break
            elif marker == _INDEX_MARKER and data.startswith(_INDEX_ID, pos + 4):
                index = pos + 4 + len(_INDEX_ID)
            pos += 2 + length
        if sof is None:
            return None
        precision, height, width, ncomp = struct.unpack_from(">BHHB", data, sof + 4)
        if precision != 8 or ncomp not in (1, 3) or data[pos + 4] != ncomp or height == 0:
            return None  # 12-bit, CMYK, or a scan of some components only (more scans follow)
        factors = [data[sof + 11 + 3 * i] for i in range(ncomp)]
        h_max, v_max = (1, 1) if ncomp == 1 else (max(f >> 4 for f in factors), max(f & 15 for f in factors))
        return Layout(sof, scan, height, width, 8 * v_max, 8 * h_max, interval, index, sos)
    except (IndexError, struct.error):
        return None


# --------------------------------------------------------------------------
# Adding the markers: libjpeg's transcoder (jpeg_read_coefficients, jpeg_write_coefficients)
# --------------------------------------------------------------------------

_VP = ctypes.c_void_p
_ERROR_FN = ctypes.CFUNCTYPE(None, _VP)


@_ERROR_FN
def _fatal(cinfo):  # libjpeg's error_exit must not return; the checks before each call make this unreachable
    os.write(2, b"hasten: libjpeg failed while adding restart markers (a JPEG it accepted on a first decode)\n")
    os._exit(70)


@_ERROR_FN
def _quiet(cinfo):  # warnings are counted (num_warnings) and refused, not printed
    pass


def _library_paths() -> list[str]:
    """Pillow's bundled libjpeg (ABI 62), then the system's."""
    try:
        import PIL

        here = os.path.dirname(PIL.__file__)
        paths = glob.glob(os.path.join(here, os.pardir, "pillow.libs", "libjpeg*.so.62*"))
        paths += glob.glob(os.path.join(here, ".dylibs", "libjpeg.62*.dylib"))
    except ImportError:  # pragma: no cover - Pillow is a dependency
        paths = []
    system = ctypes.util.find_library("jpeg")
    if system and "62" in os.path.basename(system):
        paths.append(system)
    return paths


_lib: ctypes.CDLL | None | bool = False  # False: not looked for yet


def _libjpeg() -> ctypes.CDLL | None:
    global _lib
    if _lib is False:
        _lib = None
        if os.name == "posix" and ctypes.sizeof(ctypes.c_long) == 8:  # the offsets above are LP64's
            for path in _library_paths():
                try:
                    lib = ctypes.CDLL(path)
                    libc = ctypes.CDLL(ctypes.util.find_library("c"))
                except OSError:
                    continue
                if hasattr(lib, "jpeg_write_coefficients") and hasattr(lib, "jpeg_mem_dest"):
                    _declare(lib)
                    lib.free, lib.free.argtypes = libc.free, [_VP]
                    _lib = lib
                    break
    return _lib


def _declare(lib) -> None:
    lib.jpeg_std_error.argtypes, lib.jpeg_std_error.restype = [_VP], _VP
    lib.jpeg_CreateDecompress.argtypes = lib.jpeg_CreateCompress.argtypes = [_VP, ctypes.c_int, ctypes.c_size_t]
    lib.jpeg_mem_src.argtypes = [_VP, ctypes.c_char_p, ctypes.c_ulong]
    lib.jpeg_mem_dest.argtypes = [_VP, ctypes.POINTER(_VP), ctypes.POINTER(ctypes.c_ulong)]
    lib.jpeg_read_header.argtypes = [_VP, ctypes.c_int]
    lib.jpeg_read_coefficients.argtypes, lib.jpeg_read_coefficients.restype = [_VP], _VP
    lib.jpeg_copy_critical_parameters.argtypes = lib.jpeg_write_coefficients.argtypes = [_VP, _VP]
    for name in ("jpeg_finish_compress", "jpeg_finish_decompress", "jpeg_destroy_compress",
                 "jpeg_destroy_decompress"):
        getattr(lib, name).argtypes = [_VP]


def available() -> bool:
    """Whether ``add_restart_markers`` can run here (a libjpeg of ABI 62 loads)."""
    return _libjpeg() is not None


def _transcode(lib, data: bytes, interval: int) -> bytes | None:
    """``data``'s coefficients written again with ``interval`` MCUs per restart interval
    and optimised Huffman tables (``jpegtran -restart -optimize``); None on a warning."""
    err = ctypes.create_string_buffer(_ERROR_MGR_SIZE)
    lib.jpeg_std_error(err)
    _VP.from_buffer(err, 0).value = ctypes.cast(_fatal, _VP).value
    _VP.from_buffer(err, _ERR_OUTPUT_MESSAGE).value = ctypes.cast(_quiet, _VP).value
    src, dst = ctypes.create_string_buffer(_DECOMPRESS_SIZE), ctypes.create_string_buffer(_COMPRESS_SIZE)
    _VP.from_buffer(src, 0).value = _VP.from_buffer(dst, 0).value = ctypes.addressof(err)
    lib.jpeg_CreateDecompress(src, 62, _DECOMPRESS_SIZE)
    lib.jpeg_CreateCompress(dst, 62, _COMPRESS_SIZE)
    out, size = _VP(), ctypes.c_ulong(0)
    try:
        lib.jpeg_mem_src(src, data, len(data))
        lib.jpeg_read_header(src, 1)
        coefficients = lib.jpeg_read_coefficients(src)
        lib.jpeg_mem_dest(dst, ctypes.byref(out), ctypes.byref(size))
        lib.jpeg_copy_critical_parameters(src, dst)
        ctypes.c_uint.from_buffer(dst, _C_RESTART_INTERVAL).value = interval
        ctypes.c_int.from_buffer(dst, _C_OPTIMIZE_CODING).value = 1
        lib.jpeg_write_coefficients(dst, coefficients)
        lib.jpeg_finish_compress(dst)
        result = ctypes.string_at(out, size.value)
        lib.jpeg_finish_decompress(src)
        return None if ctypes.c_long.from_buffer(err, _ERR_NUM_WARNINGS).value else result
    finally:
        lib.jpeg_destroy_compress(dst)
        lib.jpeg_destroy_decompress(src)
        if out.value:
            lib.free(out)


def _segments(data: bytes, end: int) -> list[tuple[int, int, int]]:
    """(marker, start, stop) of each header segment before offset ``end``."""
    found, pos = [], 2
    while pos < end:
        length = (data[pos + 2] << 8) | data[pos + 3]
        found.append((data[pos + 1], pos, pos + 2 + length))
        pos += 2 + length
    return found


def _with_segments_of(original: bytes, original_scan: int, out: bytes) -> bytes:
    """``out`` with ``original``'s application segments that libjpeg does not write
    (EXIF, ICC, comments...), placed after ``out``'s own leading APPn segments."""
    kept = [original[a:b] for m, a, b in _segments(original, original_scan)
            if m in _KEEP_SEGMENTS and not original.startswith(_INDEX_ID, a + 4)]
    if not kept:
        return out
    at = 2
    for marker, _, stop in _segments(out, layout(out).scan):
        if not 0xE0 <= marker <= 0xEF:
            break
        at = stop
    return out[:at] + b"".join(kept) + out[at:]


def interval_for(lay: Layout, interval_px: int) -> int:
    """MCUs per interval: the divisor of the MCU row nearest ``interval_px`` pixels, so
    that every row starts an interval and a box's columns are whole intervals."""
    target = max(1, round(interval_px / lay.mcu_width))
    divisors = [d for d in range(1, lay.mcu_cols + 1) if lay.mcu_cols % d == 0]
    return min(divisors, key=lambda d: (abs(d - target), d))


def add_restart_markers(data: bytes, name: str = "<bytes>", interval_px: int = DEFAULT_INTERVAL_PX) -> bytes | None:
    """``data`` written again losslessly with restart markers about every ``interval_px``
    pixels along each MCU row (optimised Huffman tables, other segments kept); None when
    it cannot be done here or exactly (see the module's docstring): keep the original."""
    if not isinstance(interval_px, int) or isinstance(interval_px, bool) or interval_px < 1:
        raise ValueError(f"interval_px must be a positive integer; got {interval_px!r}")
    lib, lay = _libjpeg(), layout(data)
    if lib is None or lay is None or not turbojpeg.available():
        return None
    try:  # a strict decode first: libjpeg's transcoder must never meet an error it cannot return from
        reference, _ = turbojpeg.decode_region(data)
    except (ValueError, BadImageError):
        return None
    out = _transcode(lib, data, interval_for(lay, interval_px))
    if out is None:
        return None
    out = _with_index(_with_segments_of(data, lay.scan, out))
    got, _ = turbojpeg.decode_region(out)
    return out if np.array_equal(got, reference) else None  # the same coefficients decode to the same pixels


# --------------------------------------------------------------------------
# The region decode
# --------------------------------------------------------------------------

def _with_index(data: bytes) -> bytes:
    """``data`` with the APP9 segment of its intervals' lengths before the scan (as it is
    when an interval is 64 KB or more, or there are more than an APP segment holds)."""
    lay = layout(data)
    starts = _search_starts(data, lay.scan)
    lengths = np.append(starts[1:] - 2, len(data) - 2) - starts
    payload = _INDEX_ID + lengths.astype("<u2").tobytes()
    if lengths.max() >= 1 << 16 or len(payload) + 2 >= 1 << 16:
        return data
    return data[:lay.sos] + struct.pack(">BBH", 0xFF, _INDEX_MARKER, len(payload) + 2) + payload + data[lay.sos:]


def _search_starts(data: bytes, scan: int) -> np.ndarray:
    """Offsets of every restart interval's first byte (after each RSTn marker), found by
    searching the scan."""
    arr = np.frombuffer(data, np.uint8)
    ff = np.flatnonzero(arr[scan:-1] == 0xFF) + scan  # in the scan, 0xFF is followed by 0x00 or a marker
    return np.concatenate(([scan], ff[(arr[ff + 1] & 0xF8) == 0xD0] + 2))


def _interval_starts(data: bytes, lay: Layout) -> np.ndarray:
    """Offsets of every restart interval's first byte: from the stored lengths when they
    add up and every marker is where they say, else by searching the scan."""
    if lay.index:
        count = (((data[lay.index - len(_INDEX_ID) - 2] << 8) | data[lay.index - len(_INDEX_ID) - 1])
                 - 2 - len(_INDEX_ID)) // 2
        lengths = np.frombuffer(data, "<u2", count, lay.index).astype(np.int64)
        starts = lay.scan + np.concatenate(([0], np.cumsum(lengths[:-1] + 2)))
        if count and starts[-1] + lengths[-1] == len(data) - 2:
            arr = np.frombuffer(data, np.uint8)
            if (arr[starts[1:] - 2] == 0xFF).all() and ((arr[starts[1:] - 1] & 0xF8) == 0xD0).all():
                return starts
    return _search_starts(data, lay.scan)


def decode_region(data: bytes, box: tuple[int, int, int, int], scale: tuple[int, int] = (1, 1),
                  name: str = "<bytes>") -> tuple[np.ndarray, tuple[int, int]] | None:
    """``turbojpeg.decode_region`` (same arguments and result) through the restart intervals
    that cover ``box``; None when ``data`` has no usable restart layout (no markers, an
    interval that does not divide the MCU row, or not as many intervals as its header says):
    the caller decodes it the usual way. Damaged data raises ``BadImageError`` as there."""
    part = intervals_under(data, box, scale)
    if part is None:
        return None
    smaller, (y, x) = part
    top, left, height, width = box
    out, (_, left_at) = turbojpeg.decode_region(smaller, (top - y, left - x, height, width), scale, name)
    return out, (top, left_at + x)


def intervals_under(data: bytes, box: tuple[int, int, int, int],
                    scale: tuple[int, int] = (1, 1)) -> tuple[bytes, tuple[int, int]] | None:
    """(a JPEG of the restart intervals that cover ``box`` and ``turbojpeg.EDGE`` pixels
    around it, (top, left) of that JPEG in the image at ``scale``); ``data`` itself at
    (0, 0) when they are all of it; None without a usable restart layout."""
    lay = layout(data)
    if lay is None or lay.interval == 0 or lay.mcu_cols % lay.interval or not data.endswith(_EOI):
        return None
    num, denom = scale
    if (lay.mcu_height * num) % denom or (lay.mcu_width * num) % denom:
        return None  # an MCU that is not a whole number of scaled pixels
    per_row = lay.mcu_cols // lay.interval
    mh, mw = lay.mcu_height * num // denom, lay.mcu_width * num // denom  # an MCU in scaled pixels
    top, left, height, width = box
    r0, r1 = max(0, top - turbojpeg.EDGE) // mh, min(lay.mcu_rows - 1, (top + height - 1 + turbojpeg.EDGE) // mh)
    c0 = max(0, left - turbojpeg.EDGE) // mw // lay.interval
    c1 = min(per_row - 1, (left + width - 1 + turbojpeg.EDGE) // mw // lay.interval)
    if c0 > 0 and lay.width - c0 * lay.interval * lay.mcu_width <= lay.mcu_width:
        c0 -= 1  # libjpeg upsamples chroma 2 samples wide or less without its fancy filter: never that narrow
    starts = _interval_starts(data, lay)
    if len(starts) != lay.mcu_rows * per_row:
        return None
    if (r0, c0, r1, c1) == (0, 0, lay.mcu_rows - 1, per_row - 1):
        return data, (0, 0)
    ends = np.empty_like(starts)
    ends[:-1], ends[-1] = starts[1:] - 2, len(data) - 2
    rows = np.arange(r0, r1 + 1) * per_row
    view = memoryview(data)
    body = bytearray(b"\xff\xd0".join(view[a:b] for a, b in zip(starts[rows + c0].tolist(), ends[rows + c1].tolist())))
    picked = (rows[:, None] + np.arange(c0, c1 + 1)[None, :]).ravel()
    if len(picked) > 1:  # every marker of the smaller scan, the copied ones too, numbered again from RST0
        at = np.cumsum(ends[picked[:-1]] - starts[picked[:-1]]) + 2 * np.arange(len(picked) - 1)
        np.frombuffer(body, np.uint8)[at + 1] = 0xD0 + (np.arange(len(picked) - 1) & 7)
    x0 = c0 * lay.interval * lay.mcu_width
    head = bytearray(view[:lay.scan])
    struct.pack_into(">HH", head, lay.sof + 5, min(lay.height - r0 * lay.mcu_height, len(rows) * lay.mcu_height),
                     min(lay.width - x0, (c1 - c0 + 1) * lay.interval * lay.mcu_width))
    return bytes(head + body + _EOI), (r0 * mh, c0 * lay.interval * mw)
