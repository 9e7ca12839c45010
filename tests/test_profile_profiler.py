"""Library mode: Profiler.wrap / step / probes on a loop with known costs."""

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from hasten.profile import Profiler
from profile_helpers import measured_steps


class SleepyDataset(Dataset):
    def __init__(self, item_s=0.005):
        self.item_s = item_s

    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(self.item_s)
        return torch.zeros(4)


def _work(seconds=0.01):
    time.sleep(seconds)


def test_wrap_and_step_give_an_input_bound_verdict_with_r():
    loader = DataLoader(SleepyDataset(0.01), batch_size=4)  # 40 ms to make a batch, 10 ms to use it: R = 4
    prof = Profiler(warmup=2)
    for i, batch in enumerate(prof.wrap(loader)):
        _work()
        prof.step()
        if i == 12:
            break
    prof.probe_loader(loader, batches=5)
    prof.probe_step(lambda b: _work(), batch, steps=5)
    a = prof.analyse()
    assert a.verdict == "input-bound" and measured_steps(a) == 10 and a.warmup == 2  # 13 batches, the first of the pass left out
    assert a.upstream_ratio == pytest.approx(4.0, rel=0.2)
    assert any("workers" in r.fix for r in a.recommendations)


def test_without_probes_r_is_estimated_from_the_loop_and_says_so():
    # R = 2 by construction: a batch is two sleeps as long as the step's one, so a loaded machine's
    # late wake-ups (a few ms each) lengthen both sides alike (4 sleeps of 5 ms against one of 10 ms
    # read R = 2.6 beside other jobs).
    loader = DataLoader(SleepyDataset(0.02), batch_size=2)
    prof = Profiler(warmup=1)
    for i, _ in enumerate(prof.wrap(loader)):
        _work(0.02)
        if i == 8:
            break
    a = prof.analyse()
    assert a.upstream_ratio == pytest.approx(2.0, rel=0.25)
    assert any("estimated from the loop" in n for n in a.notes)


def test_too_few_steps_is_a_clear_error():
    prof = Profiler(warmup=5)
    for _ in prof.wrap(range(3)):
        pass
    with pytest.raises(ValueError, match="at least 3 measured steps"):
        prof.analyse()
