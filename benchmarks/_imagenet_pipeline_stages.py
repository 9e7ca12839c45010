"""Where hasten's path spends its CPU in benchmarks/imagenet_pipeline.py: each stage's CPU ms per
image (``stage_breakdown``), and the decode's floor (``decode_floor``: the entropy decoding of the
rows down to the crop box's last, which any libjpeg-turbo decode of the crop spends)."""

from __future__ import annotations

import time

from hasten.decode import backends
from hasten.stream.shard_store import ShardFiles


def stage_breakdown(shards: ShardFiles, size: int, images: int = 768, seed: int = 0) -> dict:
    """CPU ms per image of each stage of hasten's path, in one process (one torch thread):
    the loading process's part (scan the shard's tar headers, pack a chunk's records for
    a worker) and a decode worker's (unpack, read the image's bytes from the shard file,
    header and crop box, decode, resize into the batch, flip; batches reused as the loader
    reuses them once the consumer lets go). Measured by wrapping the
    functions the loader calls, so the split follows the code; "other" is the rest of
    ``decode_chunk``."""
    from hasten.decode import turbojpeg
    from hasten.stream import chunk_decode, shared_buffers, tar_members
    from hasten.stream import fused_crop as fc

    spent: dict[str, float] = {}

    def timed(label, fn):
        def wrapper(*a, **kw):
            t = time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                spent[label] = spent.get(label, 0.0) + time.process_time() - t
        return wrapper

    originals = [(turbojpeg, "decode_region"), (fc, "resize_whole"), (fc, "_finish"), (backends, "decode_simplejpeg"),
                 (backends, "decode_pillow"), (tar_members, "read_member")]
    saved = [getattr(o, a) for o, a in originals]
    labels = ["decode (region, libturbojpeg)", "resize (into the batch)", "flip (in the batch)",
              "decode (simplejpeg/Pillow)", "decode (simplejpeg/Pillow)", "read the image's bytes (pread)"]
    records, i, t_scan = [], 0, 0.0
    while len(records) < images and i < len(shards):
        t = time.process_time()
        got = tar_members.scan_shard(shards.paths[i], shards.names[i])  # as the loader reads local shards
        t_scan += time.process_time() - t
        records += got
        i += 1
    parsed = len(records)
    records = records[:images]
    for k, r in enumerate(records):
        r.key = k
    chunks = [list(enumerate(records[j:j + 256], start=j)) for j in range(0, len(records), 256)]
    pool = shared_buffers.BufferPool()  # as the loader packs: records only, images stay in the shard file
    batches = shared_buffers.BatchPool((256, size, size, 3), cap=2)  # and decodes into reused batches
    t_pack = t_total = 0.0
    try:
        for (o, a), label in zip(originals, labels):
            setattr(o, a, timed(label, getattr(o, a)))
        for c in chunks:
            t = time.process_time()
            packed = chunk_decode.pack_chunk(c, pool, batches)
            t_pack += time.process_time() - t
            t = time.process_time()
            chunk_decode.decode_chunk(packed, image_size=size, seed=seed, epoch=0, crop="random-resized")
            t_total += time.process_time() - t
            pool.release_oldest()  # the chunk is decoded: its buffers serve the next one
            batches.arrived(0)
    finally:
        for (o, a), fn in zip(originals, saved):
            setattr(o, a, fn)
    n = len(records)
    floor = decode_floor(records, size, seed) if turbojpeg.available() else None
    per = {"loading process: scan the shard's tar headers": t_scan / parsed,
           "loading process: pack records for a worker": t_pack / n}
    per.update({f"worker: {k}": v / n for k, v in spent.items()})
    per["worker: other (unpack, header, crop box, generator, bookkeeping)"] = (t_total - sum(spent.values())) / n
    return {"images": n, "image_size": size, "ms_per_image": {k: round(v * 1e3, 4) for k, v in per.items()},
            "total_ms_per_image": round(sum(per.values()) * 1e3, 4),
            "decode_floor_ms_per_image": floor and round(floor * 1e3, 4),
            "decoder": "libturbojpeg partial decode" if turbojpeg.available() else
            ("simplejpeg" if backends.simplejpeg is not None else "pillow")}


def decode_floor(records, size: int, seed: int) -> float:
    """CPU seconds per image that any libjpeg-turbo decode of the crop spends, whatever its
    scale and resize: the entropy decoding of every row down to the box's last, all columns
    (a baseline JPEG's scan is one Huffman-coded stream, read in order: rows above the box
    are decoded to be skipped, columns beside it to reach the next row), with the per-image
    set-up (header, tables). Measured as the decode of the box's last row alone at 1/8 scale
    (an IDCT of the DC coefficient only), for the boxes ``decode_chunk`` draws."""
    from hasten.decode import turbojpeg
    from hasten.decode.header import read_header
    from hasten.stream.fused_crop import ExampleRngs, random_resized_box
    from hasten.stream.tar_members import with_bytes

    rngs, jobs = ExampleRngs(), []
    for r in records:
        data = with_bytes(r).data
        header = read_header(data, r.name)
        box = random_resized_box(header.height, header.width, rngs(seed, 0, r.key))
        last = min(turbojpeg.scaled(header.height, 1, 8) - 1, (box.top + box.height - 1) // 8)
        jobs.append((data, last))
    t = time.process_time()
    for data, last in jobs:
        turbojpeg.decode_region(data, (last, 0, 1, 1), (1, 8))
    return (time.process_time() - t) / max(1, len(jobs))
