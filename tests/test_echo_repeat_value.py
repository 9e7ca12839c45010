"""What a repeat is worth, measured from the run's gradients (hasten.echo.repeat_value), and
AutoEcho taking that measurement in place of its fixed values."""

import math

import pytest
import torch
import torch.nn.functional as F

from hasten.echo.auto import REPEAT_VALUE, AutoEcho
from hasten.echo.repeat_value import gradient_dots

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


def test_autoecho_values_repeats_at_the_measurement_once_it_has_enough_reports():
    auto = AutoEcho(value_after=3, value_memory=1.0)
    _window(auto)  # start-up
    for _ in range(2):
        auto.report_repeat_gradients(0.8, 1.0)
    _window(auto)
    assert auto.measured_value is None and auto.copy_value(1) == pytest.approx(REPEAT_VALUE)
    auto.report_repeat_gradients(1.1, 1.0)  # the sums: 2.7 / 3
    _window(auto)
    assert auto.measured_value == pytest.approx(0.9)
    assert auto.copy_value(1) == auto.copy_value(5) == pytest.approx(0.9)
    auto.report_repeat_gradients(50.0, 1.0)  # far above what a repeat can be worth: clipped to 1
    _window(auto)
    assert auto.copy_value(1) == 1.0 and auto.value_history == [pytest.approx(0.9), 1.0]


def test_older_reports_weigh_less_with_memory_below_one():
    auto = AutoEcho(value_after=1, value_memory=0.5)
    _window(auto)
    auto.report_repeat_gradients(0.0, 1.0)
    auto.report_repeat_gradients(1.0, 1.0)  # sums: 0.5 x 0 + 1 = 1 over 0.5 x 1 + 1 = 1.5
    _window(auto)
    assert auto.measured_value == pytest.approx(1 / 1.5)


def test_a_negative_or_zero_fresh_sum_leaves_the_value_alone():
    auto = AutoEcho(value_after=1)
    _window(auto)
    auto.report_repeat_gradients(0.3, -1.0)  # noise only: no estimate of |grad L|^2 yet
    _window(auto)
    assert auto.measured_value is None and auto.copy_value(1) == pytest.approx(REPEAT_VALUE)


def test_the_ranks_sum_their_reports_and_agree_on_one_value(monkeypatch):
    from tests.test_echo_auto_rules import _FakeRanks

    # This rank measured 0.3 / 1, the other 1.7 / 1 over 4 reports: together 2.0 / 2.
    _FakeRanks(other_estimate=3.0, other_cap=8.0, other_dots=(1.7, 1.0, 4)).install(monkeypatch)
    auto = AutoEcho(value_after=5)
    _window(auto)
    auto.report_repeat_gradients(0.3, 1.0)
    _window(auto)
    assert auto.measured_value == pytest.approx(1.0)


@pytest.mark.parametrize("kw, message", [({"value_after": 0}, "value_after"), ({"value_memory": 0.0}, "value_memory"),
                                         ({"value_memory": 1.5}, "value_memory")])
def test_bad_measurement_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        AutoEcho(**kw)


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
