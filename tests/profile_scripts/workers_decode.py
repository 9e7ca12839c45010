"""An input-bound loop: DataLoader workers that decode (busy CPU per item), as JPEG decoding does.

    python workers_decode.py [--workers 2] [--item-work 0.004] [--batch 8]
"""

import argparse

import torch
from _truth import Truth, decode_dataset, sleep_module
from torch import nn
from torch.utils.data import DataLoader


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--item-work", type=float, default=0.004)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device-sleep", type=float, default=0.005)
    args = ap.parse_args()
    torch.set_num_threads(1)
    truth = Truth()
    loader = DataLoader(decode_dataset()(args.item_work), batch_size=args.batch, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    model = nn.Sequential(nn.Linear(32, 32), sleep_module()(args.device_sleep), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = None
    while True:
        for x, y in loader:
            if truth.data_free:
                if first is None:
                    first = (x, y)
                x, y = first
                while True:
                    nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                    opt.zero_grad()
                    truth.tick()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            truth.tick()


if __name__ == "__main__":
    main()
