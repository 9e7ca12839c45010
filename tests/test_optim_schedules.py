import pytest
import torch

from hasten.nn.precision import cross_entropy
from hasten.optim import PiecewiseLinear, WarmupPolyDecay, one_cycle, scaled_lr


def _lrs(sched_factory, steps, base=2.0):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    sched = sched_factory(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out, opt, sched


def test_linear_scaling_rule():
    assert scaled_lr(0.1, 8192) == pytest.approx(3.2)
    assert scaled_lr(0.1, 512, base_batch=512) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="batch_size=0"):
        scaled_lr(0.1, 0)


def test_warmup_then_power_two_decay():
    lrs, _, _ = _lrs(lambda o: WarmupPolyDecay(o, warmup_steps=4, total_steps=12, power=2), 14)
    # warm-up: 2 * s / 4; decay: 2 * (1 - (s - 4) / 8) ** 2
    expected = [2 * s / 4 for s in range(4)] + [2 * (1 - (s - 4) / 8) ** 2 for s in range(4, 13)] + [0.0]
    assert lrs == pytest.approx(expected)
    assert lrs[4] == pytest.approx(2.0) and lrs[8] == pytest.approx(0.5)


def test_warmup_start_and_power_zero_is_constant_after_warmup():
    lrs, _, _ = _lrs(lambda o: WarmupPolyDecay(o, 2, 6, power=0, warmup_start=0.5), 6)
    assert lrs == pytest.approx([1.0, 1.5, 2.0, 2.0, 2.0, 2.0])


def test_one_cycle_and_piecewise_linear():
    lrs, _, _ = _lrs(lambda o: one_cycle(o, total_steps=8, peak_fraction=0.25), 9)
    assert lrs == pytest.approx([0, 1, 2, 5 / 3, 4 / 3, 1, 2 / 3, 1 / 3, 0])
    lrs, _, _ = _lrs(lambda o: PiecewiseLinear(o, [2, 4], [1.0, 0.5]), 6, base=1.0)
    assert lrs == pytest.approx([1.0, 1.0, 1.0, 0.75, 0.5, 0.5])


def test_state_dict_resumes_at_the_same_value():
    _, opt, sched = _lrs(lambda o: WarmupPolyDecay(o, 3, 10), 5)
    opt2 = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2.0)
    sched2 = WarmupPolyDecay(opt2, 3, 10)
    sched2.load_state_dict(sched.state_dict())
    opt2.load_state_dict(opt.state_dict())
    opt.step(); sched.step(); opt2.step(); sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])


@pytest.mark.parametrize(
    "factory,match",
    [
        (lambda o: WarmupPolyDecay(o, 10, 10), "warmup_steps: 10"),
        (lambda o: WarmupPolyDecay(o, 1, 10, power=-1), "power: -1"),
        (lambda o: PiecewiseLinear(o, [3, 2], [1, 0]), r"milestones: \[3, 2\]"),
        (lambda o: one_cycle(o, 10, peak_fraction=1.5), "peak_fraction: 1.5"),
    ],
)
def test_invalid_schedule_arguments(factory, match):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with pytest.raises(ValueError, match=match):
        factory(opt)


def test_label_smoothing_matches_the_formula():
    torch.manual_seed(0)
    logits = torch.randn(5, 4).bfloat16()
    y = torch.tensor([0, 3, 1, 1, 2])
    s, k = 0.1, 4
    logp = torch.log_softmax(logits.float(), dim=1)
    target = torch.full((5, k), s / k)
    target[torch.arange(5), y] += 1 - s
    expected = -(target * logp).sum(1).mean()
    loss = cross_entropy(logits, y, label_smoothing=s)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected)
    with pytest.raises(ValueError, match="label_smoothing: 1.0"):
        cross_entropy(logits, y, label_smoothing=1.0)


def test_defaults_are_the_documented_ones():
    # power 2 after warm-up (You et al.); one cycle peaks at a quarter of the run
    lrs, _, _ = _lrs(lambda o: WarmupPolyDecay(o, warmup_steps=0, total_steps=4), 5, base=1.0)
    assert lrs == pytest.approx([1.0, 0.75 ** 2, 0.5 ** 2, 0.25 ** 2, 0.0])  # no warm-up: full rate at 0
    lrs, _, _ = _lrs(lambda o: one_cycle(o, total_steps=8), 9, base=1.0)
    assert max(range(9), key=lrs.__getitem__) == 2


def test_warmup_steps_zero_and_total_steps_one_are_valid():
    lrs, _, _ = _lrs(lambda o: WarmupPolyDecay(o, 0, 1, power=1), 3, base=1.0)
    assert lrs == pytest.approx([1.0, 0.0, 0.0])
    lrs, _, _ = _lrs(lambda o: WarmupPolyDecay(o, 1, 2, power=1, warmup_start=1.0), 3, base=1.0)
    assert lrs == pytest.approx([1.0, 1.0, 0.0])  # warmup_start = 1: no ramp


def test_one_cycle_peak_is_kept_inside_the_run():
    # a tiny or huge peak fraction still gives a peak strictly between 0 and total_steps
    lrs, _, _ = _lrs(lambda o: one_cycle(o, total_steps=8, peak_fraction=0.05), 9, base=1.0)
    assert lrs[:3] == pytest.approx([0.0, 1.0, 6 / 7])
    lrs, _, _ = _lrs(lambda o: one_cycle(o, total_steps=8, peak_fraction=0.95), 9, base=1.0)
    assert lrs[6:] == pytest.approx([6 / 7, 1.0, 0.0])
    lrs, _, _ = _lrs(lambda o: one_cycle(o, total_steps=2, start=0.5, end=0.25), 3, base=1.0)
    assert lrs == pytest.approx([0.5, 1.0, 0.25])


def test_resume_through_last_epoch_continues_the_curve():
    for factory in (lambda o, e: WarmupPolyDecay(o, 2, 10, last_epoch=e),
                    lambda o, e: PiecewiseLinear(o, [0, 2, 10], [0.0, 1.0, 0.0], last_epoch=e)):
        ref, _, _ = _lrs(lambda o: factory(o, -1), 6)
        opt2 = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2.0)
        opt2.param_groups[0]["initial_lr"] = 2.0  # what torch needs to resume at last_epoch
        factory(opt2, 4)  # steps 0..4 done: the scheduler moves on to step 5 at once
        assert opt2.param_groups[0]["lr"] == pytest.approx(ref[5])


@pytest.mark.parametrize(
    "factory,match",
    [
        (lambda o: WarmupPolyDecay(o, 0, 0), r"^Invalid total_steps: 0 \(must be >= 1\)$"),
        (lambda o: WarmupPolyDecay(o, -1, 10), r"warmup_steps: -1"),
        (lambda o: WarmupPolyDecay(o, 1, 10, warmup_start=1.5),
         r"^Invalid warmup_start: 1.5 \(must be in \[0, 1\]\)$"),
        (lambda o: PiecewiseLinear(o, [], []), r"^milestones and factors must be non-empty and equally long, got 0 and 0$"),
        (lambda o: PiecewiseLinear(o, [1, 2], [1.0]), r"got 2 and 1$"),
        (lambda o: PiecewiseLinear(o, [2, 2], [1.0, 0.0]), r"milestones: \[2, 2\]"),
        (lambda o: PiecewiseLinear(o, [1, 2], [1.0, -0.5]), r"^Invalid factors: \[1.0, -0.5\] \(must be >= 0\)$"),
        (lambda o: one_cycle(o, 10, peak_fraction=0.0), "peak_fraction: 0.0"),
        (lambda o: one_cycle(o, 10, peak_fraction=1.0), "peak_fraction: 1.0"),
        (lambda o: one_cycle(o, 1), r"^Invalid total_steps: 1 \(must be >= 2\)$"),
    ],
)
def test_schedule_argument_boundaries(factory, match):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with pytest.raises(ValueError, match=match):
        factory(opt)


def test_linear_scaling_rule_boundaries():
    assert scaled_lr(0.1, 1) == pytest.approx(0.1 / 256)
    assert scaled_lr(0.1, 3, base_batch=1) == pytest.approx(0.3)
    with pytest.raises(ValueError, match=r"^Invalid base_lr: 0 \(must be > 0\)$"):
        scaled_lr(0, 256)
    with pytest.raises(ValueError, match="base_batch=0"):
        scaled_lr(0.1, 256, base_batch=0)
