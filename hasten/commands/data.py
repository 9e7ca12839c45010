"""``hasten data``: prepare data sets for the streaming pipeline.

    hasten data pack SRC OUTDIR [--shard-size-mb 64] [--seed 0] [--max-side N [--quality 90]]
    hasten data jpeg [SRC] OUT [--quality 75]


``pack`` writes an image folder or archive (``train/<class>/*``, ``test/<class>/*``)
as tar shards in the web-dataset layout plus ``index.json`` (``hasten.stream.pack``),
which ``hasten train --loader stream --data OUTDIR`` streams with a bounded amount
of memory (``hasten.stream.shard_loader``). ``--max-side N`` stores JPEGs larger than N
re-encoded with their longer side N (``hasten.stream.presize``: changes the data).

``jpeg`` writes a data set (default: the canonical CIFAR-10, downloaded and
md5-checked) as JPEG files in the image-folder layout, as a directory or a .tar.xz
archive (``hasten.data.jpeg_export``): how the CIFAR-10-JPEG archive is made.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hasten import cli_types as t
from hasten.errors import ConfigError
from hasten.stream.presize import DEFAULT_QUALITY, MIN_SIDE


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    pack = sub.add_parser("pack", help="image folder or archive -> tar shards + index.json",
                          description="Pack an image folder or archive into size-bounded tar shards (web-dataset "
                          "layout: KEY.jpg + KEY.cls) with an index of counts and class names.")
    pack.add_argument("src", type=t.existing_path,
                      help="image folder or archive with train/<class>/* and test/<class>/*")
    pack.add_argument("outdir", type=t.new_or_empty_dir, help="new or empty directory for the shards and index.json")
    pack.add_argument("--shard-size-mb", type=t.positive_float, default=64.0, help="largest shard, MiB")
    pack.add_argument("--seed", type=t.seed, default=0, help="seed of the order examples are written in")
    pack.add_argument("--no-shuffle", action="store_true", help="write in class/name order instead")
    pack.add_argument("--max-side", type=t.int_range(MIN_SIDE), default=None, metavar="N",
                      help="store JPEGs whose longer side exceeds N re-encoded with longer side N, aspect kept "
                           "(FFCV's max_resolution; smaller stored images change what training sees); "
                           "default: bytes unchanged")
    pack.add_argument("--quality", type=t.int_range(1, 100), default=None,
                      help=f"JPEG quality of the re-encoded images with --max-side (default {DEFAULT_QUALITY})")
    jpeg = sub.add_parser("jpeg", help="data set -> JPEG image folder or archive (makes CIFAR-10-JPEG)",
                          description="Write a data set as JPEG files (train/<class>/NNNN.jpg, test/<class>/NNNN.jpg) "
                          "into a new directory or a .tar/.tar.gz/.tar.xz archive. With no SRC: the canonical "
                          "CIFAR-10, downloaded and md5-checked, which at the default quality gives CIFAR-10-JPEG.")
    jpeg.add_argument("paths", nargs="+", metavar="[SRC] OUT",
                      help="SRC: CIFAR-10 binary archive or folder, or an image folder/archive (default: download "
                           "canonical CIFAR-10); OUT: new directory or archive (e.g. cifar10-jpeg.tar.xz)")
    jpeg.add_argument("--quality", type=t.int_range(1, 100), default=75,
                      help="JPEG quality (Pillow), 4:2:0 chroma subsampling")


def run(args: argparse.Namespace) -> int:
    if args.action == "jpeg":
        return _jpeg(args)
    if args.action != "pack":
        raise ConfigError("hasten data needs an action: pack or jpeg (see hasten data --help)")
    if not args.shard_size_mb > 0:
        raise ConfigError(f"--shard-size-mb must be > 0, got {args.shard_size_mb}")
    if args.quality is not None and args.max_side is None:
        raise ConfigError("--quality sets the quality of images re-encoded by --max-side; give --max-side N too")
    from hasten.stream.pack import pack

    quality = DEFAULT_QUALITY if args.quality is None else args.quality
    index = pack(args.src, args.outdir, shard_bytes=max(4096, int(args.shard_size_mb * (1 << 20))), seed=args.seed,
                 shuffle=not args.no_shuffle, max_side=args.max_side, quality=quality)
    for split, entry in index["splits"].items():
        size = sum(s["bytes"] for s in entry["shards"])
        print(f"{split}: {entry['examples']} images in {len(entry['shards'])} shard(s), {size / 1e6:.1f} MB")
    if args.max_side is not None:
        sized, total = index["presize"], sum(e["examples"] for e in index["splits"].values())
        kept = f"; {len(sized['kept'])} larger kept as they are (see above)" if sized["kept"] else ""
        print(f"max side {args.max_side}: {sized['resized']} of {total} images resized (JPEG quality {quality}, "
              f"{sized['encoder']}){kept}; image bytes {sized['bytes_in'] / 1e6:.1f} MB -> "
              f"{sized['bytes_out'] / 1e6:.1f} MB")
    print(f"{len(index['classes'])} classes; index {args.outdir}/index.json")
    return 0


def _jpeg(args: argparse.Namespace) -> int:
    if len(args.paths) > 2:
        raise ConfigError(f"hasten data jpeg takes [SRC] OUT, got {len(args.paths)} paths")
    src, out = (None, args.paths[0]) if len(args.paths) == 1 else args.paths
    if not all(str(path).strip() for path in args.paths):
        raise ConfigError("SRC and OUT must not be empty")
    if src is not None and not Path(src).expanduser().exists():
        raise ConfigError(f"SRC {src!r} does not exist")
    from hasten.data import load_dataset
    from hasten.data.jpeg_export import tar_mode, write_jpeg_folder

    if tar_mode(Path(out)) is None and Path(out).suffix.lower() in (".zip", ".bz2", ".gz", ".xz", ".tbz2"):
        raise ConfigError(f"OUT {out!r}: name a directory or a .tar, .tar.gz or .tar.xz archive")
    dataset = load_dataset(src, cache=False)
    counts = write_jpeg_folder(dataset, out, quality=args.quality)
    print(f"wrote {out}: {counts['train']} train and {counts['test']} test images of {dataset.name} "
          f"({len(dataset.classes)} classes) as JPEG quality {args.quality}")
    return 0
