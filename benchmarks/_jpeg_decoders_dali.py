"""DALI's CPU-only pipeline for ``jpeg_decoders.py``: ``decoders.image`` (full decode only),
``decoders.image_slice`` over the benchmark's boxes and ``decoders.image_random_crop`` (its own boxes,
the same distribution), each + ``resize``, fed the same bytes by ``external_source``, run synchronously
(``time_dali``: images per CPU-second of all DALI's threads).

Changes the training math: no (measurement only).
"""

from __future__ import annotations

import time

import numpy as np


def dali_pipelines(datas, boxes, sizes, threads_list, batch: int) -> tuple[dict, str | None]:
    """{name: {size (None: no resize): pipeline}}, built and warmed, or ({}, why not)."""
    try:
        from nvidia.dali import fn, pipeline_def, types
    except Exception as e:  # noqa: BLE001
        return {}, f"nvidia.dali is not importable ({type(e).__name__}: {e}); pip install nvidia-dali-cuda120"
    arrays = [np.frombuffer(d, np.uint8) for d in datas]
    anchors = [np.array([b.left, b.top], np.float32) for b in boxes]
    shapes = [np.array([b.width, b.height], np.float32) for b in boxes]
    n = len(arrays) - len(arrays) % batch

    def source(info):
        i = (info.iteration * batch) % n
        return arrays[i:i + batch], anchors[i:i + batch], shapes[i:i + batch]

    def jpegs_only(info):
        i = (info.iteration * batch) % n
        return arrays[i:i + batch]

    def build(kind, size, threads):
        # exec_pipelined/async off: run() decodes one batch and returns, so the process CPU time
        # around run() is that batch's (DALI's worker threads included), not a prefetched one's.
        @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, exec_pipelined=False,
                      exec_async=False, seed=1)
        def pipe():
            if kind == "slice":
                jpegs, anchor, shape = fn.external_source(source=source, num_outputs=3, batch=True,
                                                          batch_info=True)
            else:
                jpegs = fn.external_source(source=jpegs_only, batch=True, batch_info=True)
            if kind == "full":
                return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            if kind == "slice":
                img = fn.decoders.image_slice(jpegs, anchor, shape, axis_names="WH", normalized_anchor=False,
                                              normalized_shape=False, device="cpu", output_type=types.RGB)
            else:
                img = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                    random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                                    num_attempts=10)
            return fn.resize(img, resize_x=size, resize_y=size, antialias=True, interp_type=types.INTERP_LINEAR)

        p = pipe()
        p.build()
        p.run()  # warm-up: first-call allocations
        return p

    out: dict[str, dict] = {}
    try:
        for threads in threads_list:
            out[f"DALI decoders.image (full decode only), {threads} thr"] = {None: build("full", None, threads)}
            for kind, label in (("slice", "image_slice (same boxes)"), ("rrc", "image_random_crop (own boxes)")):
                out[f"DALI {label} + resize, {threads} thr"] = {s: build(kind, s, threads) for s in sizes}
    except Exception as e:  # noqa: BLE001 - e.g. a DALI that insists on a GPU
        return {}, f"DALI's CPU-only pipeline failed: {type(e).__name__}: {str(e).splitlines()[0]}"
    return out, None


def time_dali(pipe, images: int, batch: int) -> tuple[float, float, np.ndarray]:
    """(images per CPU-second, per wall second, last batch's first image)."""
    runs = max(1, images // batch)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(runs):
        out = pipe.run()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return runs * batch / cpu, runs * batch / wall, np.asarray(out[0][0])
