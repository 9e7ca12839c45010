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


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ATen ops run under it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("cls", [WeightAverage, Lookahead])
def test_an_update_is_a_few_multi_tensor_ops_whatever_the_model_size(cls):
    """One foreach op over all tensors (plus one copy back for Lookahead), not one op
    per tensor, and no state_dict walk per update."""
    counts = []
    for layers in (2, 8):
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
                                      for _ in range(layers)])
        average = cls(model)
        model.state_dict = None  # an update must not need it
        with _Ops() as mode:
            average.update(model, 0.5)
        counts.append(mode.ops)
    assert counts[0] == counts[1]  # 4x the tensors, the same ops
    assert counts[0].count("_foreach_lerp_") == 1 and len(counts[0]) <= 4


def test_cached_tensors_follow_the_model_when_its_tensors_are_replaced():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    ema = WeightAverage(model)
    ema.update(model, 0.5)  # caches the model's tensors
    model.double()  # replaces every parameter's data and every buffer object
    with torch.no_grad():
        model[0].weight.fill_(2.0)
        model[1].running_mean.fill_(4.0)
    before = {k: v.clone() for k, v in ema.state.items()}
    ema.update(model, 0.5)
    assert torch.allclose(ema.state["0.weight"], 0.5 * before["0.weight"] + 1.0)
    assert torch.allclose(ema.state["1.running_mean"], 0.5 * before["1.running_mean"] + 2.0)
    ema.copy_to(model)
    assert torch.equal(model[1].running_mean, ema.state["1.running_mean"].double())


def test_the_tensor_lists_are_resolved_once_per_model(monkeypatch):
    import hasten.nn.ema as ema_module

    resolved = []
    real = ema_module._float_state_slots
    monkeypatch.setattr(ema_module, "_float_state_slots", lambda *a: resolved.append(1) or real(*a))
    model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    look = Lookahead(model)
    for _ in range(3):
        look.update(model, 0.5)
    assert len(resolved) == 1
    look.copy_to(other)  # another model: its own lists
    look.update(model, 0.5)
    assert len(resolved) == 3


class _Scaled(torch.nn.Module):
    """A module whose state dict holds a derived tensor, not a parameter or buffer."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "doubled"] = self.w.detach() * 2


def test_custom_state_dict_entries_are_averaged_from_the_state_dict():
    model = torch.nn.Sequential(_Scaled())
    ema = WeightAverage(model)
    assert set(ema.state) == {"0.doubled"}
    with torch.no_grad():
        model[0].w.fill_(1.0)
    ema.update(model, 0.75)
    assert torch.equal(ema.state["0.doubled"], torch.full((3,), 0.5))
