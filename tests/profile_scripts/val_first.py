"""A validation pass over a slow loader before training (a sanity check, as Lightning does), then
a training loop whose loader is fast and whose step is slow: compute-bound, whatever the first
loader looked like. Validation repeats every --val-every steps.

    python val_first.py [--val-sleep 0.01] [--device-sleep 0.03]
"""

import argparse
import time

import torch
from _truth import Truth, sleep_module
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SlowVal(Dataset):
    def __init__(self, s):
        self.s = s

    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(self.s)
        return torch.randn(16), i % 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--val-sleep", type=float, default=0.01)
    ap.add_argument("--device-sleep", type=float, default=0.03)
    ap.add_argument("--val-every", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    truth = Truth()
    train = DataLoader(TensorDataset(torch.randn(2048, 16), torch.randint(0, 4, (2048,))), batch_size=32,
                       shuffle=True)
    val = DataLoader(SlowVal(args.val_sleep), batch_size=16)
    model = nn.Sequential(nn.Linear(16, 32), sleep_module()(args.device_sleep), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters())

    def validate(batches):
        model.eval()
        with torch.no_grad():
            for i, (x, y) in enumerate(val):
                model(x)
                if i + 1 >= batches:
                    break
        model.train()

    if not truth.out:
        validate(2)  # sanity check
    step = 0
    while True:
        for x, y in train:
            while truth.data_free:  # the truth harness's "data free" run: one batch, never the loader again
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                truth.tick()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            step += 1
            truth.tick()
            if step % args.val_every == 0 and not truth.out:
                validate(4)


if __name__ == "__main__":
    main()
