"""A plain Python list of tensors, augmented in a function each step; no DataLoader.

    python tensor_list.py [--augment-sleep 0.012] [--augment-work 0.0]
"""

import argparse
import time

import torch
from _truth import Truth, burn, sleep_module
from torch import nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--augment-sleep", type=float, default=0.012)
    ap.add_argument("--augment-work", type=float, default=0.0)
    ap.add_argument("--device-sleep", type=float, default=0.01)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--workers", type=int, default=0,
                    help="apply the fix `hasten profile` prints: augment in a DataLoader with this many workers")
    ap.add_argument("--prepared", action="store_true",
                    help="apply the other fix it prints: augment every batch once, before training")
    args = ap.parse_args()
    torch.set_num_threads(1)
    truth = Truth()
    batches = [(torch.randn(32, 48), torch.randint(0, 10, (32,))) for _ in range(50)]

    def augment(x):
        time.sleep(args.augment_sleep)  # reading the next shard
        burn(args.augment_work)  # decoding it
        return x + 0.01 * torch.randn_like(x)

    model = nn.Sequential(nn.Linear(48, args.width), nn.ReLU(), sleep_module()(args.device_sleep),
                          nn.Linear(args.width, 10))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    first = None
    if args.prepared:  # the fix "prepare the data once": augmented before training, not per step
        batches = [(augment(x), y) for x, y in batches]
    if args.workers:  # the fix "make batches in a DataLoader with workers", as the report prints it
        class Batches(torch.utils.data.IterableDataset):
            def __iter__(self):
                info = torch.utils.data.get_worker_info()
                for i in range(info.id, 10**9, info.num_workers):
                    x, y = batches[i % len(batches)]
                    yield augment(x), y

        it = iter(torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=args.workers,
                                              persistent_workers=True))
    in_loop = not (args.workers or args.prepared)
    for epoch in range(10**6):
        for x, y in ((next(it) for _ in batches) if args.workers else batches):
            if truth.data_free and first is not None:
                x, y = first
            else:
                x = augment(x) if in_loop else x
                first = first or (x, y)
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            truth.tick()


if __name__ == "__main__":
    main()
