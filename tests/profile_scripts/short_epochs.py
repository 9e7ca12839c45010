"""A loop that trusts ``len(loader)``, with epochs shorter than hasten's warm-up, window and probes (issue 43).

    python short_epochs.py [--items 128] [--batch 16] [--epochs 6] [--accum 1] [--workers 0] [--persistent]

Three of the ways real loops count on ``len(loader)``, each of which breaks when a pass hands
out more batches than that:

- timm's ``train_one_epoch`` accumulation arithmetic, copied: at the batch ``len(loader)``
  (one past the last) it sets its accumulation count to ``len(loader) % accum`` (0 when it
  divides) and divides by it at the next batch (``ZeroDivisionError``, timm's train.py:1278);
- an ``assert batch_idx < len(loader)``;
- ``OneCycleLR(total_steps=epochs * len(loader) // accum)``, stepped once per optimizer step:
  it raises when stepped once more than that.

Prints the batches of each epoch at the end (``epochs: 8 8 8 ...``).
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--persistent", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.items, 32), torch.randint(0, 4, (args.items,)))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.persistent and args.workers > 0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    updates_per_epoch = math.ceil(len(loader) / args.accum)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=args.epochs * updates_per_epoch)
    seen = []
    for _ in range(args.epochs):
        # timm's train_one_epoch, its accumulation arithmetic as it is
        accum_steps = args.accum
        last_accum_steps = len(loader) % accum_steps
        last_batch_idx = len(loader) - 1
        last_batch_idx_to_accum = len(loader) - last_accum_steps
        batches = 0
        for batch_idx, (x, y) in enumerate(loader):
            assert batch_idx < len(loader), f"batch {batch_idx} of a loader of {len(loader)}"
            last_batch = batch_idx == last_batch_idx
            need_update = last_batch or (batch_idx + 1) % accum_steps == 0
            if batch_idx >= last_batch_idx_to_accum:
                accum_steps = last_accum_steps
            loss = F.cross_entropy(model(x), y) / max(1, accum_steps)
            loss.backward()
            if need_update:
                opt.step()
                opt.zero_grad()
                sched.step()
            batches += 1
        seen.append(batches)
    print("epochs:", *seen)


if __name__ == "__main__":
    main()
