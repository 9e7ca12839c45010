"""A loop without a DataLoader that sleeps between the optimizer's step and the next forward (logging,
a checkpoint write): that time is neither data nor compute, and must be named, never called data.

    python sleep_between.py [--pause 0.03] [--fetch-sleep 0.0] [--device-sleep 0.03]
"""

import argparse
import time

import torch
from _truth import Truth, sleep_module
from torch import nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pause", type=float, default=0.03, help="seconds slept after each step (the checkpoint)")
    ap.add_argument("--fetch-sleep", type=float, default=0.0, help="seconds get_batch() sleeps")
    ap.add_argument("--device-sleep", type=float, default=0.03)
    args = ap.parse_args()
    torch.set_num_threads(1)
    truth = Truth()
    data = torch.randn(4096, 32)

    def get_batch():
        time.sleep(args.fetch_sleep)
        ix = torch.randint(len(data), (16,))
        return data[ix], (data[ix, 0] > 0).long()

    model = nn.Sequential(nn.Linear(32, 32), sleep_module()(args.device_sleep), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    while True:
        x, y = get_batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.pause)  # PAUSE: writing a checkpoint
        truth.tick()


if __name__ == "__main__":
    main()
