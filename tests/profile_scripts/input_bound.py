"""An input-bound plain-PyTorch loop: R is known by construction.

Each example costs ``--item-sleep`` seconds of storage latency plus ``--item-work``
seconds of busy CPU decoding; each step costs ``--step-sleep`` seconds of device
time (slept) plus ``--step-work`` CPU seconds on top of a tiny model. With num_workers=0:
R = batch * (item_sleep + item_work) / (step_sleep + step_work).
Sleep-only or CPU-only costs keep R exact on a loaded machine (sleeps do not
stretch; CPU work on both sides stretches alike).
"""

import argparse
import sys
import time

import torch
from _truth import Truth, burn
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __init__(self, n, item_sleep, item_work):
        self.n, self.item_sleep, self.item_work = n, item_sleep, item_work

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.item_sleep)
        burn(self.item_work)
        return torch.full((32,), float(i % 7)), i % 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--item-sleep", type=float, default=0.002)
    ap.add_argument("--item-work", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--step-sleep", type=float, default=0.008)
    ap.add_argument("--step-work", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--crash-after", type=int, default=None, help="raise after this many steps")
    ap.add_argument("--exit-after", type=int, default=None, help="exit with code 3 after this many steps")
    args = ap.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(SlowDataset(4096, args.item_sleep, args.item_work), batch_size=args.batch,
                        shuffle=True, num_workers=args.workers)
    model = nn.Linear(32, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    truth = Truth()
    step = 0
    first = None
    for _ in range(args.epochs):
        for x, y in loader:
            while truth.data_free:  # the truth harness's "data free" run: one batch, never the loader again
                first = first or (x, y)
                x, y = first
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                time.sleep(args.step_sleep)
                burn(args.step_work)
                truth.tick()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(args.step_sleep)  # the accelerator's share of the step
            burn(args.step_work)
            step += 1
            truth.tick()
            if args.crash_after is not None and step >= args.crash_after:
                raise RuntimeError("constructed crash")
            if args.exit_after is not None and step >= args.exit_after:
                sys.exit(3)


if __name__ == "__main__":
    main()
