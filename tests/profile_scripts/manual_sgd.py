"""A loop that updates its weights by hand: no torch.optim optimizer, ``p -= lr * p.grad``.

    python manual_sgd.py [--item-sleep 0.002] [--batch 8] [--device-sleep 0.03]

Each batch costs ``batch * item_sleep`` seconds in the DataLoader, each forward
``device_sleep`` seconds of "accelerator" time; the accuracy is measured on each batch
under ``no_grad`` (an eval forward per step, as in the issue: two forwards a step). The
data share of a step is ``batch * item_sleep / (batch * item_sleep + 2 * device_sleep)``
by construction.
"""

import argparse
import time

import torch
from _truth import Truth, sleep_module
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __init__(self, n: int, item_sleep: float) -> None:
        self.n, self.item_sleep = n, item_sleep

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        time.sleep(self.item_sleep)
        return torch.full((16,), float(i % 5)), i % 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--item-sleep", type=float, default=0.002)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device-sleep", type=float, default=0.03)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(SlowDataset(4096, args.item_sleep), batch_size=args.batch, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), sleep_module()(args.device_sleep), nn.Linear(32, 2))
    truth = Truth()
    for _ in range(100):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= args.lr * p.grad
                    p.grad = None
                accuracy = (model(x).argmax(1) == y).float().mean()  # noqa: F841
            truth.tick()


if __name__ == "__main__":
    main()
