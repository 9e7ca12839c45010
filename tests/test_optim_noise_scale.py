"""The gradient noise scale B_simple = tr(Sigma) / |G|^2 (hasten.optim.noise_scale):
the unbiased two-batch estimates, the estimate on a problem whose gradient covariance
is known, and under DDP (2 gloo ranks) the same value as one process computes from the
same micro-batches."""

import math

import pytest
import torch
from torch import nn

from hasten.distributed import data_parallel as dp
from hasten.harness.launch import spawn
from hasten.optim.noise_scale import NoiseScale, micro_batch_sq_norms, suggest_batch


def test_unbiased_estimates_invert_the_expected_norms():
    g2, trace = 2.0, 300.0
    small, big = g2 + trace / 16, g2 + trace / 256  # E|G_B|^2 = |G|^2 + tr(Sigma) / B
    est_g2, est_trace = NoiseScale.unbiased(small, big, 16, 256)
    assert est_g2 == pytest.approx(g2) and est_trace == pytest.approx(trace)
    with pytest.raises(ValueError):
        NoiseScale.unbiased(small, big, 256, 16)
    with pytest.raises(ValueError):
        NoiseScale(beta=1.0)


def test_nan_until_the_smoothed_gradient_is_positive_and_state_round_trips():
    est = NoiseScale()
    assert math.isnan(est.b_simple) and math.isnan(est.b_simple_window)
    est.update(1.0, 1.0, 8, 64)  # no noise, |G|^2 = 1
    assert est.b_simple == pytest.approx(0.0)
    est.update(0.5, 2.0, 8, 64)  # a negative |G|^2 estimate is kept in the average, not dropped
    other = NoiseScale()
    other.load_state_dict(est.state_dict())
    assert other.b_simple == est.b_simple and other.b_simple_window == est.b_simple_window


class _LinearProbe(nn.Module):
    """out_i = w . v_i; with loss = -mean(out) the per-example gradient is -v_i."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(d))

    def forward(self, v):
        return v @ self.w


@pytest.mark.parametrize("b_small,k", [(16, 4), (64, 8)])
def test_estimate_within_ten_percent_of_a_known_covariance(b_small, k):
    # Per-example gradients v_i ~ N(G, diag(sd^2)): tr(Sigma) = sum sd^2, known exactly.
    g = torch.Generator().manual_seed(0)
    d = 40
    G = torch.randn(d, generator=g) * 0.2
    sd = torch.rand(d, generator=g) * 1.5 + 0.1
    truth = float((sd ** 2).sum() / (G @ G))  # B_simple of the problem
    model = _LinearProbe(d)
    est = NoiseScale(beta=0.99)

    def loss_fn(out, _):
        return -out.mean()

    for _ in range(600):
        v = G + torch.randn(k * b_small, d, generator=g) * sd
        y = torch.zeros(len(v))
        small, big = micro_batch_sq_norms(model, loss_fn, list(zip(v.split(b_small), y.split(b_small))))
        est.update(small, big, b_small, k * b_small)
    assert est.b_simple == pytest.approx(truth, rel=0.10)
    assert est.b_simple_window == pytest.approx(truth, rel=0.10)
    assert est.trace == pytest.approx(float((sd ** 2).sum()), rel=0.10)


def test_probe_leaves_grads_and_batchnorm_statistics_untouched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(32, 5), torch.randint(0, 3, (32,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    small, big = micro_batch_sq_norms(model, nn.functional.cross_entropy, list(zip(x.split(8), y.split(8))))
    assert small > big > 0  # the mean of 4 noisy gradients is shorter than each
    assert all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert model[1].momentum == 0.1


def test_suggested_batch_is_the_nearest_power_of_two_with_a_reason():
    assert suggest_batch(2500.0, 256)[0] == 2048 and "below" in suggest_batch(2500.0, 256)[1]
    assert suggest_batch(300.0, 8192)[0] == 256 and "above" in suggest_batch(300.0, 8192)[1]
    assert suggest_batch(900.0, 1024)[0] == 1024 and "near" in suggest_batch(900.0, 1024)[1]
    assert suggest_batch(math.nan, 512) == (512, suggest_batch(math.nan, 512)[1])


# --- DDP: per-rank gradients before the all-reduce and the averaged one ------------------

STEPS, LOCAL, WORLD = 5, 6, 2


def _net():
    dp.seed_everything(0)
    return nn.Sequential(nn.Linear(7, 12), nn.BatchNorm1d(12), nn.Tanh(), nn.Linear(12, 3))


def _batches():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(STEPS, WORLD * LOCAL, 7, generator=g)
    return x, (x[..., :3] * 2 + torch.randn(STEPS, WORLD * LOCAL, 3, generator=g)).argmax(-1)


def _single_process():
    """One process: the same micro-batches (one per rank), their mean, the same SGD steps."""
    model, est = _net(), NoiseScale(beta=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    x, y = _batches()
    for s in range(STEPS):
        micro = list(zip(x[s].split(LOCAL), y[s].split(LOCAL)))
        small, big = micro_batch_sq_norms(model, nn.functional.cross_entropy, micro)
        est.update(small, big, LOCAL, WORLD * LOCAL, s + 1)
        opt.zero_grad()
        # The DDP step's gradient: the mean of the micro-batches' (each with its own BN).
        sum(nn.functional.cross_entropy(model(a), b) for a, b in micro).div(WORLD).backward()
        opt.step()
    return est.history


def _ddp_worker(rank, world, hook):
    est = NoiseScale(beta=0.5)
    ddp = dp.wrap_ddp(_net(), hook=hook, noise_scale=est, noise_scale_batch=world * LOCAL, bucket_cap_mb=0.0002)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.3)
    x, y = _batches()
    for s in range(STEPS):
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(dp.shard(x[s], rank, world)), dp.shard(y[s], rank, world)).backward()
        ddp.noise_scale.update(s + 1)
        opt.step()
    return est.history


@pytest.mark.multiproc
@pytest.mark.parametrize("hook", ["native", "ring"])
def test_ddp_two_ranks_equal_the_single_process_estimate(hook):
    ref = _single_process()
    assert len(ref) == STEPS and all(math.isfinite(v) for _, v in ref)
    results = spawn(_ddp_worker, WORLD, (hook,), timeout_s=60)
    for history in results:  # every rank holds the same estimate
        assert [s for s, _ in history] == [s for s, _ in ref]
        assert [v for _, v in history] == pytest.approx([v for _, v in ref], rel=1e-4)
