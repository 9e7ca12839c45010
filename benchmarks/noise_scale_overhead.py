"""What measuring the gradient noise scale costs (``hasten train --noise-scale``): training
steps with and without the measurement, on one process (a probe every 10 steps: the
step's batch again as two micro-batches, ``micro_batch_sq_norms``) and on 2 gloo ranks
(every step: ``register_noise_scale_hook`` around DDP's all-reduce, the squared norm of
each bucket before and after, and one scalar all-reduce in ``update()``). Writes
benchmarks/results/noise_scale_overhead.json.

Paired and interleaved in the same processes: two identical models, one measured and one
not, train alternately in blocks of ``--block`` steps (``--blocks`` of each, the order
shuffled per pair of blocks), so drifting load on a shared machine hits both alike. The
model is ``hasten train``'s ResNet-10 (width 16) on random 16x16 images; timings do not
depend on the pixels. One thread per process.

    /tmp/bench-hi python benchmarks/noise_scale_overhead.py      # about 2 min on 2 cores
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hasten.distributed import data_parallel as dp
from hasten.harness.launch import spawn
from hasten.models.resnet import build_model
from hasten.optim.noise_scale import NoiseScale, micro_batch_sq_norms
from hasten.rundir import write_json

from _common import RESULTS, MeasuredConditions, hardware_label, mean, paired_ratios

PROBE_EVERY = 10  # as hasten.recipes.noise_probe.NOISE_PROBE_EVERY


def _blocks(rank, world, args):
    torch.set_num_threads(1)
    local = args.batch // world
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(local, 3, args.size, args.size, generator=g)
    y = torch.randint(0, 10, (local,), generator=g)
    variants = {}
    for measured in (False, True):
        torch.manual_seed(0)
        model = build_model("resnet10", 10, args.size, args.width)
        est = NoiseScale()
        net = dp.wrap_ddp(model, hook="native", noise_scale=est if measured and world > 1 else None,
                          noise_scale_batch=args.batch) if world > 1 else model
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, nesterov=True)
        variants[measured] = (model, net, opt, est)

    def step(measured, i):
        model, net, opt, est = variants[measured]
        if measured and world == 1 and i % PROBE_EVERY == 0:
            small, big = micro_batch_sq_norms(model, F.cross_entropy, list(zip(x.split(local // 2),
                                                                               y.split(local // 2))))
            est.update(small, big, local // 2, local)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if measured and world > 1:
            net.noise_scale.update()
        opt.step()

    for measured in (False, True):  # warm-up (DDP rebuilds its buckets after the first steps)
        for i in range(3):
            step(measured, i)
    rng = random.Random(0)  # the same order on every rank
    times, cpu = {False: [], True: []}, {False: [], True: []}
    for _ in range(args.blocks):
        order = [False, True]
        rng.shuffle(order)
        for measured in order:
            if world > 1:
                torch.distributed.barrier()
            t, c = time.perf_counter(), time.process_time()
            for i in range(args.block):
                step(measured, i)
            times[measured].append((time.perf_counter() - t) / args.block)
            cpu[measured].append((time.process_time() - c) / args.block)
    return {"off": times[False], "on": times[True], "cpu_off": cpu[False], "cpu_on": cpu[True],
            "b_simple": variants[True][3].b_simple,
            "measurements": variants[True][3].updates}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128, help="global batch")
    p.add_argument("--size", type=int, default=16, help="image side")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--block", type=int, default=PROBE_EVERY, help="steps per timed block")
    p.add_argument("--blocks", type=int, default=20, help="timed blocks per variant")
    p.add_argument("--out", default=str(RESULTS / "noise_scale_overhead.json"))
    args = p.parse_args(argv)
    rows = []
    with MeasuredConditions("cpu") as cond:
        for world in (1, 2):
            r = _blocks(0, 1, args) if world == 1 else spawn(_blocks, 2, (args,), timeout_s=120)[0]
            ratios = paired_ratios(r["on"], r["off"])  # per block: off and on ran back to back in it
            cpu_ratios = paired_ratios(r["cpu_on"], r["cpu_off"])
            rows.append({"world_size": world, "step_s_off": r["off"], "step_s_on": r["on"],
                         "cpu_s_off": r["cpu_off"], "cpu_s_on": r["cpu_on"], "cpu_ratio_by_block": cpu_ratios,
                         "cpu_median_ratio": statistics.median(cpu_ratios),
                         "ratio_by_block": ratios, "median_ratio": statistics.median(ratios),
                         "mean_ratio": mean(ratios), "measurements": r["measurements"]})
            print(f"world {world}: step {1000 * statistics.median(r['off']):.1f} ms off, "
                  f"{1000 * statistics.median(r['on']):.1f} ms on (medians of {args.blocks} blocks of {args.block}); "
                  f"ratio median {statistics.median(ratios):.3f}, blocks "
                  + " ".join(f"{x:.2f}" for x in ratios) + f"; CPU time (rank 0) ratio median "
                  f"{statistics.median(cpu_ratios):.3f}", flush=True)
    results = {"benchmark": "noise_scale_overhead", "args": {**vars(args), "out": "benchmarks/results/"
               + Path(args.out).name}, "rows": rows, "conditions": cond.as_dict(),
               "torch": torch.__version__}
    results["hardware"] = hardware_label(results["conditions"]["environment"])
    write_json(args.out, results)
    print(f"{results['hardware']}, torch {torch.__version__}; {cond.summary()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
