"""nanoGPT style: get_batch() slices a memmapped token file; no DataLoader; the next batch is
fetched between forward and backward, as nanoGPT's train.py does.

    python nanogpt_batch.py --data tokens.bin [--fetch-sleep 0.02] [--accum 1]
"""

import argparse
import time

import numpy as np
import torch
from _truth import Truth, sleep_module
from torch import nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--fetch-sleep", type=float, default=0.02, help="storage latency per batch")
    ap.add_argument("--device-sleep", type=float, default=0.01, help="accelerator time per forward")
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10**9)
    ap.add_argument("--workers", type=int, default=0,
                    help="apply the fix `hasten profile` prints: get_batch in a DataLoader with this many workers")
    args = ap.parse_args()
    torch.set_num_threads(1)
    truth = Truth()

    def get_batch(split):  # noqa: F811
        data = np.memmap(args.data, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - args.block - 1, (args.batch,))
        x = torch.stack([torch.from_numpy(data[i:i + args.block].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + args.block].astype(np.int64)) for i in ix])
        time.sleep(args.fetch_sleep)
        return x, y

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(256, 64)
            self.device_time = sleep_module()(args.device_sleep)
            self.head = nn.Linear(64, 256)

        def forward(self, idx, targets):
            logits = self.head(self.device_time(self.emb(idx)))
            return logits, nn.functional.cross_entropy(logits.view(-1, 256), targets.view(-1))

    if args.workers:
        class Batches(torch.utils.data.IterableDataset):
            def __iter__(self):
                torch.manual_seed(torch.utils.data.get_worker_info().id)
                while True:
                    yield get_batch("train")

        batches = iter(torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=args.workers,
                                                   persistent_workers=True))
        get_batch = lambda split: next(batches)  # noqa: E731

    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    X, Y = get_batch("train")
    for _ in range(args.iters):
        for _ in range(args.accum):
            _, loss = model(X, Y)
            loss = loss / args.accum
            if not truth.data_free:
                X, Y = get_batch("train")  # async prefetch in nanoGPT; here between forward and backward too
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        truth.tick()


if __name__ == "__main__":
    main()
