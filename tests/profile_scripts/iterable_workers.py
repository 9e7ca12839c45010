"""An input-bound loop over an IterableDataset, with or without splitting its items by worker.

    python iterable_workers.py [--workers 0] [--shard] [--item-sleep 0.002] [--step-sleep 0.008]

Without ``--shard`` the dataset ignores ``torch.utils.data.get_worker_info()``: with workers,
each of them yields every item, and the loop trains on each batch once per worker.
"""

import argparse
import time

import torch
from _truth import sleep_module
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Stream(IterableDataset):
    def __init__(self, n, item_sleep, shard):
        self.n, self.item_sleep, self.shard = n, item_sleep, shard

    def __iter__(self):
        info = get_worker_info() if self.shard else None
        start, step = (info.id, info.num_workers) if info else (0, 1)
        for i in range(start, self.n, step):
            time.sleep(self.item_sleep)
            yield torch.full((32,), float(i)), i % 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--shard", action="store_true")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--item-sleep", type=float, default=0.002)
    ap.add_argument("--step-sleep", type=float, default=0.008)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(Stream(100_000, args.item_sleep, args.shard), batch_size=args.batch,
                        num_workers=args.workers)
    model = nn.Sequential(nn.Linear(32, 2), sleep_module()(args.step_sleep))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    while True:
        for x, y in loader:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()


if __name__ == "__main__":
    main()
