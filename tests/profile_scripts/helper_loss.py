"""A loop whose loss is computed in a helper of a second file: a module without parameters and a plain
``F.cross_entropy``, neither timed by hasten's hooks, then a sleep (issue 43).

    python helper_loss.py [--classes 1024] [--pause 0.01]

The sampled time in the helper is compute, never "neither data, compute nor communication";
the sleep is the rest of the step, named by its line.
"""

import argparse
import time

import torch
from _loss_helper import Sharpen, loss_of
from torch import nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes", type=int, default=1024)
    ap.add_argument("--pause", type=float, default=0.01)
    args = ap.parse_args()
    torch.set_num_threads(1)  # no thread spinning at a barrier on a loaded machine: the step is CPU it needs
    model, sharpen = nn.Linear(16, args.classes), Sharpen()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randint(0, args.classes, (64,))
    while True:
        loss = loss_of(model, sharpen, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(args.pause)


if __name__ == "__main__":
    main()
