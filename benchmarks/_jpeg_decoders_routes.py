"""The routes of ``jpeg_decoders.py``: each installed decoder (Pillow, simplejpeg, OpenCV, PyTurboJPEG,
hasten's ``decode_region``) turning a JPEG's bytes into one random-resized crop.

A route is ``(data, (H, W), box, size) -> (size, size, 3) RGB uint8``; ``make_routes`` returns those
whose package is installed, and why each other is skipped. ``torch_resize`` and ``pillow_resize`` are
the resizes the routes (and the benchmark's resize-alone rows) use.

Changes the training math: no (measurement only).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import io

import numpy as np
import torch
from PIL import Image

from hasten.decode import turbojpeg as hturbo
from hasten.stream import fused_crop as fc


def optional(module: str):
    try:
        return importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any failure to import means the route is skipped, with the reason
        return None


def _pyturbojpeg():
    """PyTurboJPEG's module, loaded from its file: its module is named ``turbojpeg``, as is
    the extension module of the ``turbojpeg`` wheel (the one that bundles libturbojpeg 3),
    and with both installed ``import turbojpeg`` finds the extension, not PyTurboJPEG."""
    import importlib.util

    try:
        dist = importlib.metadata.distribution("pyturbojpeg")
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.spec_from_file_location("pyturbojpeg_module", dist.locate_file("turbojpeg.py"))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - a broken install is a skipped route
        return None
    return module


def torch_resize(crop: np.ndarray, size: int) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1).unsqueeze(0)
    return torch.nn.functional.interpolate(t, size=(size, size), mode="bilinear", antialias=True,
                                           align_corners=False)[0].permute(1, 2, 0).numpy()


def pillow_resize(crop: np.ndarray, size: int) -> np.ndarray:
    return np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize((size, size), Image.BILINEAR))


def _resize_box(array: np.ndarray, box, full_hw: tuple[int, int], size: int) -> np.ndarray:
    """``box`` (in full-size pixels) of ``array`` (decoded at any scale) resized to ``size``:
    torch's antialiased kernel for a whole-pixel box (full scale), else Pillow's BILINEAR from
    the fractional box (hasten's resize before the partial decode)."""
    h, w = array.shape[:2]
    sy, sx = h / full_hw[0], w / full_hw[1]
    if (sy, sx) == (1.0, 1.0):
        return torch_resize(array[box.top:box.top + box.height, box.left:box.left + box.width], size)
    region = (box.left * sx, box.top * sy, (box.left + box.width) * sx, (box.top + box.height) * sy)
    return np.asarray(Image.fromarray(array).resize((size, size), Image.BILINEAR, box=region))


def _scaled_box(box, factor: int, sh: int, sw: int) -> tuple[int, int, int, int]:
    """The box in pixels of an image decoded at 1/factor (sh x sw), rounded to whole pixels."""
    top, left = min(round(box.top / factor), sh - 1), min(round(box.left / factor), sw - 1)
    bottom = min(max(top + 1, round((box.top + box.height) / factor)), sh)
    right = min(max(left + 1, round((box.left + box.width) / factor)), sw)
    return top, left, bottom, right


def make_routes() -> tuple[dict, dict]:
    """({name: function}, {name: why skipped}) for the installed packages."""
    routes, skipped = {}, {}
    simplejpeg = optional("simplejpeg")
    cv2 = optional("cv2")
    pyturbo = _pyturbojpeg() if hturbo.available() else None

    def pillow_full(data, hw, box, size):
        with Image.open(io.BytesIO(data)) as img:
            img = img.convert("RGB")
            return np.asarray(img.resize((size, size), Image.BILINEAR,
                                         box=(box.left, box.top, box.left + box.width, box.top + box.height)))

    def pillow_draft(data, hw, box, size):
        f = fc.dct_scale(box, size)
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", (max(1, hw[1] // f), max(1, hw[0] // f)))
            img = img.convert("RGB")
            sy, sx = img.height / hw[0], img.width / hw[1]
            region = (box.left * sx, box.top * sy, (box.left + box.width) * sx, (box.top + box.height) * sy)
            return np.asarray(img.resize((size, size), Image.BILINEAR, box=region))

    routes["Pillow full"] = pillow_full
    routes["Pillow draft"] = pillow_draft

    if simplejpeg is not None:
        def sj_full(data, hw, box, size):
            a = simplejpeg.decode_jpeg(data, colorspace="RGB")
            return torch_resize(a[box.top:box.top + box.height, box.left:box.left + box.width], size)

        def sj_scaled(data, hw, box, size):
            f = fc.dct_scale(box, size)
            a = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-hw[0] // f), min_width=-(-hw[1] // f))
            return _resize_box(a, box, hw, size)

        routes["simplejpeg full"] = sj_full
        routes["simplejpeg DCT-scaled (hasten before)"] = sj_scaled
    else:
        skipped["simplejpeg"] = "simplejpeg is not installed"

    if cv2 is not None:
        cv2.setNumThreads(1)
        reduced = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
                   8: cv2.IMREAD_REDUCED_COLOR_8}

        def cv2_route(scaled: bool, interp: int):
            def run(data, hw, box, size):
                f = fc.dct_scale(box, size) if scaled else 1
                a = cv2.imdecode(np.frombuffer(data, np.uint8), reduced[f])
                t, l, b, r = _scaled_box(box, f, a.shape[0], a.shape[1])
                out = cv2.resize(a[t:b, l:r], (size, size), interpolation=interp)
                return cv2.cvtColor(out, cv2.COLOR_BGR2RGB)  # cv2 decodes BGR
            return run

        for scaled in (False, True):
            for iname, interp in (("AREA", cv2.INTER_AREA), ("LINEAR", cv2.INTER_LINEAR)):
                routes[f"cv2 {'reduced' if scaled else 'full'} + {iname}"] = cv2_route(scaled, interp)
    else:
        skipped["OpenCV"] = "cv2 is not importable (pip install opencv-python-headless)"

    if pyturbo is not None and hasattr(pyturbo, "TurboJPEG"):
        tj = pyturbo.TurboJPEG(lib_path=hturbo.library_path())

        def pt_scaled(data, hw, box, size):
            f = fc.dct_scale(box, size)
            a = tj.decode(data, pixel_format=pyturbo.TJPF_RGB, scaling_factor=(1, f) if f > 1 else None)
            t, l, b, r = _scaled_box(box, f, a.shape[0], a.shape[1])
            return torch_resize(a[t:b, l:r], size)

        def pt_crop(data, hw, box, size):
            # Lossless crop (preserve=False): the origin is rounded down to the iMCU and the
            # cropped JPEG covers the box; then a (scaled) decode of the cropped JPEG.
            sub = tj.decode_header(data)[2]
            y0, x0 = box.top - box.top % pyturbo.tjMCUHeight[sub], box.left - box.left % pyturbo.tjMCUWidth[sub]
            cropped = tj.crop(data, box.left, box.top, box.width, box.height)
            f = fc.dct_scale(box, size)
            a = tj.decode(cropped, pixel_format=pyturbo.TJPF_RGB, scaling_factor=(1, f) if f > 1 else None)
            inner = fc.Box(box.top - y0, box.left - x0, box.height, box.width)
            t, l, b, r = _scaled_box(inner, f, a.shape[0], a.shape[1])
            return torch_resize(a[t:b, l:r], size)

        routes["PyTurboJPEG scaled"] = pt_scaled
        routes["PyTurboJPEG crop + scaled"] = pt_crop
    elif not hturbo.available():
        skipped["PyTurboJPEG"] = "no libturbojpeg 3 (pip install turbojpeg, whose wheel bundles one)"
    else:
        skipped["PyTurboJPEG"] = "PyTurboJPEG is not installed (pip install pyturbojpeg)"

    if hturbo.available():
        def region(resize):
            # The rows and columns under the box only, at the DCT scale (as fused_crop does when
            # libturbojpeg 3 loads); the region starts at or left of the box (iMCU columns).
            def run(data, hw, box, size):
                f = fc.dct_scale(box, size)
                t, l, b, r = _scaled_box(box, f, hturbo.scaled(hw[0], 1, f), hturbo.scaled(hw[1], 1, f))
                out, (_, rl) = hturbo.decode_region(data, (t, l, b - t, r - l), (1, f))
                return resize(out[:, l - rl:r - rl], size)
            return run

        routes["hasten region (decode_region)"] = region(torch_resize)
        if cv2 is not None:
            routes["hasten region + cv2 AREA"] = region(
                lambda c, s: cv2.resize(c, (s, s), interpolation=cv2.INTER_AREA))
            routes["hasten region + cv2 LINEAR"] = region(
                lambda c, s: cv2.resize(c, (s, s), interpolation=cv2.INTER_LINEAR))
    else:
        skipped["hasten region"] = "no libturbojpeg 3 (pip install hasten[turbo])"
    return routes, skipped
