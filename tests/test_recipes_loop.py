"""The one training loop (hasten.recipes.loop): the same weights as a loop written out by
hand, its hooks at their places in the step, and its ways to stop."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hasten.recipes.loop import train_loop


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _batches(n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(n)]


def _optimizer(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 10)


def test_the_loop_with_hooks_gives_the_weights_of_a_hand_written_loop():
    # By hand, as the recipes were written before they shared the loop: the sweep's lr set
    # before the forward, a probe between backward and update, the schedule after the step.
    ref = _model()
    opt, sched = _optimizer(ref)
    seen_by_hand = []
    for i, (x, y) in enumerate(_batches()):
        for g in opt.param_groups:
            g["lr"] *= 1.0 + 0.01 * i
        loss = F.cross_entropy(ref(x), y, label_smoothing=0.1, reduction="none")
        opt.zero_grad(set_to_none=True)
        loss.mean().backward()
        seen_by_hand.append(ref[0].weight.grad.clone())
        opt.step()
        sched.step()

    model = _model()
    opt, sched = _optimizer(model)
    seen = []

    def lr_before_forward(s):
        for g in opt.param_groups:
            g["lr"] *= 1.0 + 0.01 * s.number

    steps = train_loop(model, opt, _batches(), lambda out, y: F.cross_entropy(out, y, label_smoothing=0.1,
                                                                               reduction="none"),
                       scheduler=sched, before_forward=lr_before_forward,
                       before_update=lambda s: seen.append(model[0].weight.grad.clone()))
    assert steps == 7
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(seen, seen_by_hand)) and len(seen) == 7


def test_each_hook_sees_the_step_at_its_place():
    model = _model()
    opt, _ = _optimizer(model)
    events = []

    def weights():
        return model[0].weight.detach().clone()

    def before_forward(s):
        events.append(("forward", s.number, s.logits is None, s.extra))
        s.start = weights()

    def before_backward(s):
        events.append(("backward", s.number, s.loss.dim() == 0))
        assert s.loss.requires_grad and s.logits.shape == (16, 3)

    def before_update(s):
        events.append(("update", s.number))
        assert model[0].weight.grad is not None and torch.equal(weights(), s.start)

    def after_step(s):
        events.append(("after", s.number))
        assert not torch.equal(weights(), s.start)

    batches = [(x, y, "copies") for x, y in _batches(2)]
    train_loop(model, opt, batches, F.cross_entropy, step=5, before_forward=before_forward,
               before_backward=before_backward, before_update=before_update, after_step=after_step)
    assert events == [("forward", 5, True, ("copies",)), ("backward", 5, True), ("update", 5), ("after", 6),
                      ("forward", 6, True, ("copies",)), ("backward", 6, True), ("update", 6), ("after", 7)]


@pytest.mark.parametrize("how", ["after_step", "stop_after"])
def test_the_loop_stops_when_told_and_closes_the_batches_at_once(how):
    closed = []

    def batches():
        try:
            yield from _batches(10)
        finally:
            closed.append(True)

    model = _model()
    opt, _ = _optimizer(model)
    kw = {"after_step": lambda s: s.number == 3} if how == "after_step" else {"stop_after": 3}
    assert train_loop(model, opt, batches(), F.cross_entropy, **kw) == 3
    assert closed == [True]


def test_a_per_example_loss_trains_on_its_mean():
    torch.manual_seed(0)
    a, b = _model(), _model()
    for model, loss_fn in [(a, lambda out, y: F.cross_entropy(out, y, reduction="none")), (b, F.cross_entropy)]:
        opt, _ = _optimizer(model)
        train_loop(model, opt, _batches(3), loss_fn)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)
