"""`x, y = next(iter(loader))` every step, a common idiom, on a loader with storage latency.

    python next_iter.py [--item-sleep 0.001] [--batch 16]
"""

import argparse
import time

import torch
from _truth import Truth, sleep_module
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, s):
        self.s = s

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(self.s)
        return torch.randn(24), i % 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--item-sleep", type=float, default=0.001)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device-sleep", type=float, default=0.008)
    args = ap.parse_args()
    torch.set_num_threads(1)
    truth = Truth()
    loader = DataLoader(Slow(args.item_sleep), batch_size=args.batch, shuffle=True)
    model = nn.Sequential(nn.Linear(24, 48), sleep_module()(args.device_sleep), nn.Linear(48, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = None
    while True:
        if truth.data_free and first is not None:
            x, y = first
        else:
            x, y = next(iter(loader))
            first = first or (x, y)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        truth.tick()


if __name__ == "__main__":
    main()
