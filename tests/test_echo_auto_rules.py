"""AutoEcho's rules checked by hand: each rule of its docstring at its boundaries, the
agreement between ranks, and the bound on e from what a repeat is worth (hasten.echo.auto)."""

import math
import threading
import time

import pytest
import torch

from hasten.echo import AutoEcho, echo_examples
from hasten.echo.auto import REPEAT_VALUE

# --- Hand-computed checks of each rule in AutoEcho's docstring -------------------------------


def _started(**kw):
    """An AutoEcho past its ignored start-up window."""
    kw.setdefault("e_max", 10)
    auto = AutoEcho(**kw)
    auto.observe(fresh=10, emitted=10, wait_s=1.0, downstream_s=0.1)
    assert auto.windows == 1 and auto.ratio_estimate is None
    return auto


def test_documented_defaults_drive_a_plain_stage():
    from hasten.echo import AutoEcho as A

    class Recording(A):
        def observe(self, fresh, emitted, wait_s, downstream_s):
            self.seen.append(fresh)
            return self.factor

    auto = Recording()
    auto.seen = []
    assert auto.e_max == 8.0 and auto.cap == 8.0 and auto.factor == 1.0
    list(echo_examples(range(128), auto))
    assert auto.seen == [64, 64]  # windows of 64 fresh items by default
    # Many strongly input-bound windows (R = 1001) saturate at the default e_max, 8.
    big = AutoEcho()
    for _ in range(8):
        big.observe(fresh=10, emitted=10, wait_s=100.0, downstream_s=0.1)
    assert big.factor == 8.0


def test_validation_boundaries_and_messages():
    # Boundary values the docstring allows.
    assert AutoEcho(e_max=1).e_max == 1.0  # e_max = 1: never echo
    assert AutoEcho(interval=1).interval == 1
    AutoEcho(idle_threshold=0.0, hysteresis=0.0, loss_smoothing=1.0, value_every=0)
    for kw, name in [
        ({"e_max": 0.99}, "e_max"),
        ({"idle_threshold": 1.0}, r"idle_threshold must be in \[0, 1\)"),
        ({"idle_threshold": 1.5}, "idle_threshold"),
        ({"probe": 0.0}, r"probe must be in \(0, 1\)"),
        ({"probe": 1.0}, r"probe must be in \(0, 1\)"),
        ({"probe": 1.5}, "probe"),
        ({"hysteresis": 1.0}, r"hysteresis must be in \[0, 1\)"),
        ({"hysteresis": -0.1}, r"hysteresis must be in \[0, 1\)"),
        ({"value_every": -1}, "value_every must be an integer >= 0"),
        ({"value_every": 2.5}, "value_every must be an integer >= 0"),
        ({"repeat_tolerance": 1.0}, r"repeat_tolerance must be in \(0, 1\)"),
        ({"loss_smoothing": 0.0}, r"loss_smoothing must be in \(0, 1\]"),
        ({"loss_smoothing": 1.5}, r"loss_smoothing must be in \(0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=name):
            AutoEcho(**kw)


def test_waiting_share_must_be_strictly_above_the_threshold():
    # W / (W + D) = 0.25 / 1.0 = 0.25, exactly the threshold: not input-bound.
    auto = _started(idle_threshold=0.25)
    auto.observe(fresh=4, emitted=4, wait_s=0.25, downstream_s=0.75)
    # Not waiting: the window reads R <= e, and counts in R^ as e.
    assert math.isnan(auto.history[-1][1]) and auto.ratio_estimate == 1.0 and auto.factor == 1.0
    auto.observe(fresh=4, emitted=4, wait_s=0.26, downstream_s=0.74)  # above it: a measurement
    assert auto.history[-1][1] == pytest.approx(1 + 0.26 / 0.74)


def test_the_first_measurement_sets_e_and_later_ones_move_it_only_outside_the_band():
    auto = _started(hysteresis=0.05)
    auto.observe(fresh=10, emitted=10, wait_s=0.5, downstream_s=0.1)  # R = 6: one window moves nothing
    assert auto.ratio_estimate == pytest.approx(6.0) and auto.factor == 1.0
    auto.observe(fresh=10, emitted=10, wait_s=0.5, downstream_s=0.1)  # two: e = 6 at once, no headroom
    assert auto.ratio_estimate == pytest.approx(6.0) and auto.factor == pytest.approx(6.0)
    # Windows at e = 6 reading R = 6.24 (4% above): R^ moves, e holds inside the band.
    for _ in range(3):
        auto.observe(fresh=10, emitted=60, wait_s=0.024, downstream_s=0.6)
    assert auto.ratio_estimate == pytest.approx(6.24) and auto.factor == pytest.approx(6.0)
    # A window reading R = 7.2 is the largest, left out: e holds.
    auto.observe(fresh=10, emitted=60, wait_s=0.12, downstream_s=0.6)
    assert auto.factor == pytest.approx(6.0)
    # A second: (3 x 6.24 + 7.2) / 4 = 6.48 leaves the band, and e moves to it.
    auto.observe(fresh=10, emitted=60, wait_s=0.12, downstream_s=0.6)
    assert auto.ratio_estimate == pytest.approx(6.48) and auto.factor == pytest.approx(6.48)


def test_echoing_turns_on_at_exactly_off_below():
    # R = (4 / 4) * (1 + 0.25 / 1.0) = 1.25 = off_below: echoing is off only *under* it,
    # and e = R = 1.25 (not rounded up to a whole copy).
    auto = _started()
    for _ in range(2):
        auto.observe(fresh=4, emitted=4, wait_s=0.25, downstream_s=1.0)
    assert auto.ratio_estimate == 1.25
    assert auto.factor == pytest.approx(1.25)
    below = _started()
    for _ in range(2):
        below.observe(fresh=4, emitted=4, wait_s=0.24, downstream_s=1.0)
    assert below.ratio_estimate == pytest.approx(1.24) and below.factor == 1.0


def test_windows_that_teach_nothing_are_skipped_not_counted():
    auto = AutoEcho(e_max=10)
    # No fresh item, no emitted item, or no downstream time (a coarse clock): nothing to learn,
    # and such a window does not use up the ignored start-up window either.
    for bad in [dict(fresh=0, emitted=10, wait_s=0.5, downstream_s=0.1),
                dict(fresh=10, emitted=0, wait_s=0.5, downstream_s=0.1),
                dict(fresh=10, emitted=10, wait_s=0.5, downstream_s=0.0),
                dict(fresh=10, emitted=10, wait_s=0.0, downstream_s=0.0)]:
        assert auto.observe(**bad) == 1.0
        assert auto.windows == 0
    auto.observe(fresh=10, emitted=10, wait_s=9.0, downstream_s=0.1)  # the start-up window
    for bad in [dict(fresh=10, emitted=0, wait_s=0.5, downstream_s=0.1),
                dict(fresh=10, emitted=10, wait_s=0.5, downstream_s=0.0)]:
        auto.observe(**bad)
        assert auto.windows == 1 and auto.ratio_estimate is None
    # One fresh item and one emitted item are a real measurement: R = 1 * (1 + 0.3 / 0.1) = 4.
    auto.observe(fresh=1, emitted=1, wait_s=0.3, downstream_s=0.1)
    assert auto.ratio_estimate == pytest.approx(4.0)


def test_loop_reports_without_items_or_time_leave_the_stages_view_in_use():
    # A step of zero measured seconds (a coarse clock) or of no items is no loop measurement:
    # the stage's own view is used, now and in later windows without loop reports.
    for report in [dict(wait_s=0.0, step_s=0.0, items=16), dict(wait_s=0.05, step_s=0.1, items=0)]:
        auto = AutoEcho(e_max=10)
        auto.record_step(**report)
        auto.observe(fresh=10, emitted=10, wait_s=1.0, downstream_s=0.1)  # start-up window
        auto.record_step(**report)
        auto.observe(fresh=10, emitted=10, wait_s=0.2, downstream_s=0.1)  # R = 1 * (1 + 2) = 3
        assert auto.ratio_estimate == pytest.approx(3.0), report
        auto.observe(fresh=10, emitted=10, wait_s=0.4, downstream_s=0.1)  # R = 5
        assert auto.history[-1][1] == pytest.approx(5.0), report


def test_a_loop_of_one_item_steps_is_a_loop_report():
    # Batch echoing counts batches: one item per step. The loop's view, 1 item in 0.2 s of which
    # the stage waited 0.1 s: R = (1 / 1) * (1 + 0.1 / 0.1) = 2. The stage's view would say
    # 5 * (1 + 0.1 / 0.01) = 55.
    auto = _started()
    auto.record_step(wait_s=0.1, step_s=0.1, items=1)
    auto.observe(fresh=1, emitted=5, wait_s=0.1, downstream_s=0.01)
    assert auto.ratio_estimate == pytest.approx(2.0)


def test_fresh_items_of_several_stepless_windows_all_carry_over():
    auto = _started()
    auto.record_step(wait_s=0.1, step_s=0.1, items=10)
    auto.observe(fresh=10, emitted=10, wait_s=0.1, downstream_s=0.1)  # R = 1 * (1 + 1) = 2
    assert auto.ratio_estimate == pytest.approx(2.0)
    auto.observe(fresh=10, emitted=30, wait_s=0.3, downstream_s=0.001)  # no step: carried
    auto.observe(fresh=20, emitted=30, wait_s=0.3, downstream_s=0.001)  # no step: carried
    # 60 items in 1.2 s, 0.8 s of it waiting on upstream, for 10 + 20 + 30 fresh items:
    # R = (60 / 60) * (1 + 0.8 / 0.4) = 3.
    auto.record_step(wait_s=0.8, step_s=0.4, items=60)
    auto.observe(fresh=30, emitted=60, wait_s=0.8, downstream_s=0.001)
    assert auto.history[-1][1] == pytest.approx(3.0)  # this window's R (R^ pools the windows)


def test_loss_reports_that_are_not_finite_or_not_positive_are_ignored():
    auto = AutoEcho(loss_smoothing=0.25)
    for fresh, repeat in [(math.nan, 1.0), (2.0, math.inf), (math.inf, 1.0), (2.0, math.nan), (0.0, 0.0),
                          (-1.0, -0.5)]:
        assert auto.observe_loss(fresh, repeat) == 8.0
        assert auto.loss_ratio is None
    auto.observe_loss(0.5, 0.25)  # a loss below 1 is an ordinary loss: ratio 0.5
    assert auto.loss_ratio == pytest.approx(0.5)
    auto.observe_loss(2.0, 2.0)  # running mean: 0.5 + 0.25 * (1.0 - 0.5)
    assert auto.loss_ratio == pytest.approx(0.625)


def test_cap_rules_at_their_boundaries():
    # Repeats count as memorised only when their loss is MORE than repeat_tolerance below.
    auto = _started(repeat_tolerance=0.25, loss_smoothing=1.0, e_max=8)
    auto.observe_loss(1.0, 0.75)  # ratio 0.75 = 1 - 0.25: not memorised
    auto.observe(fresh=10, emitted=10, wait_s=0.0, downstream_s=0.1)
    assert auto.cap == 8.0
    # Memorised while e is 1: the cap falls to e (1) x 0.9, floored at 1, i.e. exactly 1.
    auto.observe_loss(1.0, 0.5)
    auto.observe(fresh=10, emitted=10, wait_s=0.0, downstream_s=0.1)
    assert auto.cap == 1.0
    # Between 1 - tol and 1 - tol / 2 (= 0.875, included) the cap holds; above it, it rises by probe.
    for ratio, cap in [(0.80, 1.0), (0.86, 1.0), (0.875, 1.0), (0.90, 1.1), (0.99, 1.21)]:
        auto.observe_loss(1.0, ratio)
        auto.observe(fresh=10, emitted=10, wait_s=0.0, downstream_s=0.1)
        assert auto.cap == pytest.approx(cap), ratio


def test_repeated_pauses_within_one_window_all_count(monkeypatch):
    import hasten.echo.auto as auto_mod

    class FakeStopwatch:  # each paused block lasts exactly 0.05 s
        def start(self):
            pass

        def stop(self):
            return 0.05

    monkeypatch.setattr(auto_mod, "Stopwatch", FakeStopwatch)
    auto = _started()
    for _ in range(2):
        with auto.paused():
            pass
    # Downstream 0.2 s less 2 x 0.05 s paused: R = 1 * (1 + 0.1 / 0.1) = 2.
    auto.observe(fresh=10, emitted=10, wait_s=0.1, downstream_s=0.2)
    assert auto.ratio_estimate == pytest.approx(2.0)


class _FakeRanks:
    """torch.distributed as seen by one rank of two: all_reduce adds the other rank's tensor."""

    def __init__(self, other_estimate, other_cap, backend="gloo", other_dots=(0.0, 0.0, 0)):
        import torch

        valid = not math.isnan(other_estimate)
        self.other = torch.tensor([other_estimate if valid else 0.0, 1.0 if valid else 0.0, other_cap, *other_dots],
                                  dtype=torch.float64)
        self.backend = backend
        self.reduced = []
        self.groups = []  # (group, thread) of each all_reduce
        self.created = []  # (backend, thread) of each new_group

    def install(self, monkeypatch):
        import torch.distributed as dist

        monkeypatch.setattr(dist, "is_available", lambda: True)
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: self.backend)
        monkeypatch.setattr(dist, "all_reduce", self.all_reduce)
        monkeypatch.setattr(dist, "new_group", self.new_group)

    def new_group(self, ranks=None, timeout=None, backend=None, **kw):
        self.created.append((backend, threading.get_ident()))
        return ("autoecho-group", len(self.created))

    def all_reduce(self, t, op=None, group=None, async_op=False):
        self.reduced.append(t.clone())
        self.groups.append((group, threading.get_ident()))
        t += self.other


@pytest.mark.parametrize("mine, other, expect", [
    (0.2, 5.0, 4.0),          # this rank R = 3, the other 5: the mean, 4
    (0.0, 5.0, 5.0),          # this rank does not wait: only the waiting rank's R counts
    (0.2, math.nan, 3.0),     # the other does not wait
    (0.0, math.nan, math.nan),  # no rank waits: not input-bound
])
def test_ranks_average_their_estimates_and_caps(monkeypatch, mine, other, expect):
    ranks = _FakeRanks(other_estimate=other, other_cap=1.0)
    ranks.install(monkeypatch)
    auto = _started(e_max=10)
    auto.observe(fresh=10, emitted=10, wait_s=mine, downstream_s=0.1)
    assert len(ranks.reduced) == 1 and ranks.reduced[0].dtype == torch.float64
    est = auto.history[-1][1]
    assert (math.isnan(est) and math.isnan(expect)) or est == pytest.approx(expect)
    assert auto.cap == pytest.approx((10.0 + 1.0) / 2)
    # Without sync, no collective and this rank's own numbers.
    ranks.reduced.clear()
    solo = _started(e_max=10, sync=False)
    solo.observe(fresh=10, emitted=10, wait_s=0.2, downstream_s=0.1)
    assert ranks.reduced == [] and solo.ratio_estimate == pytest.approx(3.0) and solo.cap == 10.0


def test_a_single_rank_group_needs_no_collective(monkeypatch):
    ranks = _FakeRanks(other_estimate=5.0, other_cap=1.0)
    ranks.install(monkeypatch)
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    auto = _started()
    auto.observe(fresh=10, emitted=10, wait_s=0.2, downstream_s=0.1)
    assert ranks.reduced == [] and auto.ratio_estimate == pytest.approx(3.0)


@pytest.mark.parametrize("backend, device", [("nccl", "cuda:3"), ("gloo", None)])
def test_the_agreement_tensor_is_float64_on_the_device_the_backend_needs(monkeypatch, backend, device):
    # NCCL reduces only tensors on the current CUDA device; gloo takes CPU tensors. This machine
    # may have no GPU, so record the tensor's requested placement instead of allocating it.
    real_tensor = torch.tensor
    made = []

    def recording_tensor(data, *, device=None, dtype=None):
        made.append((device, dtype))
        return real_tensor(data, dtype=dtype)

    ranks = _FakeRanks(other_estimate=5.0, other_cap=1.0, backend=backend)
    ranks.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch, "tensor", recording_tensor)
    auto = _started()
    auto.observe(fresh=10, emitted=10, wait_s=0.2, downstream_s=0.1)
    assert made == [(None if device is None else torch.device(device), torch.float64)]
    assert auto.ratio_estimate == pytest.approx(4.0)


def test_a_rank_never_exceeds_its_own_e_max_whatever_the_mean_cap(monkeypatch):
    # The other rank reports a cap of 10 each window; this rank's cap becomes the mean, 7, 8.5,
    # 9.25, 9.625: above this rank's e_max = 4, which still bounds e.
    _FakeRanks(other_estimate=100.0, other_cap=10.0).install(monkeypatch)
    auto = _started(e_max=4)
    for _ in range(4):
        auto.observe(fresh=10, emitted=10, wait_s=10.0, downstream_s=0.1)
    assert auto.cap == pytest.approx(10 - 6 / 2**4) and auto.factor == 4.0


# ----------------------------------------------------------------------------- The bound from what a repeat is worth
@pytest.mark.parametrize("v, bound", [(REPEAT_VALUE, math.inf), (0.5, math.inf), (0.65, math.inf),
                                      (0.25, 3.0), (0.0, 2.0), (0.4, 6.0)])
def test_the_value_bound_keeps_a_steps_first_order_value_above_one_half(v, bound):
    auto = AutoEcho()
    auto.repeat_value = v
    assert auto.value_bound == pytest.approx(bound)
    if math.isfinite(bound):  # at the bound a step's batch is worth exactly 1/2 of a fresh one to first order
        assert 1 / bound + (1 - 1 / bound) * v == pytest.approx(0.5)


def test_measured_memorised_repeats_bound_e_and_a_recovered_value_frees_it():
    auto = _started(e_max=10)
    auto.repeat_value = 0.25  # as a measurement shrunk toward the prior would set it
    for _ in range(2):
        auto.observe(fresh=10, emitted=10, wait_s=0.9, downstream_s=0.1)  # R = 10
    assert auto.factor == pytest.approx(3.0)  # the bound, not R
    # Settled at e = 3, the value drops further: e follows the bound down at the next window
    # even though R^ stays where it was.
    auto.repeat_value = 0.0
    auto.observe(fresh=10, emitted=30, wait_s=0.2 / 3, downstream_s=0.1)  # R = 3 x (1 + 2/3) = 5
    assert auto.factor == pytest.approx(2.0)
    # Repeats worth more than half a fresh example again: the bound lifts, e goes back toward R.
    auto.repeat_value = 0.6
    for _ in range(4):
        auto.observe(fresh=10, emitted=20, wait_s=0.4, downstream_s=0.1)  # R = 2 x 5 = 10
    assert auto.factor > 3.0


def test_a_prior_repeat_value_outside_0_1_is_refused():
    assert AutoEcho(repeat_value=1.0).repeat_value == 1.0  # as good as fresh: allowed
    for bad in (0, 1.5, -0.1, "0.5"):
        with pytest.raises(ValueError, match="repeat_value must be in"):
            AutoEcho(repeat_value=bad)


def test_setup_distributed_gives_autoecho_its_own_gloo_group_for_the_agreement(monkeypatch):
    ranks = _FakeRanks(other_estimate=5.0, other_cap=1.0, backend="nccl")
    ranks.install(monkeypatch)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "gloo" if group else "nccl")
    auto = _started()
    auto.setup_distributed()
    auto.setup_distributed()  # once only: a second group would be a second collective on the default one
    assert ranks.created == [("gloo", threading.get_ident())]
    auto.observe(fresh=10, emitted=10, wait_s=0.2, downstream_s=0.1)
    assert [g for g, _ in ranks.groups] == [("autoecho-group", 1)]
    assert ranks.reduced[0].device.type == "cpu"  # gloo: a CPU tensor, not the NCCL device
    # sync=False: no group, no collective.
    solo = AutoEcho(sync=False)
    solo.setup_distributed()
    assert len(ranks.created) == 1


def test_paused_time_accumulates_over_the_run():
    auto = AutoEcho()
    assert auto.paused_s == 0.0
    for _ in range(2):
        with auto.paused():
            time.sleep(0.02)
    assert 0.04 <= auto.paused_s < 0.5


# ----------------------------------------------------------------------------- Jitter at e = R holds e
def test_short_waits_within_the_band_hold_e_instead_of_creeping_up():
    auto = _started(hysteresis=0.05, e_max=8)
    for _ in range(2):
        auto.observe(fresh=10, emitted=10, wait_s=0.4, downstream_s=0.1)  # R = 5: e = 5
    assert auto.factor == pytest.approx(5.0)
    # At e = 5 the upstream jitters: 4% waiting reads R = 5.2, inside the band. Taken as R
    # above e window after window, it was the creep to e_max of the old rule (e = R x 1.1).
    for _ in range(10):
        auto.observe(fresh=10, emitted=50, wait_s=0.04, downstream_s=1.0)
    assert auto.factor == pytest.approx(5.0) and auto.ratio_estimate == pytest.approx(5.2)
    assert auto.history[-1] == (5.0, pytest.approx(5.2))  # each held window is in the history
    # Without a band the same wait is a new R each window.
    bare = _started(hysteresis=0.0, e_max=8)
    bare.observe(fresh=10, emitted=10, wait_s=0.4, downstream_s=0.1)
    bare.observe(fresh=10, emitted=10, wait_s=0.4, downstream_s=0.1)
    bare.observe(fresh=10, emitted=50, wait_s=0.04, downstream_s=1.0)
    bare.observe(fresh=10, emitted=50, wait_s=0.04, downstream_s=1.0)
    assert bare.factor == pytest.approx(5.2)
