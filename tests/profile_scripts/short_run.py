"""A script that ends by itself after ``--steps`` fast steps, as pytorch/examples' regression/main.py
does: weights updated by hand (no torch.optim optimizer), each batch made by ``get_batch()``.

    python short_run.py [--steps 300] [--batch-sleep 0.002]

Each batch costs ``batch_sleep`` seconds in ``get_batch()``; the step itself is a 4-to-1 linear
layer (well under a millisecond): the data share is most of the step by construction.
"""

import argparse
import time

import torch
import torch.nn.functional as F


def get_batch(n: int, batch_sleep: float):
    time.sleep(batch_sleep)
    x = torch.randn(n, 4)
    return x, x.sum(1, keepdim=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-sleep", type=float, default=0.002)
    args = ap.parse_args()
    torch.set_num_threads(1)
    fc = torch.nn.Linear(4, 1)
    for _ in range(args.steps):
        x, y = get_batch(32, args.batch_sleep)
        loss = F.smooth_l1_loss(fc(x), y)
        fc.zero_grad()
        loss.backward()
        for p in fc.parameters():
            p.data.add_(-0.1 * p.grad)
    print(f"done after {args.steps} steps, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
