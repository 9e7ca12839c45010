"""Lars against a hand-written reference (You et al., Algorithm 1, with the
torch.optim.SGD momentum convention), single-tensor and foreach paths."""

import copy
import math

import pytest
import torch
from torch import nn

from hasten.optim import Lars, lars_param_groups


def reference_step(w, g, buf, *, lr, momentum, wd, eta, eps, nesterov, clip, adapt):
    """One LARS step on python lists of floats (one tensor), written from the paper."""
    d = [gi + wd * wi for gi, wi in zip(g, w)]
    wn = math.sqrt(sum(x * x for x in w))
    gn = math.sqrt(sum(x * x for x in g))
    r = 1.0
    if adapt and wn > 0 and gn > 0:
        r = eta * wn / (gn + wd * wn + eps)
        if clip:
            r = min(r / lr, 1.0)
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
]


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_matches_reference_on_random_tensors(case, foreach):
    torch.manual_seed(0)
    params = [torch.randn(5, 3, dtype=torch.float64, requires_grad=True),
              torch.randn(7, dtype=torch.float64, requires_grad=True)]
    lr, eta, eps = 0.7, 0.02, 1e-8
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
