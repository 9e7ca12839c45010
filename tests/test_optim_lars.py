"""Lars against a hand-written reference (You et al., Algorithm 1, with the
torch.optim.SGD momentum convention), single-tensor and foreach paths."""

import copy
import math

import pytest
import torch
from torch import nn

from hasten.optim import Lars, lars, lars_param_groups


def reference_step(w, g, buf, *, lr, momentum, wd, eta, eps, nesterov, clip, adapt):
    """One LARS step on python lists of floats (one tensor), written from the paper."""
    d = [gi + wd * wi for gi, wi in zip(g, w)]
    wn = math.sqrt(sum(x * x for x in w))
    gn = math.sqrt(sum(x * x for x in g))
    r = 1.0
    if adapt and wn > 0 and gn > 0:
        r = eta * wn / (gn + wd * wn + eps)
        if clip:
            r = min(r / lr, 1.0) if lr > 0 else 1.0  # the limit of min(r / lr, 1) as lr -> 0
    d = [r * x for x in d]
    if momentum > 0:
        buf = list(d) if buf is None else [momentum * b + x for b, x in zip(buf, d)]
        step = [x + momentum * b for x, b in zip(d, buf)] if nesterov else buf
    else:
        step = d
    return [wi - lr * s for wi, s in zip(w, step)], buf


CASES = [
    dict(momentum=0.9, weight_decay=1e-4, nesterov=False, clip=False),
    dict(momentum=0.9, weight_decay=5e-2, nesterov=True, clip=False),
    dict(momentum=0.0, weight_decay=0.0, nesterov=False, clip=False),
    dict(momentum=0.8, weight_decay=1e-3, nesterov=False, clip=True),
    dict(momentum=0.9, weight_decay=1.0, nesterov=False, clip=False),  # decay of exactly 1
    # a large eta makes r / lr > 1 on some tensors, so the clip binds; a large eps shows in r
    dict(momentum=0.5, weight_decay=1e-2, nesterov=False, clip=True, trust_coefficient=2.0, eps=0.5),
]


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_matches_reference_on_random_tensors(case, foreach):
    torch.manual_seed(0)
    params = [torch.randn(5, 3, dtype=torch.float64, requires_grad=True),
              torch.randn(7, dtype=torch.float64, requires_grad=True)]
    case = dict(case)
    lr, eta, eps = 0.7, case.pop("trust_coefficient", 0.02), case.pop("eps", 1e-8)
    opt = Lars(params, lr=lr, trust_coefficient=eta, eps=eps, foreach=foreach, **case)
    ref = [p.detach().flatten().tolist() for p in params]
    bufs = [None, None]
    for _ in range(4):
        grads = [torch.randn_like(p) * 3 for p in params]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads):
            ref[i], bufs[i] = reference_step(
                ref[i], g.flatten().tolist(), bufs[i], lr=lr, momentum=case["momentum"],
                wd=case["weight_decay"], eta=eta, eps=eps, nesterov=case["nesterov"],
                clip=case["clip"], adapt=True,
            )
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.detach().flatten(), torch.tensor(r, dtype=torch.float64))


def test_trust_ratio_changes_the_step_compared_with_sgd():
    p1 = torch.ones(4, requires_grad=True)
    p2 = torch.ones(4, requires_grad=True)
    p1.grad = torch.full((4,), 10.0)
    p2.grad = torch.full((4,), 10.0)
    Lars([p1], lr=1.0, momentum=0.0, trust_coefficient=0.001).step()
    torch.optim.SGD([p2], lr=1.0).step()
    # r = 0.001 * 2 / 20 = 1e-4, so the step is 10 * 1e-4 = 1e-3, not 10.
    torch.testing.assert_close(p1.detach(), torch.full((4,), 1 - 1e-3))
    torch.testing.assert_close(p2.detach(), torch.full((4,), -9.0))


@pytest.mark.parametrize("foreach", [False, True])
def test_zero_norm_parameters_still_update(foreach):
    w = torch.zeros(3, requires_grad=True)  # e.g. a zero-initialised BN scale
    w.grad = torch.tensor([1.0, -2.0, 0.5])
    Lars([w], lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=foreach).step()
    # ||w|| = 0 -> ratio 1 -> plain SGD step.
    torch.testing.assert_close(w.detach(), torch.tensor([-0.1, 0.2, -0.05]))


@pytest.mark.parametrize("foreach", [False, True])
def test_excluded_parameters_get_plain_sgd(foreach):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    twin = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    twin.load_state_dict(model.state_dict())
    groups = lars_param_groups(model, weight_decay=1e-2)
    adapted = {id(p) for p in groups[0]["params"]}
    assert adapted == {id(model[0].weight), id(model[3].weight)}
    lars = Lars(groups, lr=0.5, momentum=0.9, foreach=foreach)
    sgd = torch.optim.SGD(twin.parameters(), lr=0.5, momentum=0.9)
    for _ in range(3):
        # Same gradients for both models: only the update rules differ.
        for p, q in zip(model.parameters(), twin.parameters()):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        lars.step()
        sgd.step()
    for name in ["0.bias", "1.weight", "1.bias", "3.bias"]:
        torch.testing.assert_close(model.state_dict()[name], twin.state_dict()[name])
    assert not torch.allclose(model[0].weight, twin[0].weight)


def test_foreach_and_single_tensor_paths_agree():
    torch.manual_seed(2)
    a = [torch.randn(8, 4, requires_grad=True), torch.zeros(4, requires_grad=True)]
    b = [p.detach().clone().requires_grad_() for p in a]
    oa = Lars(a, lr=0.3, weight_decay=1e-3, nesterov=True, foreach=False)
    ob = Lars(b, lr=0.3, weight_decay=1e-3, nesterov=True, foreach=True)
    for _ in range(3):
        for pa, pb in zip(a, b):
            pa.grad = torch.randn_like(pa)
            pb.grad = pa.grad.clone()
        oa.step()
        ob.step()
    for pa, pb in zip(a, b):
        torch.testing.assert_close(pa, pb)


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(3)
    p = torch.randn(6, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    o1 = Lars([p], lr=0.2, weight_decay=1e-3)
    p.grad = torch.randn(6)
    o1.step()
    o2 = Lars([q], lr=99.0, trust_coefficient=0.5)
    q.data.copy_(p.data)
    o2.load_state_dict(copy.deepcopy(o1.state_dict()))
    assert o2.param_groups[0]["lr"] == 0.2 and o2.param_groups[0]["trust_coefficient"] == 0.001
    g = torch.randn(6)
    p.grad, q.grad = g.clone(), g.clone()
    o1.step()
    o2.step()
    torch.testing.assert_close(p, q)


def test_closure_is_called_and_loss_returned():
    p = torch.ones(2, requires_grad=True)

    def closure():
        p.grad = None
        loss = (p * 3).sum()
        loss.backward()
        return loss

    loss = Lars([p], lr=0.1).step(closure)
    assert loss.item() == 6.0 and not torch.equal(p.detach(), torch.ones(2))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(lr=-0.1), "learning rate: -0.1"),
        (dict(momentum=1.5), "momentum value: 1.5"),
        (dict(weight_decay=-1.0), "weight_decay value: -1.0"),
        (dict(trust_coefficient=0.0), "trust_coefficient: 0.0"),
        (dict(eps=-1e-3), "eps value: -0.001"),
        (dict(momentum=0.0, nesterov=True), "Nesterov"),
    ],
)
def test_invalid_hyperparameters_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Lars([torch.zeros(1, requires_grad=True)], **kwargs)


@pytest.mark.parametrize("foreach", [False, True])
def test_trust_ratio_per_layer_by_hand(foreach):
    """Three layers, each ratio worked out on paper (lr 2, eta 0.01, wd 0.1, eps 0, no momentum)."""
    a = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.6, 0.0, 0.8], dtype=torch.float64, requires_grad=True)
    c = torch.tensor([2.0, 0.0], dtype=torch.float64, requires_grad=True)
    a.grad = torch.tensor([0.3, 0.4], dtype=torch.float64)
    b.grad = torch.tensor([0.0, 0.3, 0.0], dtype=torch.float64)
    c.grad = torch.zeros(2, dtype=torch.float64)
    Lars([a, b, c], lr=2.0, momentum=0.0, weight_decay=0.1, trust_coefficient=0.01, eps=0.0,
         foreach=foreach).step()
    # a: ||w|| = 5, ||g|| = 0.5, r = 0.01 * 5 / (0.5 + 0.1 * 5) = 0.05, d = g + 0.1 w = (0.6, 0.8),
    #    w - 2 * 0.05 * d = (2.94, 3.92)
    torch.testing.assert_close(a.detach(), torch.tensor([2.94, 3.92], dtype=torch.float64))
    # b: norms below 1: ||w|| = 1, ||g|| = 0.3, r = 0.01 / (0.3 + 0.1) = 0.025,
    #    d = (0.06, 0.3, 0.08), step 2 * 0.025 * d = (0.003, 0.015, 0.004)
    torch.testing.assert_close(b.detach(), torch.tensor([0.597, -0.015, 0.796], dtype=torch.float64))
    # c: zero gradient: r = 1 (not 0.01 * 2 / 0.2 = 0.1), d = 0.1 w = (0.2, 0), step (0.4, 0)
    torch.testing.assert_close(c.detach(), torch.tensor([1.6, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("foreach", [False, True])
def test_tensor_whose_gradient_appears_later_gets_its_buffer_then(foreach):
    """Momentum buffers created at different steps (a frozen tensor unfrozen mid-run)."""
    torch.manual_seed(4)
    params = [torch.randn(6, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    hyper = dict(lr=0.5, momentum=0.9, weight_decay=1e-2, nesterov=False, clip=False)
    opt = Lars(params, trust_coefficient=0.05, eps=1e-8, foreach=foreach, **hyper)
    ref = [p.detach().tolist() for p in params]
    bufs = [None] * 3
    for step in range(3):
        for i, p in enumerate(params):
            if i == 1 and step == 0:
                p.grad = None  # no gradient yet: skipped, no buffer
                continue
            p.grad = torch.randn_like(p)
            ref[i], bufs[i] = reference_step(ref[i], p.grad.tolist(), bufs[i], wd=hyper["weight_decay"],
                                             eta=0.05, eps=1e-8, adapt=True,
                                             **{k: v for k, v in hyper.items() if k != "weight_decay"})
        opt.step()
        assert ("momentum_buffer" in opt.state[params[1]]) == (step > 0)
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.detach(), torch.tensor(r, dtype=torch.float64))


@pytest.mark.parametrize("foreach", [False, True])
def test_clipped_step_at_zero_learning_rate_seeds_the_buffer_with_ratio_one(foreach):
    """A warm-up from lr = 0: LARC's min(r / lr, 1) is 1 there, so the buffer holds d, not r * d."""
    torch.manual_seed(5)
    p = torch.randn(8, dtype=torch.float64, requires_grad=True)
    opt = Lars([p], lr=0.0, momentum=0.9, weight_decay=1e-3, trust_coefficient=1e-3, clip=True,
               foreach=foreach)
    ref, buf = p.detach().tolist(), None
    for lr in (0.0, 0.1, 0.3):
        opt.param_groups[0]["lr"] = lr
        p.grad = torch.randn_like(p)
        opt.step()
        ref, buf = reference_step(ref, p.grad.tolist(), buf, lr=lr, momentum=0.9, wd=1e-3, eta=1e-3,
                                  eps=1e-8, nesterov=False, clip=True, adapt=True)
        torch.testing.assert_close(p.detach(), torch.tensor(ref, dtype=torch.float64))


def test_functional_form_without_momentum_allocates_no_buffers():
    p, g = torch.ones(3), torch.full((3,), 0.5)
    bufs = [None]
    for foreach in (False, True):
        lars([p], [g], bufs, lr=0.1, momentum=0.0, weight_decay=0.0, trust_coefficient=1e-3, eps=1e-8,
             nesterov=False, clip=False, adapt=True, foreach=foreach)
        assert bufs == [None]


def test_without_momentum_the_optimizer_keeps_no_state():
    p = torch.ones(3, requires_grad=True)
    p.grad = torch.ones(3)
    opt = Lars([p], momentum=0.0)
    opt.step()
    # as torch.optim.SGD: no buffer to save or restore
    assert all("momentum_buffer" not in s for s in opt.state_dict()["state"].values())


def _spy_on_paths(monkeypatch):
    import importlib

    lars_module = importlib.import_module("hasten.optim.lars")  # the attribute is the function lars
    calls = []
    for name in ("_single_tensor_lars", "_multi_tensor_lars"):
        real = getattr(lars_module, name)
        monkeypatch.setattr(lars_module, name,
                            lambda *a, _name=name, _real=real, **k: (calls.append(_name), _real(*a, **k)))
    return calls


def test_foreach_choice_picks_the_path(monkeypatch):
    calls = _spy_on_paths(monkeypatch)
    for foreach, expected in ((None, "_single_tensor_lars"),  # CPU tensors: default off
                              (False, "_single_tensor_lars"), (True, "_multi_tensor_lars")):
        p = torch.ones(3, requires_grad=True)
        p.grad = torch.ones(3)
        Lars([p], foreach=foreach).step()
        assert calls.pop() == expected, foreach


def test_defaults_are_the_documented_ones():
    # A changed default silently changes every run that relies on it (eta = 0.001 is You et al.'s).
    opt = Lars([torch.zeros(1, requires_grad=True)])
    assert opt.defaults == dict(lr=0.1, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001,
                                eps=1e-8, nesterov=False, clip=False, adapt=True, foreach=None)


def test_boundary_hyperparameters_are_accepted_or_refused():
    p = [torch.zeros(1, requires_grad=True)]
    Lars(p, lr=0.0)
    Lars(p, eps=0.0)
    Lars(p, momentum=0.0)
    with pytest.raises(ValueError, match=r"momentum value: 1.0"):
        Lars(p, momentum=1.0)
    with pytest.raises(ValueError, match=r"^Nesterov momentum requires momentum > 0$"):
        Lars(p, momentum=0.0, nesterov=True)


def test_sparse_gradient_is_refused():
    p = torch.zeros(4, requires_grad=True)
    p.grad = torch.zeros(4).to_sparse()
    with pytest.raises(RuntimeError, match=r"^Lars does not support sparse gradients$"):
        Lars([p]).step()


def test_step_skips_gradientless_tensors_and_groups_but_updates_the_rest():
    frozen, live, other = (torch.ones(2, requires_grad=True) for _ in range(3))
    live.grad, other.grad = torch.ones(2), torch.ones(2)
    opt = Lars([{"params": [torch.ones(2, requires_grad=True)]},  # a group with no gradient at all
                {"params": [frozen, live]}, {"params": [other]}], lr=0.1, momentum=0.0, adapt=False)
    assert opt.step() is None  # no closure, no loss
    assert torch.equal(frozen.detach(), torch.ones(2))
    torch.testing.assert_close(live.detach(), torch.full((2,), 0.9))
    torch.testing.assert_close(other.detach(), torch.full((2,), 0.9))


class ConvNormAct(nn.Module):
    """A block whose class name contains "norm" but which holds a convolution (as timm's does)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1)


class ScaleNorm(nn.Module):
    """A normalisation layer torch does not know, with a 2-D parameter."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(2, 2))


class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))          # 1-D, not a bias, not in a norm layer
        self.bias = nn.Parameter(torch.zeros(2, 3))       # a 2-D bias
        self.frozen = nn.Parameter(torch.ones(3, 3), requires_grad=False)
        self.weight = nn.Parameter(torch.ones(3, 3))      # after the frozen one


def test_param_groups_split_by_kind_not_by_name_alone():
    model = nn.Sequential(ConvNormAct(), ScaleNorm(), Odd())
    adapted, plain = lars_param_groups(model, weight_decay=0.25)
    assert adapted["weight_decay"] == 0.25 and "adapt" not in adapted
    assert plain["weight_decay"] == 0.0 and plain["adapt"] is False
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in adapted["params"]) == ["0.conv.weight", "2.weight"]
    assert sorted(names[id(p)] for p in plain["params"]) == ["0.conv.bias", "1.gain", "2.bias", "2.scale"]


def test_param_groups_apply_decay_only_to_adapted_tensors():
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # zero gradients: only weight decay moves anything
    Lars(lars_param_groups(model, weight_decay=0.5), lr=0.1, momentum=0.0).step()
    after = model.state_dict()
    # Linear weight: g = 0 -> r = 1, d = 0.5 w, w <- w - 0.1 * 0.5 w = 0.95 w
    torch.testing.assert_close(after["0.weight"], 0.95 * before["0.weight"])
    for name in ("0.bias", "1.weight", "1.bias"):
        torch.testing.assert_close(after[name], before[name])


@pytest.mark.gpu
def test_foreach_step_on_cuda_never_syncs_with_the_host():
    params = [torch.randn(64, 32, device="cuda", requires_grad=True), torch.zeros(32, device="cuda", requires_grad=True)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = Lars(params, lr=0.1, weight_decay=1e-4, clip=True)
    opt.step()  # creates the momentum buffers
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_default_on_cuda_is_the_foreach_path(monkeypatch):
    calls = _spy_on_paths(monkeypatch)
    p = torch.ones(3, device="cuda", requires_grad=True)
    p.grad = torch.ones(3, device="cuda")
    Lars([p]).step()
    assert calls == ["_multi_tensor_lars"]
