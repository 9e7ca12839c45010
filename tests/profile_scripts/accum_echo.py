"""An input-bound loop with gradient accumulation whose batches say what they hold.

    python accum_echo.py [--accum 2] [--batch 16] [--item-sleep 0.002] [--step-sleep 0.008]

No shuffling: batch i holds examples ``batch * i`` onward, and a micro-batch's first
example names it. Each example costs ``--item-sleep`` seconds of storage latency, each
micro-batch ``--step-sleep`` seconds of device time: R = batch * item_sleep / step_sleep.
With ``ACCUM_LOG=PATH`` the process appends, per optimizer step, the batch numbers of its
micro-batches to ``PATH.<HASTEN_PROFILE_APPLY or run>.<pid>`` (JSON lines, written at once:
``hasten profile`` ends the process after its steps).
"""

import argparse
import json
import os
import time

import torch
from _truth import sleep_module
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Numbered(Dataset):
    def __init__(self, n, item_sleep):
        self.n, self.item_sleep = n, item_sleep

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.item_sleep)
        return torch.full((32,), float(i)), i % 2


def step_log():
    path = os.environ.get("ACCUM_LOG")
    if not path:
        return None
    return open(f"{path}.{os.environ.get('HASTEN_PROFILE_APPLY') or 'run'}.{os.getpid()}", "w", buffering=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--item-sleep", type=float, default=0.002)
    ap.add_argument("--step-sleep", type=float, default=0.008)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(Numbered(4096, args.item_sleep), batch_size=args.batch)
    model = nn.Sequential(nn.Linear(32, 2), sleep_module()(args.step_sleep))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    log = step_log()
    while True:
        micro = []
        for i, (x, y) in enumerate(loader):
            micro.append(int(x[0, 0]) // args.batch)
            (nn.functional.cross_entropy(model(x), y) / args.accum).backward()
            if (i + 1) % args.accum == 0:
                opt.step()
                opt.zero_grad()
                if log:
                    log.write(json.dumps(micro) + "\n")
                micro = []


if __name__ == "__main__":
    main()
