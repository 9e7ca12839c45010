"""A script that ends by itself after ``--steps`` fast steps, as pytorch/examples' regression/main.py
does: no DataLoader, weights updated by hand (no torch.optim optimizer), each batch made by ``get_batch()``.

    python short_run.py [--steps 300] [--batch-sleep 0.002] [--draws-per-row 1]

``get_batch()`` sleeps ``batch_sleep`` seconds (time outside the CPU, as a disk or a network's), then
makes each row's feature as the mean of ``draws_per_row`` random values (``--batch-sleep 0
--draws-per-row 500``: the batch's making is CPU in the loop, where a sleep would not be); the step
itself is a 4-to-1 linear layer (well under a millisecond): with the default sleep the data share is
most of the step by construction.
"""

import argparse
import time

import torch
import torch.nn.functional as F


def get_batch(batch_size: int, batch_sleep: float, draws_per_row: int):
    if batch_sleep > 0:
        time.sleep(batch_sleep)
    feature = torch.randn(batch_size, draws_per_row).mean(1, keepdim=True)
    x = torch.cat([feature ** i for i in range(1, 5)], 1)
    return x, x.sum(1, keepdim=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-sleep", type=float, default=0.002)
    ap.add_argument("--draws-per-row", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    fc = torch.nn.Linear(4, 1)
    for _ in range(args.steps):
        x, y = get_batch(32, args.batch_sleep, args.draws_per_row)
        loss = F.smooth_l1_loss(fc(x), y)
        fc.zero_grad()
        loss.backward()
        for p in fc.parameters():
            p.data.add_(-0.1 * p.grad)
    print(f"done after {args.steps} steps, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
