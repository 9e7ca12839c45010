"""optimizer_step and TrainMeter (hasten.recipes.step)."""

import pytest
import torch

from hasten.recipes.step import TrainMeter, optimizer_step


def test_optimizer_step_frees_gradients_and_steps_the_schedule():
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    w.grad = torch.full((2,), 100.0)  # stale: must not leak into the step
    optimizer_step((3 * w).sum(), opt, sched)
    assert torch.equal(w.detach(), torch.full((2,), -2.0))
    assert opt.param_groups[0]["lr"] == 0.5
    optimizer_step((3 * w).sum(), opt)  # no scheduler: the lr stays
    assert torch.equal(w.detach(), torch.full((2,), -3.5)) and opt.param_groups[0]["lr"] == 0.5


def test_train_meter_averages_per_example_and_resets():
    meter = TrainMeter("cpu")
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    meter.update(torch.tensor(6.0), logits, torch.tensor([0, 1, 1]))
    meter.update(torch.tensor(2.0, requires_grad=True) * 1, logits[:1], torch.tensor([1]))
    assert meter.seen == 4 and meter.loss == pytest.approx(2.0) and meter.accuracy == pytest.approx(0.5)
    meter.reset()
    assert meter.seen == 0 and meter.loss == 0.0 and meter.accuracy == 0.0
