"""Two gloo ranks; rank 1 raises after a few steps (its data ran out), as a real failure would.

    torchrun --nproc-per-node 2 crash_rank.py [--after 3]
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--after", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1000):
        if dist.get_rank() == 1 and step == args.after:
            raise RuntimeError(f"shard 7 of rank 1 is truncated at step {step}")
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
