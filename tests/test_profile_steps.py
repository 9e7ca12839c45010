"""A step's record (hasten.profile.inject.steps): hasten's own time in the step is left out of it.

Driven by a fake clock, so that what each part took is known by construction and no assertion
depends on how busy the machine is (issue 43: pytorch/examples' regression, 0.2 ms a step, where a
few microseconds of hasten's own a step were the loop's time outside compute)."""

import types

import pytest
import torch

from hasten.profile.inject import state, steps, torch_patches
from hasten.profile.inject.settings import Settings


class Clock:
    """``perf_counter`` and ``process_time`` that move only when told (the CPU with the wall)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def advance(self, s: float) -> None:
        self.now += s

    def perf_counter(self) -> float:
        return self.now

    def process_time(self) -> float:
        return self.now


class SlowLookups(dict):
    """``st.has_params``: each look-up takes the hook ``cost`` seconds of the clock (hasten's own time)."""

    def __init__(self, clock: Clock, cost: float) -> None:
        super().__init__()
        self.clock, self.cost = clock, cost

    def get(self, key, default=None):
        self.clock.advance(self.cost)
        return super().get(key, default)


@pytest.fixture
def clocked(monkeypatch, tmp_path):
    clock = Clock()
    fake_time = types.SimpleNamespace(perf_counter=clock.perf_counter, process_time=clock.process_time)
    monkeypatch.setattr(steps, "time", fake_time)
    monkeypatch.setattr(torch_patches, "time", fake_time)

    def proc_read() -> float:  # reading /proc for the run-queue wait: hasten's, 30 of the clock's seconds
        clock.advance(30.0)
        return 0.0

    monkeypatch.setattr(steps, "runqueue_s", proc_read)
    monkeypatch.setenv("HASTEN_PROFILE_DIR", str(tmp_path))
    st = state.State(Settings.from_environment())
    st.phase = st.step_kind = "measure"
    st.batch_lines = {}  # no source to read: this test's frame is no training loop
    monkeypatch.setattr(state, "current", st)
    return clock, st


def test_hastens_own_time_in_a_step_is_left_out_of_it(clocked):
    clock, st = clocked
    st.has_params = SlowLookups(clock, 2.0)  # the forward pre-hook's own time before the interval opens
    model = torch.nn.Linear(4, 1)
    x = torch.randn(8, 4)
    steps.open_step(st)  # reads /proc: 30 s of hasten's, before the step's clock starts
    clock.advance(4.0)  # the loop makes its batch
    torch_patches.forward_pre(model, (x,))
    clock.advance(10.0)  # the model
    torch_patches.forward_post(model, (x,), None)
    clock.advance(5.0)  # the loop's loss.item(), a weight update by hand
    steps.close_step(st, clock.now)
    (rec,) = st.records["measure"]
    assert rec["compute_s"] == pytest.approx(10.0)
    assert rec["outside_s"] == pytest.approx(9.0)  # the loop's 4 + 5, none of hasten's 30 + 2
    assert rec["span_s"] == pytest.approx(19.0)


def test_a_step_that_ends_at_backward_leaves_out_the_time_its_hook_takes_to_close_it(clocked, monkeypatch):
    clock, st = clocked
    st.pace = "backward"

    def backward(*args, **kwargs):  # autograd's backward: 6 s of compute
        clock.advance(6.0)

    real_end_step = steps.end_step

    def end_step(st):  # hasten's own bookkeeping between the interval's end and the record: 7 s
        clock.advance(7.0)
        real_end_step(st)

    monkeypatch.setattr(steps, "end_step", end_step)
    wrapped = torch_patches.compute_interval(backward, "backward", on_return=steps.after_backward, sync=True)
    steps.open_step(st)
    clock.advance(3.0)  # the loop outside compute
    wrapped()
    (rec,) = st.records["measure"]
    assert rec["compute_s"] == pytest.approx(6.0)
    assert rec["outside_s"] == pytest.approx(3.0)
    assert rec["span_s"] == pytest.approx(9.0)
