"""DDP over gloo with gradient accumulation: no_sync() on all micro-batches but the last.

    torchrun --nproc-per-node 2 ddp_accum.py [--accum 4] [--width 1024] [--link-sleep 0]

``--link-sleep S`` stands for a slow link: a comm hook that waits S seconds before the
all-reduce, so the exposed communication per step is known by construction.
"""

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
from _truth import Truth, sleep_module
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--width", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--device-sleep", type=float, default=0.004)
    ap.add_argument("--link-sleep", type=float, default=0.0, help="seconds a gradient exchange waits (a slow link)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    truth = Truth()
    torch.manual_seed(dist.get_rank())
    layers = [nn.Linear(args.width, args.width) for _ in range(args.layers)]
    model = DDP(nn.Sequential(layers[0], sleep_module()(args.device_sleep), *layers[1:]))
    if truth.comm_off:
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
        model.register_comm_hook(None, noop_hook)
    elif args.link_sleep:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def slow_link(state, bucket):
            time.sleep(args.link_sleep)
            return allreduce_hook(state, bucket)

        model.register_comm_hook(dist.group.WORLD, slow_link)
    data = [(torch.randn(4, args.width), torch.randn(4, args.width)) for _ in range(16)]
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    step = 0
    while True:
        for micro in range(args.accum):
            x, y = data[(step * args.accum + micro) % len(data)]
            last = micro == args.accum - 1
            with contextlib.nullcontext() if last else model.no_sync():
                loss = nn.functional.mse_loss(model(x), y) / args.accum
                loss.backward()
        opt.step()
        opt.zero_grad()
        step += 1
        truth.tick()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
