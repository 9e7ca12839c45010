"""DataLoader workers that never make the step wait, but take its only core: the process pins itself
(and so its workers) to one core, the workers spend CPU decoding, and the step spends CPU too.

    python pinned_workers.py [--workers 2] [--item-work 0.006] [--batch 4] [--step-work 0.048]

On one core the step and the workers take turns: a step costs about the step's CPU plus a
batch's, though its data wait is small, and with the data made free it costs the step's CPU
alone. The data path's share of the step is batch * item_work / (batch * item_work + step_work)
by construction (a third with the defaults).
"""

import argparse
import os

import torch
from _truth import Truth, burn, decode_dataset
from torch import nn
from torch.utils.data import DataLoader


class Busy(nn.Module):
    """The step's own CPU: a forward that spends ``work`` seconds of CPU time."""

    def __init__(self, work):
        super().__init__()
        self.work = work

    def forward(self, x):
        burn(self.work)
        return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--item-work", type=float, default=0.006)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--step-work", type=float, default=0.048)
    args = ap.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, for this process and its workers
    torch.set_num_threads(1)
    truth = Truth()
    loader = DataLoader(decode_dataset()(args.item_work), batch_size=args.batch, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    model = nn.Sequential(nn.Linear(32, 32), Busy(args.step_work), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    while True:
        for x, y in loader:
            while True:  # with the data made free (the truth's counterfactual), the first batch for ever
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                truth.tick()
                if not truth.data_free:
                    break


if __name__ == "__main__":
    main()
