"""A script that never ends: a slow set-up (no step for a while), then an endless loop over a
custom iterator (a generator, no DataLoader).

    python never_stops.py [--setup 3] [--make-sleep 0.004] [--device-sleep 0.012]
"""

import argparse
import time

import torch
from _truth import Truth, sleep_module
from torch import nn


def load_everything(seconds):
    time.sleep(seconds)  # reading a large index, building a vocabulary, ...


def stream(make_sleep):
    while True:
        time.sleep(make_sleep)
        yield torch.randn(16, 20), torch.randn(16, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--setup", type=float, default=3.0)
    ap.add_argument("--make-sleep", type=float, default=0.004)
    ap.add_argument("--device-sleep", type=float, default=0.012)
    ap.add_argument("--workers", type=int, default=0,
                    help="apply the fix `hasten profile` prints: the generator in a DataLoader with workers")
    args = ap.parse_args()
    torch.set_num_threads(1)
    truth = Truth()
    load_everything(0 if truth.out else args.setup)
    model = nn.Sequential(nn.Linear(20, 20), sleep_module()(args.device_sleep), nn.Linear(20, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = stream(args.make_sleep)
    if args.workers:
        class Batches(torch.utils.data.IterableDataset):
            def __iter__(self):
                return stream(args.make_sleep)

        batches = iter(torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=args.workers,
                                                   persistent_workers=True))
    first = next(batches)
    while True:
        x, y = first if truth.data_free else next(batches)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        truth.tick()


if __name__ == "__main__":
    main()
