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
