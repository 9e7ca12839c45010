"""``hasten train``'s two loaders on 32 px CIFAR-10-JPEG: images/s and CPU-seconds per image.

The same training step (the recipe's model, SGD, cross-entropy) fed by each
``TrainInput`` of ``hasten.recipes.train_input``:

- ``device``: the decoded set held in memory (``device_input``, from the archive);
- ``stream-32``: tar shards (``hasten data pack``), decoded per epoch, at the
  images' own 32 px (the default since issue 26), ``--workers`` 0 and 1;
- ``stream-224``: the same shards at 224 px, what ``--loader stream`` did on
  CIFAR-10 shards before without ``--image-size`` (upsampled 7x per side).

Each configuration runs in a fresh process: a few warm-up steps, then ``--steps``
timed steps. CPU seconds count that process and its decode workers (reaped by it
at exit, measured by this parent), from the start of the timed steps; the
workers' share of the warm-up steps and the process's exit are included (an
overestimate of a fixed cost per run: keep ``--steps`` large enough to amortise it). Configurations are interleaved in a fresh shuffled order per
repeat (``hasten.timing.interleaved``); the machine's load and matmul rate are
recorded (``hasten.environment.MeasuredConditions``). Prints a table and writes
``benchmarks/results/stream_small_images.json`` (each run as it finishes; a
rerun skips finished runs).

    python benchmarks/stream_small_images.py --shards DIR [--data ARCHIVE] [--repeats 3] [--steps 30]

``DIR`` holds ``hasten data pack ARCHIVE DIR``; ``--data`` defaults to ``$HASTEN_DATA`` if
set, else ``../shared/data/cifar10-jpeg.tar.xz`` beside the checkout (``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS, MeasuredConditions, add_data_argument, hardware_label, mean, sample_std

OUT = RESULTS / "stream_small_images.json"
# name -> (loader, image size (None: the default), workers)
CONFIGS = {
    "device": ("device", None, 0),
    "stream-32-w0": ("stream", None, 0),
    "stream-32-w1": ("stream", None, 1),
    "stream-224-w0": ("stream", 224, 0),
}


def child(args) -> None:
    """One configuration, timed from inside: prints one JSON line."""
    import torch

    from hasten.models.resnet import build_model
    from hasten.recipes.step import optimizer_step
    from hasten.recipes.train import TrainConfig
    from hasten.recipes.train_input import device_input, stream_input

    loader, size, workers = CONFIGS[args.child]
    data = args.shards if loader == "stream" else args.data
    cfg = TrainConfig(data=data, loader=loader, model=args.model, width=args.width, image_size=size,
                      workers=workers, batch_size=args.batch, device="cpu")
    inputs = (stream_input(cfg, "cpu", 0, 1, args.batch) if loader == "stream"
              else device_input(cfg, None, "cpu", 0, 1, args.batch))
    model = build_model(cfg.model, inputs.num_classes, inputs.image_size, cfg.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = inputs.epoch_batches(0)
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            t0, own0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        x, y = next(batches)
        optimizer_step(torch.nn.functional.cross_entropy(model(x), y), opt)
    wall = time.perf_counter() - t0
    own = resource.getrusage(resource.RUSAGE_SELF)
    batches.close()  # stops the decode workers; the parent counts their CPU at exit
    print(json.dumps({"wall_s": wall, "images": args.steps * args.batch, "image_size": inputs.image_size,
                      "cpu_before_s": own0.ru_utime + own0.ru_stime,
                      "cpu_self_s": own.ru_utime + own.ru_stime - own0.ru_utime - own0.ru_stime}))


def run_one(name: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--shards", args.shards, "--data", args.data,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
           "--model", args.model, "--width", str(args.width)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = json.loads(out.strip().splitlines()[-1])
    tree = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    cpu = tree - r["cpu_before_s"]  # the child's CPU before the timed steps (imports, setup) left out
    return {"config": name, "images_per_s": r["images"] / r["wall_s"], "cpu_s_per_image": cpu / r["images"],
            "cpu_s_per_image_main": r["cpu_self_s"] / r["images"], **r}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", required=True)
    add_data_argument(p)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--model", default="resnet10")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    from hasten.rundir import write_json
    from hasten.timing import interleaved

    out = Path(args.out)
    settings = {k: getattr(args, k) for k in ("repeats", "steps", "warmup", "batch", "model", "width")}
    done = json.loads(out.read_text()) if out.exists() else {}
    runs = done.get("runs", []) if done.get("settings") == settings else []
    plan = list(interleaved(args.configs.split(","), args.repeats))
    with MeasuredConditions("cpu") as cond:
        for i, (rep, name) in enumerate(plan):
            if any(r["config"] == name and r["repeat"] == rep for r in runs):
                continue
            runs.append({"repeat": rep, **run_one(name, args)})
            r = runs[-1]
            print(f"[{i + 1}/{len(plan)}] {name:14s} {r['images_per_s']:7.0f} images/s  "
                  f"{r['cpu_s_per_image'] * 1e3:6.2f} CPU-ms/image", flush=True)
            write_json(out, {"settings": settings, "runs": runs})
    summary = {}
    for name in args.configs.split(","):
        rates = [r["images_per_s"] for r in runs if r["config"] == name]
        cpus = [r["cpu_s_per_image"] for r in runs if r["config"] == name]
        cpu_sd = sample_std(cpus)
        summary[name] = {"n": len(rates), "images_per_s_mean": mean(rates), "images_per_s_sd": sample_std(rates),
                         "cpu_ms_per_image_mean": 1e3 * mean(cpus),
                         "cpu_ms_per_image_sd": 1e3 * cpu_sd if cpu_sd is not None else None}
        s = summary[name]
        spread = f"+- {s['images_per_s_sd']:.0f}" if s["n"] > 1 else "(n = 1)"
        print(f"{name:14s} n={s['n']}  {s['images_per_s_mean']:7.0f} {spread} images/s  "
              f"{s['cpu_ms_per_image_mean']:.2f} CPU-ms/image")
    print(cond.summary())
    conditions = cond.as_dict()
    write_json(out, {"settings": settings, "runs": runs, "summary": summary,
                     "hardware": hardware_label(conditions["environment"]), "conditions": conditions})


if __name__ == "__main__":
    main()
