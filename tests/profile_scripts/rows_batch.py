"""get_batch() stacks one window of a memmapped token file per row in a list comprehension, as
nanoGPT's does, with no DataLoader; each row's window passes through row(), which counts its calls.

    python rows_batch.py --data tokens.bin --counts DIR [--batch 2048] [--block 8] [--device-sleep 0.01]

After each batch the process writes ``{"calls": row() calls, "batches": batches}`` to
``DIR/<pid>.<HASTEN_PROFILE_APPLY or none>.json``: a run whose per-row comprehension was rewritten
as one index of every row calls row() once a batch, where the script as written calls it once a row.
"""

import argparse
import json
import os

import numpy as np
import torch
from _truth import sleep_module
from torch import nn

DATA, BLOCK, BATCH, COUNTS = "", 8, 2048, ""
calls = batches = 0


def row(window):
    global calls
    calls += 1
    return window


def get_batch():
    global batches
    data = np.memmap(DATA, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,))
    x = torch.stack([torch.from_numpy(row(data[i:i + BLOCK]).astype(np.int64)) for i in ix])
    batches += 1
    path = os.path.join(COUNTS, f"{os.getpid()}.{os.environ.get('HASTEN_PROFILE_APPLY') or 'none'}.json")
    with open(path, "w") as f:
        json.dump({"calls": calls, "batches": batches}, f)
    return x, x % 7


def main():
    global DATA, BLOCK, BATCH, COUNTS
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--counts", required=True)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--device-sleep", type=float, default=0.01)
    args = ap.parse_args()
    DATA, BLOCK, BATCH, COUNTS = args.data, args.block, args.batch, args.counts
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Embedding(256, 8), sleep_module()(args.device_sleep), nn.Linear(8, 7))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X, Y = get_batch()
    while True:
        loss = nn.functional.cross_entropy(model(X).view(-1, 7), Y.view(-1))
        X, Y = get_batch()
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
