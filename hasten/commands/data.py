"""``hasten data``: prepare data sets for the streaming pipeline.

    hasten data pack SRC OUTDIR [--shard-size-mb 64] [--seed 0]

``pack`` writes an image folder or archive (``train/<class>/*``, ``test/<class>/*``)
as tar shards in the web-dataset layout plus ``index.json`` (``hasten.stream.pack``),
which ``hasten train --loader stream --data OUTDIR`` streams with a bounded amount
of memory (``hasten.stream.shards``).
"""

from __future__ import annotations

import argparse

from hasten.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    pack = sub.add_parser("pack", help="image folder or archive -> tar shards + index.json",
                          description="Pack an image folder or archive into size-bounded tar shards (web-dataset "
                          "layout: KEY.jpg + KEY.cls) with an index of counts and class names.")
    pack.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    pack.add_argument("src", help="image folder or archive with train/<class>/* and test/<class>/*")
    pack.add_argument("outdir", help="new or empty directory for the shards and index.json")
    pack.add_argument("--shard-size-mb", type=float, default=64.0, help="largest shard, MiB")
    pack.add_argument("--seed", type=int, default=0, help="seed of the order examples are written in")
    pack.add_argument("--no-shuffle", action="store_true", help="write in class/name order instead")


def run(args: argparse.Namespace) -> int:
    if args.action != "pack":
        raise ConfigError("hasten data needs an action: pack (see hasten data --help)")
    if not args.shard_size_mb > 0:
        raise ConfigError(f"--shard-size-mb must be > 0, got {args.shard_size_mb}")
    from hasten.stream.pack import pack

    index = pack(args.src, args.outdir, shard_bytes=max(4096, int(args.shard_size_mb * (1 << 20))), seed=args.seed,
                 shuffle=not args.no_shuffle)
    for split, entry in index["splits"].items():
        size = sum(s["bytes"] for s in entry["shards"])
        print(f"{split}: {entry['examples']} images in {len(entry['shards'])} shard(s), {size / 1e6:.1f} MB")
    print(f"{len(index['classes'])} classes; index {args.outdir}/index.json")
    return 0
