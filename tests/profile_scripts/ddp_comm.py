"""A communication-bound 2-rank gloo DDP job: large gradients, a tiny batch.

    torchrun --nproc-per-node 2 ddp_comm.py
"""

import argparse
import os

import torch
import torch.distributed as dist
from _truth import Truth
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    truth = Truth()
    model = DDP(nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)]))
    if truth.comm_off:
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
        model.register_comm_hook(None, noop_hook)
    data = TensorDataset(torch.randn(4096, args.width), torch.randn(4096, args.width))
    loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    for epoch in range(1000):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            truth.tick()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
