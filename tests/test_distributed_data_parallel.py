"""Data-parallel training with each hook follows the single-process loss trajectory."""

import pytest
import torch
import torch.distributed as dist

from hasten.distributed import data_parallel as dp
from hasten.harness.launch import spawn

STEPS, GLOBAL_BATCH, SEED = 6, 24, 0
HOOK_CASES = [("native", None), ("ring", None), ("torus", None), ("naive", None),
              ("ring", "bf16"), ("native", "bf16")]


def _data():
    g = torch.Generator().manual_seed(123)
    x = torch.randn(STEPS, GLOBAL_BATCH, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(-1)  # learnable labels
    return x, y


def _model():
    dp.seed_everything(SEED)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _train(model, rank, world):
    """Losses of the global batch at each step (local losses averaged over ranks)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    x, y = _data()
    losses = []
    for step in range(STEPS):
        loss = torch.nn.functional.cross_entropy(model(dp.shard(x[step], rank, world)),
                                                 dp.shard(y[step], rank, world))
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        if world > 1:
            dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def _first_grads(ddp, rank, world):
    x, y = _data()
    torch.nn.functional.cross_entropy(ddp(dp.shard(x[0], rank, world)),
                                      dp.shard(y[0], rank, world)).backward()
    return [p.grad.clone() for p in ddp.parameters()]


def _worker(rank, world):
    out = {}
    for hook, compress in HOOK_CASES:
        # A tiny bucket cap splits the model over several buckets, so the hook runs per bucket.
        ddp = dp.wrap_ddp(_model(), hook=hook, compress=compress, bucket_cap_mb=0.0005)
        out[(hook, compress)] = (_train(ddp, rank, world), )
        grads = _first_grads(dp.wrap_ddp(_model(), hook=hook, compress=compress,
                                         bucket_cap_mb=0.0005), rank, world)
        out[(hook, compress)] += (grads,)
    return out


@pytest.fixture(scope="module")
def reference():
    model = _model()
    losses = _train(model, 0, 1)
    x, y = _data()
    model = _model()
    torch.nn.functional.cross_entropy(model(x[0]), y[0]).backward()
    return losses, [p.grad.clone() for p in model.parameters()]


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 4])
def test_loss_trajectory_matches_single_process(world, reference):
    ref_losses, ref_grads = reference
    assert ref_losses[-1] < ref_losses[0] - 0.05, "the reference run must actually learn"
    results = spawn(_worker, world, timeout_s=60)
    for (hook, compress), (losses, grads) in results[0].items():
        # bf16 compression is checked value by value in test_bf16_compression_gives_the_bf16_sum;
        # here only that training with it follows the same trajectory.
        tol = 2e-2 if compress else 1e-5
        assert losses == pytest.approx(ref_losses, rel=tol, abs=tol), (hook, compress)
        for g, ref in zip(grads, ref_grads):
            assert torch.allclose(g, ref, rtol=tol, atol=tol), (hook, compress)
    for other in results[1:]:  # every rank holds the same averaged gradients
        for key, (_, grads) in other.items():
            for g, g0 in zip(grads, results[0][key][1]):
                assert torch.equal(g, g0), key


def test_single_process_without_torchrun(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    info = dp.init_distributed(device="cpu")
    assert (info.rank, info.world_size, info.backend, info.is_main) == (0, 1, None, True)
    model = _model()
    assert dp.wrap_ddp(model, hook="ring") is model


@pytest.mark.parametrize("kwargs, match", [
    ({"hook": "tree"}, "hook must be one of"),
    ({"compress": "fp8"}, "compress must be one of"),
    ({"hook": "ring", "grid": (2, 2)}, "grid only applies"),
])
def test_wrap_ddp_rejects_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dp.wrap_ddp(_model(), **kwargs)


def test_batch_helpers_and_seeding():
    assert dp.local_batch_size(24, 4) == 6
    with pytest.raises(ValueError, match="multiple of the world size 5"):
        dp.local_batch_size(24, 5)
    assert torch.equal(dp.shard(torch.arange(8), 1, 4), torch.tensor([2, 3]))
    assert dp.seed_everything(3, rank=2) == 3 and dp.seed_everything(3, rank=2, per_rank=True) == 5
    dp.seed_everything(7)
    a = torch.rand(3)
    dp.seed_everything(7)
    assert torch.equal(a, torch.rand(3))
    with pytest.raises(ValueError, match="seed"):
        dp.seed_everything(-1)


def _bf16_worker(rank, world):
    """Every rank's own local gradients (computed here for all ranks) and DDP's bf16-averaged ones."""
    x, y = _data()
    local = []
    for r in range(world):
        model = _model()
        torch.nn.functional.cross_entropy(model(dp.shard(x[0], r, world)), dp.shard(y[0], r, world)).backward()
        local.append([p.grad.clone() for p in model.parameters()])
    averaged = {}
    for hook in ("ring", "torus", "naive", "native"):
        ddp = dp.wrap_ddp(_model(), hook=hook, compress="bf16", bucket_cap_mb=0.0005)
        torch.nn.functional.cross_entropy(ddp(dp.shard(x[0], rank, world)),
                                          dp.shard(y[0], rank, world)).backward()
        averaged[hook] = [p.grad.clone() for p in ddp.parameters()]
    return local, averaged


def _bf16_ulp(v: torch.Tensor) -> torch.Tensor:
    """Spacing of bfloat16 numbers (8 significant bits) at magnitude ``v`` (float64)."""
    exponent = torch.floor(torch.log2(v.clamp_min(torch.finfo(torch.bfloat16).tiny)))
    return torch.where(v > 0, torch.exp2(exponent - 7), torch.zeros_like(v))


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 4])
def test_bf16_compression_gives_the_bf16_sum(world):
    """Reference: round each rank's gradient / world to bf16, sum those exactly (float64).
    The hook sums in bf16, so each of its world - 1 additions may round once, by at most half
    an ulp of the sum of magnitudes; rounding to fewer bits, or not communicating, is far off."""
    results = spawn(_bf16_worker, world, timeout_s=60)
    local = results[0][0]
    for rank, (_, averaged) in enumerate(results):
        for hook, grads in averaged.items():
            for i, got in enumerate(grads):
                terms = [local[r][i].div(world).to(torch.bfloat16).double() for r in range(world)]
                exact = sum(terms)
                bound = (world - 1) * 0.5 * _bf16_ulp(sum(t.abs() for t in terms))
                err = (got.double() - exact).abs()
                assert torch.all(err <= bound), (rank, hook, i, (err - bound).max().item())
                # what comes back went over the wire in bf16: every value is a bf16 number
                assert torch.equal(got, got.to(torch.bfloat16).float()), (rank, hook, i)
