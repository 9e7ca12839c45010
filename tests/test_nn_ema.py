import pytest
import torch

from hasten.nn.ema import Lookahead, WeightAverage, airbench_decay_schedule, warmup_decay


def test_weight_average_update_and_lookahead_copy_back():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    ema, look = WeightAverage(model), Lookahead(model)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model, decay=0.9)
    assert torch.allclose(ema.state["weight"], torch.full((1, 2), 0.1))
    assert torch.equal(model.weight, torch.ones(1, 2))  # EMA leaves the model alone
    look.update(model, decay=0.75)
    assert torch.allclose(model.weight, torch.full((1, 2), 0.25))  # Lookahead pulls it back
    with pytest.raises(ValueError, match="decay"):
        ema.update(model, 1.5)


def test_airbench_decay_schedule_rises_to_its_cap():
    s = airbench_decay_schedule(100)
    assert s[0] == 0 and torch.isclose(s[-1], torch.tensor(0.95 ** 5)) and (s.diff() >= 0).all()


def test_warmup_decay_starts_low_and_caps():
    assert warmup_decay(0.99, 0) == pytest.approx(0.1)
    assert warmup_decay(0.99, 10) == pytest.approx(11 / 20)
    assert warmup_decay(0.99, 10_000) == 0.99


def test_weight_average_follows_the_hand_recurrence_over_parameters_and_float_buffers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    start = {k: v.clone().double() for k, v in model.state_dict().items() if v.is_floating_point()}
    ema, look = WeightAverage(model), Lookahead(model)
    assert set(ema.state) == set(start)  # num_batches_tracked (an int) is left out
    expected = dict(start)
    for decay in (0.5, 0.9, 0.0, 1.0, 0.3):
        model.train()(torch.randn(8, 3))  # moves the BN running statistics
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        current = {k: v.double() for k, v in model.state_dict().items() if v.is_floating_point()}
        expected = {k: decay * expected[k] + (1 - decay) * current[k] for k in expected}
        ema.update(model, decay)
        for k in expected:
            assert torch.allclose(ema.state[k].double(), expected[k], atol=1e-6), k
    target = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    ema.copy_to(target)
    for k in expected:
        assert torch.allclose(target.state_dict()[k].double(), expected[k], atol=1e-6)
    # Lookahead: after an update the model holds the average, and keeps training from there
    look.update(model, 0.6)
    for k, v in model.state_dict().items():
        if v.is_floating_point():
            assert torch.equal(v, look.state[k])
    with pytest.raises(ValueError, match="decay"):
        ema.update(model, -0.1)


def test_airbench_decay_schedule_values():
    s = airbench_decay_schedule(8)
    assert len(s) == 9
    for step in range(9):
        assert s[step].item() == pytest.approx(0.95 ** 5 * (step / 8) ** 3, rel=1e-6)


def test_average_keeps_its_own_precision_when_the_model_changes_dtype():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    ema = WeightAverage(model)  # float32 state
    model.to(torch.bfloat16)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model, 0.75)
    assert ema.state["weight"].dtype == torch.float32 and torch.equal(ema.state["weight"], torch.full((1, 2), 0.25))
