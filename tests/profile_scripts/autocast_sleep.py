"""A loop whose forward sleeps one time without bf16 autocast and another under it: autocast's
effect on the step is set by construction, whatever the CPU's bf16 arithmetic costs.

    python autocast_sleep.py [--plain-sleep 0.02] [--autocast-sleep 0.002] [--virtual-clock]

``--virtual-clock``: ``time.perf_counter`` (the clock hasten times steps with) becomes a clock
that only the forward's sleeps advance, and they do not really sleep: every step then takes
exactly its sleeps, so that runs of an unchanged step are exactly alike (a null effect that
is exactly null, whatever the machine's load).
"""

import argparse
import time

import torch
from torch import nn


class AutocastSleep(nn.Module):
    """Sleeps ``plain`` seconds in its forward, ``under_autocast`` with CPU autocast on."""

    def __init__(self, plain, under_autocast, sleep):
        super().__init__()
        self.plain, self.under_autocast, self.sleep = plain, under_autocast, sleep

    def forward(self, x):
        self.sleep(self.under_autocast if torch.is_autocast_enabled("cpu") else self.plain)
        return x


def virtual_clock():
    """Replace ``time.perf_counter`` with a clock that only the returned sleep advances."""
    now = [time.perf_counter()]  # from the real reading: the clock never goes back
    time.perf_counter = lambda: now[0]

    def sleep(seconds):
        now[0] += seconds
    return sleep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plain-sleep", type=float, default=0.02)
    ap.add_argument("--autocast-sleep", type=float, default=0.002)
    ap.add_argument("--virtual-clock", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sleep = virtual_clock() if args.virtual_clock else time.sleep
    model = nn.Sequential(nn.Linear(32, 32), AutocastSleep(args.plain_sleep, args.autocast_sleep, sleep),
                          nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(256, 32)
    while True:
        ix = torch.randint(len(data), (16,))
        loss = nn.functional.cross_entropy(model(data[ix]), (data[ix, 0] > 0).long())
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
