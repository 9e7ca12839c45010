"""JPEG decoders, resizers and DALI's CPU pipeline: CPU time per random-resized crop from JPEG bytes.

One process, one thread (``torch.set_num_threads(1)``, ``cv2.setNumThreads(1)``),
files read into memory first: for every pip-installable route, the CPU time
(``time.process_time``: all threads of the process) to turn the JPEG bytes into a
``size`` x ``size`` RGB uint8 random-resized crop, with the SAME box for every
route (``random_resized_box`` drawn from ``example_rng(0, 0, i)`` for the i-th
file). The routes:

- ``simplejpeg full``: simplejpeg full decode, crop view, torch's uint8 antialiased bilinear resize;
- ``simplejpeg DCT-scaled``: hasten's previous path (simplejpeg at ``dct_scale``, the box, fractional in
  pixels of that scale, resized from it: ``_resize_box``);
- ``Pillow draft``: ``Image.open`` + ``draft`` (DCT scaling) + ``resize(box=...)`` BILINEAR;
- ``Pillow full``: full decode + ``resize(box=...)`` BILINEAR (torchvision's RandomResizedCrop on a PIL image);
- ``cv2 full`` / ``cv2 reduced``: ``cv2.imdecode`` at full size or ``IMREAD_REDUCED_COLOR_{2,4,8}`` where the
  box keeps the output's pixels, then ``cv2.resize`` (INTER_AREA or INTER_LINEAR), BGR -> RGB;
- ``PyTurboJPEG scaled``: ``decode(scaling_factor=...)`` + torch resize; ``PyTurboJPEG crop``: its lossless
  ``crop()`` transform, then a (scaled) decode of the cropped JPEG + torch resize;
- ``hasten region``: ``hasten.decode.turbojpeg.decode_region`` (libjpeg-turbo 3 partial decode, rows and columns
  of the box only, at the DCT scale) + torch resize (or ``cv2.resize``): hasten's new path; and
  ``hasten fused_crop``: the public function (header read, box draw, copy out included), as the working tree
  has it (the JSON records whether hasten's decode files differed from the commit);
- ``DALI``: its CPU-only pipeline (``device_id=None``), fed the same bytes by ``external_source``, run
  synchronously (one batch per ``run()``, so the CPU time is that batch's): ``decoders.image`` (full decode
  only), ``decoders.image_slice`` over the same boxes + ``resize``, ``decoders.image_random_crop`` (its own
  boxes, same distribution) + ``resize``, at 1 and 2 threads (images per CPU-second of all its threads).

Then the resize step alone on the same crops (decoded in full beforehand): torch
``interpolate(antialias=True)`` on uint8, ``cv2.resize`` INTER_AREA / INTER_LINEAR,
Pillow BILINEAR, in ms per image. Every route's output is compared with ``Pillow
full`` (the reference resampling) as a mean absolute difference in levels of 255.

Routes whose package is missing are skipped and named; only hasten's required
dependencies are needed. DALI (a benchmark-only extra) goes into a folder of its own:
``pip install --target DIR nvidia-dali-cuda120==2.4.0``, then ``pip install --target DIR
optree astunparse gast nvtx makefun libcst nvidia-libnvcomp-cu12``, run with
``PYTHONPATH=<checkout>:DIR``. Timed configurations run in a fresh shuffled order each
repeat (``hasten.timing.interleaved``).

    python benchmarks/jpeg_decoders.py [--images 300] [--repeats 3] [--sizes 224,128] [--folder DIR] [--smoke]

The images: the ImageNet-like set of ``benchmarks/imagenet_pipeline.py`` (made
once under ``$HASTEN_CACHE`` or ``~/.cache/hasten`` if missing), or the JPEGs under
``--folder``. Writes ``benchmarks/results/jpeg_decoders.json`` (``--out``).

This file is the command; its parts beside it: ``_jpeg_decoders_routes.py`` (the decoders' routes
and the resizes) and ``_jpeg_decoders_dali.py`` (DALI's CPU pipelines).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hasten.cores import usable_cores
from hasten.decode import turbojpeg as hturbo
from hasten.decode.header import read_header
from hasten.rundir import write_json
from hasten.stream import fused_crop as fc
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, hardware_label, mean_ci, plus_minus
from _jpeg_decoders_dali import dali_pipelines, time_dali
from _jpeg_decoders_routes import make_routes, optional, pillow_resize, torch_resize

PACKAGES = ("torch", "numpy", "pillow", "simplejpeg", "turbojpeg", "opencv-python-headless", "opencv-python",
            "pyturbojpeg", "nvidia-dali-cuda120", "nvidia-nvimgcodec-cu12")


def versions() -> dict:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            pass
    from PIL import features

    out["pillow libjpeg-turbo"] = features.version("libjpeg_turbo")
    cv2 = optional("cv2")
    if cv2 is not None:
        jpeg = [ln.strip() for ln in cv2.getBuildInformation().splitlines() if ln.strip().startswith("JPEG:")]
        out["opencv libjpeg"] = jpeg[0].split(":", 1)[1].strip() if jpeg else "?"
    out["hasten libturbojpeg"] = Path(hturbo.library_path()).name if hturbo.available() else None
    out["python"] = sys.version.split()[0]
    return out


def load_sample(args) -> tuple[list[bytes], list[str], str]:
    if args.folder:
        folder = Path(args.folder).expanduser()
        paths = sorted(str(p) for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
        label = folder.name
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _imagenet_pipeline_data import image_files, make_dataset

        cache = Path(os.environ.get("HASTEN_CACHE") or Path.home() / ".cache" / "hasten").expanduser()
        folder, _ = make_dataset(cache, 20_000, 100, 10, 0, procs=min(2, usable_cores()))
        paths = [p for p, _ in image_files(folder)]
        label = folder.parent.name
    if not paths:
        raise SystemExit(f"no JPEG files under {args.folder}")
    rng = np.random.default_rng(args.seed)
    pick = sorted(rng.choice(len(paths), min(args.images, len(paths)), replace=False))
    return [Path(paths[i]).read_bytes() for i in pick], [paths[i] for i in pick], label


def _modified() -> list[str] | None:
    """hasten's decode files that differ from the recorded commit (the fused_crop row times
    the working tree), or None without git."""
    import subprocess

    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", "hasten/stream/fused_crop.py",
                              "hasten/decode/"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent.parent, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line[3:] for line in out.stdout.splitlines()] if out.returncode == 0 else None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=300, help="files in the seeded sample")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="224,128")
    ap.add_argument("--dali-threads", default="1,2")
    ap.add_argument("--dali-batch", type=int, default=50)
    ap.add_argument("--folder", default=None, help="JPEGs to use instead of the generated ImageNet-like set")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help=f"JSON path (default {RESULTS / 'jpeg_decoders.json'})")
    ap.add_argument("--smoke", action="store_true", help="a few images, one repeat (checks that it runs)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.images, args.repeats, args.dali_batch = min(args.images, 8), 1, 4
    torch.set_num_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    datas, paths, data_label = load_sample(args)
    hws = [(h.height, h.width) for h in map(read_header, datas)]
    boxes = [fc.random_resized_box(*hw, fc.example_rng(0, 0, i)) for i, hw in enumerate(hws)]
    routes, skipped = make_routes()
    batch = max(1, min(args.dali_batch, len(datas)))
    dali, why_not = dali_pipelines(datas, boxes, sizes, [int(t) for t in args.dali_threads.split(",")], batch)
    if why_not:
        skipped["DALI"] = why_not
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", file=sys.stderr)

    # Reference outputs and each route's difference from them (untimed).
    check = range(min(len(datas), 50))
    diffs: dict[str, dict[int, float]] = {}
    for size in sizes:
        ref = [routes["Pillow full"](datas[i], hws[i], boxes[i], size).astype(np.int16) for i in check]
        for name, fn_ in routes.items():
            d = [np.abs(fn_(datas[i], hws[i], boxes[i], size).astype(np.int16) - ref[k]).mean()
                 for k, i in enumerate(check)]
            diffs.setdefault(name, {})[str(size)] = float(np.mean(d))
    fused_name = "hasten fused_crop (public function)"
    if hturbo.available():
        routes[fused_name] = None  # timed below through fused_crop itself

    # The resize step alone: crops of full decodes, contiguous, made beforehand.
    cv2 = optional("cv2")
    crops = []
    for d, b in zip(datas, boxes):
        with Image.open(io.BytesIO(d)) as img:
            a = np.asarray(img.convert("RGB"))
        crops.append(np.ascontiguousarray(a[b.top:b.top + b.height, b.left:b.left + b.width]))
    resizers = {"torch interpolate antialias (uint8)": torch_resize, "Pillow BILINEAR": pillow_resize}
    if cv2 is not None:
        resizers["cv2 INTER_AREA"] = lambda c, s: cv2.resize(c, (s, s), interpolation=cv2.INTER_AREA)
        resizers["cv2 INTER_LINEAR"] = lambda c, s: cv2.resize(c, (s, s), interpolation=cv2.INTER_LINEAR)

    floors = {"Pillow": lambda d: np.asarray(Image.open(io.BytesIO(d)).convert("RGB"))}
    if optional("simplejpeg") is not None:
        floors["simplejpeg"] = lambda d: optional("simplejpeg").decode_jpeg(d, colorspace="RGB")
    if hturbo.available():
        floors["hasten decode_region, whole image"] = lambda d: hturbo.decode_region(d)[0]

    configs = [("route", n, s) for n in routes for s in sizes]
    configs += [("floor", n, None) for n in floors]
    configs += [("dali", n, s) for n, by_size in dali.items() for s in by_size]
    configs += [("resize", n, s) for n in resizers for s in sizes]
    samples: dict[tuple, list] = {(k, n, s): [] for k, n, s in configs}
    wall: dict[tuple, list] = {(k, n, s): [] for k, n, s in configs}
    order = []
    t_start = time.perf_counter()
    todo = list(interleaved(configs, args.repeats, seed=args.seed))
    with MeasuredConditions("cpu", seconds=0.2 if args.smoke else 1.0) as cond:
        for j, (r, (kind, name, size)) in enumerate(todo):
            order.append(f"{name} @ {size}")
            if kind == "dali":
                pipe = dali[name][size]
                per_cpu, per_wall, _ = time_dali(pipe, len(datas), batch)
                samples[(kind, name, size)].append(per_cpu)
                wall[(kind, name, size)].append(per_wall)
            elif kind == "floor":
                fn_ = floors[name]
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for d in datas:
                    fn_(d)
                samples[(kind, name, size)].append(len(datas) / (time.process_time() - cpu0))
                wall[(kind, name, size)].append(len(datas) / (time.perf_counter() - wall0))
            elif kind == "resize":
                fn_ = resizers[name]
                cpu0 = time.process_time()
                for c in crops:
                    fn_(c, size)
                samples[(kind, name, size)].append((time.process_time() - cpu0) * 1e3 / len(crops))
            else:
                fn_ = routes[name]
                cpu0, wall0 = time.process_time(), time.perf_counter()
                if fn_ is None:
                    for i, d in enumerate(datas):
                        fc.fused_crop(d, "x", size, rng=fc.example_rng(0, 0, i), flip=False)
                else:
                    for d, hw, b in zip(datas, hws, boxes):
                        fn_(d, hw, b, size)
                samples[(kind, name, size)].append(len(datas) / (time.process_time() - cpu0))
                wall[(kind, name, size)].append(len(datas) / (time.perf_counter() - wall0))
            if not args.smoke and (j + 1) % 10 == 0:
                el = time.perf_counter() - t_start
                print(f"{j + 1}/{len(todo)} timed, {el:.0f} s, about {el / (j + 1) * (len(todo) - j - 1):.0f} s left",
                      file=sys.stderr)

    decoders, dali_rows, resize_rows, floor_rows = {}, {}, {}, {}
    for (kind, name, size), v in samples.items():
        if kind == "route":
            row = decoders.setdefault(name, {"images_per_cpu_s": {}, "images_per_wall_s": {},
                                             "mean_abs_diff_vs_pillow_full": diffs.get(name, {})})
            row["images_per_cpu_s"][str(size)] = mean_ci(v)
            row["images_per_wall_s"][str(size)] = mean_ci(wall[(kind, name, size)])
        elif kind == "floor":
            floor_rows[name] = {"images_per_cpu_s": mean_ci(v),
                                "images_per_wall_s": mean_ci(wall[(kind, name, size)])}
        elif kind == "dali":
            row = dali_rows.setdefault(name, {"images_per_cpu_s": {}, "images_per_wall_s": {}})
            key = "full" if size is None else str(size)
            row["images_per_cpu_s"][key] = mean_ci(v)
            row["images_per_wall_s"][key] = mean_ci(wall[(kind, name, size)])
        else:
            resize_rows.setdefault(name, {})[str(size)] = mean_ci(v)
    result = {
        "benchmark": "jpeg_decoders",
        "hardware": hardware_label(cond.as_dict()["environment"]),
        "data": {"set": data_label, "images": len(datas), "seed": args.seed,
                 "mean_jpeg_kb": round(sum(map(len, datas)) / len(datas) / 1e3, 1),
                 "mean_hw": [round(float(np.mean([h for h, _ in hws]))), round(float(np.mean([w for _, w in hws])))],
                 "mean_box_area_fraction": round(float(np.mean([b.height * b.width / (h * w)
                                                                for b, (h, w) in zip(boxes, hws)])), 3)},
        "sizes": sizes, "repeats": args.repeats, "threads": 1, "dali_batch": batch,
        "decoders": decoders, "full_decode_only": floor_rows, "dali": dali_rows, "resize_ms_per_image": resize_rows,
        "skipped": skipped, "versions": versions(), "hasten_decode_files_modified": _modified(),
        "run_order": order, "smoke": args.smoke,
        "conditions": cond.as_dict(),
    }
    cache = Path(os.environ.get("HASTEN_CACHE") or Path.home() / ".cache" / "hasten").expanduser()
    out_path = Path(args.out) if args.out else (cache / "jpeg_decoders_smoke.json" if args.smoke
                                                 else RESULTS / "jpeg_decoders.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(out_path, result)
    print(markdown(result))
    print(cond.summary())
    print(f"wrote {out_path}")
    return result


def _ms(s: dict) -> str:
    return plus_minus(s["mean"], s["std"], ".0f")


def markdown(r: dict) -> str:
    sizes = [str(s) for s in r["sizes"]]
    lines = ["| route (one thread) | " + " | ".join(f"images/CPU-s at {s}" for s in sizes)
             + " | " + " | ".join(f"mean abs diff vs Pillow full at {s}" for s in sizes) + " |",
             "|---" * (1 + 2 * len(sizes)) + "|"]
    order = sorted(r["decoders"], key=lambda n: -r["decoders"][n]["images_per_cpu_s"][sizes[0]]["mean"])
    for n in order:
        row = r["decoders"][n]
        d = row["mean_abs_diff_vs_pillow_full"]
        lines.append(f"| {n} | " + " | ".join(_ms(row["images_per_cpu_s"][s]) for s in sizes) + " | "
                     + " | ".join(f"{d[s]:.2f}" if s in d else "-" for s in sizes
                                  ) + " |")
    lines += ["", "| full decode only, no crop (one thread) | images/CPU-s |", "|---|---|"]
    for n, row in r["full_decode_only"].items():
        lines.append(f"| {n} | {_ms(row['images_per_cpu_s'])} |")
    if r["dali"]:
        lines += ["", "| DALI CPU pipeline (synchronous) | " + " | ".join(f"images/CPU-s at {s}" for s in sizes)
                  + " | images/CPU-s (full decode) |", "|---" * (2 + len(sizes)) + "|"]
        for n, row in r["dali"].items():
            c = row["images_per_cpu_s"]
            lines.append(f"| {n} | " + " | ".join(_ms(c[s]) if s in c else "-" for s in sizes) + " | "
                         + (_ms(c["full"]) if "full" in c else "-") + " |")
    lines += ["", "| resize alone (one thread) | " + " | ".join(f"ms/image to {s}" for s in sizes) + " |",
              "|---" * (1 + len(sizes)) + "|"]
    for n, row in r["resize_ms_per_image"].items():
        lines.append(f"| {n} | " + " | ".join(plus_minus(row[s]["mean"], row[s]["std"], ".3f") for s in sizes)
                     + " |")
    if r["skipped"]:
        lines += [""] + [f"skipped {k}: {v}" for k, v in r["skipped"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
