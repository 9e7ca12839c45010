"""Restart markers at pack time (issue 46): CPU per random crop before and after, and bytes.

Tried as an opt-in of ``hasten data pack`` and not shipped (docs/results/imagenet-pipeline.md);
this script and ``_restart_markers.py`` beside it keep the measurement reproducible.

For each JPEG of a set: the file as given, and the same file written again by
``_restart_markers.add_restart_markers`` (restart markers about every 32 px,
optimised Huffman tables: the same pixels, checked here crop by crop). For each crop
size, one random-resized-crop box per image (torchvision's distribution, the DCT scale
and box as ``hasten.stream.fused_crop`` picks them), measured in one process, one
thread, as CPU seconds (``time.process_time``) per image:

- ``region decode``: the box's decode, libjpeg-turbo 3's partial decode of the file as
  given (``hasten.decode.turbojpeg``) against the decode of the intervals under the box
  (``_restart_markers.decode_region``), and that decode's libjpeg-turbo part alone
  (``intervals prebuilt``: the smaller JPEG made beforehand; what is left is Python's share);
- ``fused crop``: a decode worker's whole work per image (``fused_crop``: header, box,
  decode, OpenCV resize into a reused slot, flip) on each file; for the marked files with
  ``hasten.decode.image``'s region decode routed as the opt-in wired it
  (``image_decode_with_markers``: the intervals under the box, for every crop).

Also the bytes (as given; written again without markers, optimised tables only; with
markers) and the CPU of adding the markers at pack time. Configurations run in a fresh
shuffled order in each repeat (``hasten.timing.interleaved``).

The set: ``--folder DIR`` (every ``*.jpg`` under it: real photographs), else the
synthetic texture of ``benchmarks/imagenet_pipeline.py`` (its generator, in
``_imagenet_pipeline_data.py``; ``--images`` of them, written to a temporary folder).

    python benchmarks/restart_markers.py [--folder DIR] [--images 400] [--repeats 3] [--sizes 224,128] [--smoke]

Writes ``benchmarks/results/restart_markers.json`` (``--out``; ``--smoke``: 24 images,
one repeat, nothing written unless ``--out`` is given).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

import _restart_markers as restart
import hasten.decode.image
from _common import RESULTS, MeasuredConditions, mean_ci, plus_minus, write_results
from hasten.decode import turbojpeg
from hasten.decode.header import read_header
from hasten.stream.fused_crop import _scaled_box, dct_scale, fused_crop, random_resized_box
from hasten.timing import interleaved


def load_set(folder: str | None, images: int, seed: int) -> tuple[str, list[bytes]]:
    if folder:
        files = sorted(Path(folder).expanduser().rglob("*.jpg"))[:images]
        if not files:
            raise SystemExit(f"--folder {folder}: no .jpg files under it")
        return f"folder {Path(folder).name}", [f.read_bytes() for f in files]
    import _imagenet_pipeline_data

    with tempfile.TemporaryDirectory() as tmp:
        _imagenet_pipeline_data._write_images((tmp, seed, [(f"{i:05d}.jpg", i % 100) for i in range(images)]))
        return "synthetic texture (imagenet_pipeline's generator)", [
            (Path(tmp) / f"{i:05d}.jpg").read_bytes() for i in range(images)]


def boxes(datas: list[bytes], size: int, seed: int) -> list[tuple[tuple[int, int, int, int], tuple[int, int]]]:
    """(box in scaled pixels, scale) per image, as ``fused_crop`` draws and scales them."""
    out = []
    for i, data in enumerate(datas):
        header = read_header(data)
        box = random_resized_box(header.height, header.width, np.random.default_rng([seed, size, i]))
        factor = dct_scale(box, size)
        region = _scaled_box(box, factor, header.scaled((1, factor)))
        out.append(((region.top, region.left, region.height, region.width), (1, factor)))
    return out


def decode_with_markers(data: bytes, box=None, scale: tuple[int, int] = (1, 1), name: str = "<bytes>"):
    """``turbojpeg.decode_region`` as the opt-in wired it into ``hasten.decode.image``: a file
    with usable restart markers through the intervals under the box, any other the usual way
    (the check costs every crop about 5 us)."""
    got = restart.decode_region(data, box, scale, name)
    return got if got is not None else turbojpeg.decode_region(data, box, scale, name)


@contextlib.contextmanager
def image_decode_with_markers():
    """``hasten.decode.image.decode`` (so ``fused_crop``) with ``decode_with_markers`` as its
    region decode, for the duration."""
    real = hasten.decode.image.turbojpeg
    hasten.decode.image.turbojpeg = types.SimpleNamespace(available=real.available, decode_region=decode_with_markers)
    try:
        yield
    finally:
        hasten.decode.image.turbojpeg = real


def cpu_ms_per_image(fn, items, route=contextlib.nullcontext) -> float:
    with route():
        start = time.process_time()
        for item in items:
            fn(*item)
        return (time.process_time() - start) / len(items) * 1e3


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default=None, help="a folder of JPEGs (real photographs); default: synthetic texture")
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="224,128")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if not (restart.available() and turbojpeg.available()):
        raise SystemExit("needs libturbojpeg 3 (the turbojpeg wheel) and a libjpeg of ABI 62 (Pillow's, LP64)")
    if args.smoke:
        args.images, args.repeats = 24, 1
    name, plain = load_set(args.folder, args.images, args.seed)
    start = time.process_time()
    marked = [restart.add_restart_markers(d) for d in plain]
    pack_ms = (time.process_time() - start) / len(plain) * 1e3
    keep = [i for i, m in enumerate(marked) if m is not None]
    plain, marked = [plain[i] for i in keep], [marked[i] for i in keep]
    lib = restart._libjpeg()
    optimised = sum(len(restart._transcode(lib, d, 0)) for d in plain)
    sizes = [int(s) for s in args.sizes.split(",")]
    slots = {s: np.empty((s, s, 3), np.uint8) for s in sizes}
    configs, work = [], {}
    for s in sizes:
        jobs = boxes(plain, s, args.seed)
        work[(s, "region decode", "as given")] = (turbojpeg.decode_region,
                                                 [(d, b, sc) for d, (b, sc) in zip(plain, jobs)])
        work[(s, "region decode", "restart markers")] = (restart.decode_region,
                                                        [(d, b, sc) for d, (b, sc) in zip(marked, jobs)])
        # libjpeg-turbo's part of it: the JPEG of the intervals under the box made beforehand.
        parts = [(restart.intervals_under(d, b, sc), b, sc) for d, (b, sc) in zip(marked, jobs)]
        work[(s, "region decode", "intervals prebuilt")] = (turbojpeg.decode_region, [
            (small, (b[0] - y, b[1] - x, b[2], b[3]), sc) for (small, (y, x)), b, sc in parts])
        crop = (lambda s: lambda d, i: fused_crop(d, "x", s, rng=np.random.default_rng([args.seed, i]),
                                                  out=slots[s]))(s)
        for kind, files, route in (("as given", plain, contextlib.nullcontext),
                                   ("restart markers", marked, image_decode_with_markers)):
            work[(s, "fused crop", kind)] = (crop, [(d, i) for i, d in enumerate(files)], route)
        for i in range(0, len(plain), max(1, len(plain) // 16)):  # the same crops, pixel for pixel
            a = fused_crop(plain[i], "x", s, rng=np.random.default_rng([args.seed, i])).copy()
            with image_decode_with_markers():
                assert np.array_equal(a, fused_crop(marked[i], "x", s, rng=np.random.default_rng([args.seed, i])))
        configs += list(k for k in work if k[0] == s)
    times: dict = {k: [] for k in configs}
    with MeasuredConditions("cpu", seconds=0.2 if args.smoke else 1.0) as cond:
        for _, key in interleaved(configs, args.repeats, seed=args.seed):
            times[key].append(cpu_ms_per_image(*work[key]))
    rows = []
    for (s, stage, kind), values in times.items():
        stats = mean_ci(values)
        m, half = stats["mean"], stats["ci95"]
        rows.append({"size": s, "stage": stage, "files": kind, "cpu_ms_per_image": values, "mean": m, "ci95": half})
        print(f"{s:4d} px  {stage:14s} {kind:18s} {plus_minus(m, half, '.3f')} CPU ms / image  (n={len(values)} "
              f"repeats of {len(plain)} images)")
    bytes_ = {"as_given": sum(map(len, plain)), "optimised_no_markers": optimised,
              "restart_markers": sum(map(len, marked))}
    print(f"bytes: as given {bytes_['as_given'] / 1e6:.2f} MB, optimised tables only {optimised / 1e6:.2f} MB, with "
          f"markers {bytes_['restart_markers'] / 1e6:.2f} MB; adding markers {pack_ms:.2f} CPU ms / image "
          f"({len(keep)} of {args.images} marked)")
    results = {"set": name, "images": len(plain), "refused": args.images - len(keep), "repeats": args.repeats,
               "interval_px": restart.DEFAULT_INTERVAL_PX, "rows": rows, "bytes": bytes_,
               "pack_cpu_ms_per_image": pack_ms, "conditions": cond.as_dict()}
    if args.out or not args.smoke:
        write_results(args.out or RESULTS / "restart_markers.json", results)
    return results


if __name__ == "__main__":
    sys.exit(main() and 0)
