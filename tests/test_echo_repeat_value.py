"""What a repeat is worth, measured from the run's gradients (hasten.echo.repeat_value), and
AutoEcho taking that measurement in place of its fixed values."""

import math

import pytest
import torch
import torch.nn.functional as F

from hasten.echo.auto import REPEAT_VALUE, AutoEcho
from hasten.echo.repeat_value import RepeatLossSums, RepeatValueEstimate, gradient_dots, observe_repeat_losses

DIM = 20


def _task(seed: int):
    """A linear regression with label noise: the population gradient at w = 0 points at
    the true weights; a fresh example's gradient estimates it without bias."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(DIM, generator=g), g


def _batch(true_w, g, fresh: int, repeats: int, repeat_kind: str):
    x = torch.randn(fresh + repeats, DIM, generator=g)
    y = x @ true_w + 0.5 * torch.randn(fresh + repeats, generator=g)
    model = torch.nn.Linear(DIM, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
        if repeat_kind == "memorised":
            # Repeats the model fits exactly: their loss and gradient are zero at w = 0.
            y[fresh:] = 0.0
    copies = torch.cat([torch.zeros(fresh, dtype=torch.long), torch.ones(repeats, dtype=torch.long)])
    return model, x, y, copies


def _mse(out, y):
    return F.mse_loss(out.squeeze(-1), y)


def _value(repeat_kind: str, batches: int = 300) -> float:
    true_w, g = _task(0)
    num = den = 0.0
    for _ in range(batches):
        model, x, y, copies = _batch(true_w, g, fresh=16, repeats=16, repeat_kind=repeat_kind)
        r, f = gradient_dots(model, _mse, x, y, copies, generator=g)
        num, den = num + r, den + f
    return num / den


def test_repeats_as_good_as_fresh_examples_are_worth_one():
    # Items labelled repeats but drawn like fresh ones: the same expected gradient.
    assert _value("fresh-like") == pytest.approx(1.0, abs=0.1)


def test_memorised_repeats_are_worth_nothing():
    assert _value("memorised") == pytest.approx(0.0, abs=0.02)


def test_it_leaves_grad_and_batch_norm_statistics_as_they_were():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    F.cross_entropy(model(x), y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    stats = [b.clone() for b in model.buffers()]
    copies = torch.arange(32) % 2
    dots = gradient_dots(model, F.cross_entropy, x, y, copies)
    assert dots is not None and all(math.isfinite(d) for d in dots)
    assert all(torch.equal(p.grad, g0) for p, g0 in zip(model.parameters(), grads))
    assert all(torch.equal(b, s) for b, s in zip(model.buffers(), stats))


def test_a_batch_without_enough_repeats_or_first_copies_measures_nothing():
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    assert gradient_dots(model, F.cross_entropy, x, y, torch.zeros(16, dtype=torch.long)) is None
    assert gradient_dots(model, F.cross_entropy, x, y, torch.ones(16, dtype=torch.long)) is None
    with pytest.raises(ValueError, match="copies has 3 entries for a batch of 16"):
        gradient_dots(model, F.cross_entropy, x, y, torch.zeros(3, dtype=torch.long))


def _window(auto: AutoEcho) -> None:
    auto.observe(fresh=10, emitted=10, wait_s=0.2, downstream_s=0.1)


def _report_blocks(auto: AutoEcho, values, per_block: int = RepeatValueEstimate.BLOCK) -> None:
    """One block of reports per value (each report repeat_dot = value, fresh_dot = 1), a window after each."""
    for v in values:
        for _ in range(per_block):
            auto.report_repeat_gradients(v, 1.0)
        _window(auto)


def _shrunk(prior: float, measurement: float, se: float) -> float:
    w = RepeatValueEstimate.PRIOR_SD ** 2 / (RepeatValueEstimate.PRIOR_SD ** 2 + se ** 2)
    return prior + w * (measurement - prior)


def test_autoecho_takes_the_value_only_from_min_blocks_on_and_shrinks_it_toward_the_prior():
    auto = AutoEcho()
    _window(auto)  # start-up
    _report_blocks(auto, [0.9] * (RepeatValueEstimate.MIN_BLOCKS - 1))
    assert auto.measured_value is None and auto.repeat_value == pytest.approx(REPEAT_VALUE)
    _report_blocks(auto, [0.9])
    # Three equal blocks: no spread, the floor of the standard error; the prior moves almost
    # all the way to the measurement.
    se = RepeatValueEstimate.SE_FLOOR
    assert auto.repeat_value == pytest.approx(_shrunk(REPEAT_VALUE, 0.9, se))
    assert auto.measured_value == auto.repeat_value
    # Blocks that disagree: the median, shrunk by its standard error (1.2533 x 1.4826 x MAD / sqrt(k)).
    spread = AutoEcho()
    _window(spread)
    _report_blocks(spread, [0.5, 0.9, 1.1])
    se = 1.2533 * 1.4826 * 0.2 / math.sqrt(3)
    assert spread.repeat_value == pytest.approx(_shrunk(REPEAT_VALUE, 0.9, se))
    assert _shrunk(REPEAT_VALUE, 0.9, se) < 0.85  # a noisy measurement moves the value less


def test_one_outlier_reading_does_not_move_the_value():
    auto = AutoEcho()
    _window(auto)
    _report_blocks(auto, [0.84, 0.86, 0.85, 0.85, 0.86])
    before = auto.repeat_value
    # One wild report (a step where the halves' gradients happened to agree little): alone its
    # ratio is -50; summed, it would have thrown the value to its floor.
    auto.report_repeat_gradients(-50.0, 1.0)
    for _ in range(RepeatValueEstimate.BLOCK - 1):
        auto.report_repeat_gradients(0.85, 1.0)
    _window(auto)
    assert auto.value.blocks[-1] < 0  # its block reads the outlier ...
    after = auto.repeat_value
    assert after == pytest.approx(before, abs=0.01)  # ... the median does not


def test_early_large_gradients_do_not_outweigh_the_rest_of_the_run():
    # Early in training |grad L|^2 is large: summed reports let the first ones decide (a run at
    # R = 4 read 0.08 first and stayed below 0.5). Blocks weigh alike.
    auto = AutoEcho()
    _window(auto)
    for _ in range(RepeatValueEstimate.BLOCK):
        auto.report_repeat_gradients(100 * 0.1, 100.0)  # early: value 0.1 at 100x the scale
    _window(auto)
    _report_blocks(auto, [0.9] * 4)
    assert auto.repeat_value > 0.85


def test_a_block_with_a_non_positive_fresh_sum_is_dropped():
    auto = AutoEcho()
    _window(auto)
    for _ in range(RepeatValueEstimate.BLOCK):
        auto.report_repeat_gradients(0.3, -1.0)  # noise only: no estimate of |grad L|^2
    _window(auto)
    assert len(auto.value.blocks) == 0 and auto.repeat_value == pytest.approx(REPEAT_VALUE)
    auto.report_repeat_gradients(math.nan, 1.0)  # not finite: ignored
    assert auto._pending_dots == [0.0, 0.0, 0]


def test_measurements_grow_sparse_once_the_value_stands_and_dense_again_when_it_moves():
    auto = AutoEcho(value_every=16)
    _window(auto)
    assert not any(auto.value_due() for _ in range(100))  # e = 1: no repeats, never measured
    auto.factor = auto.base = 4.0  # (e and the rule's base, as observe would set them)

    def steps_between_measurements(value, blocks):
        gaps, since = [], 0
        for _ in range(blocks * RepeatValueEstimate.BLOCK):
            while True:
                since += 1
                if auto.value_due():
                    break
            gaps.append(since)
            since = 0
            auto.report_repeat_gradients(value, 1.0)
            _window(auto)
        return gaps
    gaps = steps_between_measurements(0.85, 8)
    assert gaps[:RepeatValueEstimate.BLOCK * RepeatValueEstimate.MIN_BLOCKS] == [16] * 12  # until it stands
    assert gaps == sorted(gaps) and gaps[-1] == 16 * RepeatValueEstimate.MAX_SPREAD
    assert sum(gaps) > 3 * 16 * len(gaps)  # a third or less of the measurements at a fixed 16
    # The value moves (repeats start being memorised): back to every 16 steps.
    moved = steps_between_measurements(0.2, 8)
    assert moved[RepeatValueEstimate.BLOCK:2 * RepeatValueEstimate.BLOCK] == [16] * RepeatValueEstimate.BLOCK
    assert AutoEcho(value_every=0).value.due() is False  # 0: the constants, never measured


def test_a_due_measurement_waits_for_a_step_on_which_the_loop_waits_for_input():
    """Issue 44: a measurement (about 0.4 of a step) is taken on a step that waits for its
    input anyway when one comes within as many steps again as the interval; counted, not timed."""
    def measured_at(free_steps, steps=64):
        auto = AutoEcho(value_every=8)
        auto.factor = auto.base = 2.0
        at = [i for i in range(1, steps + 1) if auto.value_due(free=i in free_steps)]
        assert auto.value.taken == len(at)
        return at
    assert measured_at(set()) == [16, 32, 48, 64]  # never waiting (compute-bound): every 16 steps, not 8
    # Waiting on some steps: a due measurement goes to the first of them within 8 steps.
    assert measured_at({3, 10, 13, 30, 50}) == [10, 26, 42, 50]
    assert measured_at(set(range(1, 65))) == [8, 16, 24, 32, 40, 48, 56, 64]  # input-bound: as before
    assert AutoEcho(value_every=8).value_due(free=False) is False  # e = 1: never


def test_the_ranks_sum_their_reports_and_agree_on_one_value(monkeypatch):
    from tests.test_echo_auto_rules import _FakeRanks

    # Each window this rank reports 1 of 4 (0.3 / 1) and the other 3 (2.4 / 3): one block of
    # 2.7 / 4 per window on both ranks.
    _FakeRanks(other_estimate=3.0, other_cap=8.0, other_dots=(2.4, 3.0, 3)).install(monkeypatch)
    auto = AutoEcho()
    _window(auto)
    for _ in range(RepeatValueEstimate.MIN_BLOCKS):
        auto.report_repeat_gradients(0.3, 1.0)
        _window(auto)
    assert list(auto.value.blocks) == [pytest.approx(2.7 / 4)] * RepeatValueEstimate.MIN_BLOCKS
    assert auto.repeat_value == pytest.approx(_shrunk(REPEAT_VALUE, 2.7 / 4, RepeatValueEstimate.SE_FLOOR))


@pytest.mark.parametrize("kw, message", [({"value_every": -1}, "value_every"), ({"value_every": 1.5}, "value_every")])
def test_bad_measurement_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        AutoEcho(**kw)


class _Reads(torch.Tensor):
    """A tensor that counts reads of its values to the host (on CUDA each one waits for the device)."""

    reads = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__int__,
                    torch.Tensor.__bool__, torch.Tensor.numpy, torch.Tensor.cpu):
            cls.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_repeat_losses_are_summed_where_they_are_and_read_every_so_many_steps():
    auto = AutoEcho(loss_smoothing=1.0)
    reported = []
    auto.repeat_losses.report = lambda fresh, repeat, steps: reported.append((fresh, repeat, steps))
    copies = torch.tensor([0, 0, 1, 2])  # from the echo stage, on the host
    _Reads.reads = 0
    every = RepeatLossSums.EVERY
    for step in range(3 * every):
        losses = torch.tensor([1.0, 3.0, 0.5, 1.5]).as_subclass(_Reads)
        assert observe_repeat_losses(auto, losses, copies)
    assert _Reads.reads == 3  # one read per EVERY steps, none per step
    assert reported == [(pytest.approx(2.0), pytest.approx(1.0), every)] * 3
    # A batch of one kind only reports nothing and reads nothing.
    assert not observe_repeat_losses(auto, torch.ones(4).as_subclass(_Reads), torch.zeros(4, dtype=torch.long))
    assert _Reads.reads == 3


def test_loss_reports_over_several_steps_weigh_as_that_many_steps():
    auto = AutoEcho(loss_smoothing=0.1)
    auto.observe_loss(2.0, 2.0)
    auto.observe_loss(2.0, 1.0, steps=16)  # ratio 0.5 over 16 steps
    assert auto.loss_ratio == pytest.approx(1.0 - (1 - 0.9 ** 16) * 0.5)


class _Scaled(torch.nn.Module):
    """Batch norm, then a fixed scale held as a buffer (saved by autograd for the backward)."""

    def __init__(self):
        super().__init__()
        self.lin, self.bn = torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x):
        return self.bn(self.lin(x)) * self.scale


def test_the_steps_own_backward_still_runs_after_it():
    # A buffer the step's graph saved must not be written (its version would change): the
    # step's backward after the measurement would fail.
    torch.manual_seed(0)
    model = _Scaled()
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    loss = F.cross_entropy(model(x), y)
    assert gradient_dots(model, F.cross_entropy, x, y, torch.arange(32) % 2) is not None
    loss.backward()
    assert model.lin.weight.grad is not None


def test_a_measurement_forwards_three_equal_parts_of_at_most_max_items():
    # The cost of a measurement: three parts of k = min(first copies / 2, repeats, max_items)
    # items each, whatever the share of repeats (all repeats and both halves: a whole batch).
    seen = []

    class Counting(torch.nn.Linear):
        def forward(self, x):
            seen.append(len(x))
            return super().forward(x)

    model = Counting(4, 3)
    x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    copies = torch.tensor([0 if i % 4 == 0 else 1 for i in range(64)])  # e = 4: 16 first copies
    assert gradient_dots(model, F.cross_entropy, x, y, copies, max_items=5) is not None
    assert seen == [5, 5, 5]
    seen.clear()
    gradient_dots(model, F.cross_entropy, x, y, copies)
    assert seen == [8, 8, 8]  # half the first copies, and as many repeats
    with pytest.raises(ValueError, match="max_items"):
        gradient_dots(model, F.cross_entropy, x, y, copies, max_items=2)
