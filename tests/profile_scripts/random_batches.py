"""A loop like pytorch/examples' regression/main.py: no DataLoader, weights updated by hand, and a batch
function that draws its data at random each call (``torch.randn``); it ends by itself after ``--steps``.

    python random_batches.py [--steps 300] [--draws-per-row 500]

Each row's feature is the mean of ``draws_per_row`` random values: the batch's making is CPU in the
loop (where a sleep would not be), beside a 4-to-1 linear layer's step.
"""

import argparse

import torch
import torch.nn.functional as F


def get_batch(batch_size: int, draws_per_row: int):
    feature = torch.randn(batch_size, draws_per_row).mean(1, keepdim=True)
    x = torch.cat([feature ** i for i in range(1, 5)], 1)
    return x, x.sum(1, keepdim=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--draws-per-row", type=int, default=500)
    args = ap.parse_args()
    torch.set_num_threads(1)
    fc = torch.nn.Linear(4, 1)
    for _ in range(args.steps):
        x, y = get_batch(32, args.draws_per_row)
        loss = F.smooth_l1_loss(fc(x), y)
        fc.zero_grad()
        loss.backward()
        for p in fc.parameters():
            p.data.add_(-0.1 * p.grad)
    print(f"done after {args.steps} steps, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
