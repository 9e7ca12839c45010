"""Data-parallel training with each hook follows the single-process loss trajectory."""

import pytest
import torch
import torch.distributed as dist

from hasten.distributed import data_parallel as dp
from hasten.errors import ConfigError
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


# --- which device each rank takes (GPUs faked: torch sees n of them, set_device is recorded) ----------

@pytest.fixture
def fake_gpus(monkeypatch):
    """``fake_gpus(n, RANK=.., LOCAL_RANK=.., ...)``: torch sees n CUDA devices and this
    environment; returns the devices set_device was called with. Making a process group
    fails the test unless ``group=True``, which records it instead."""
    def setup(n, group=False, **env):
        for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "TORCHELASTIC_USE_AGENT_STORE"):
            monkeypatch.delenv(var, raising=False)
        for var, value in env.items():
            monkeypatch.setenv(var, str(value))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        calls = {"set_device": [], "group": []}
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls["set_device"].append(torch.device(d)))

        def init_process_group(backend, **kwargs):
            assert group, "no process group may be made"
            calls["group"].append((backend, kwargs.get("device_id")))

        monkeypatch.setattr(dist, "init_process_group", init_process_group)
        if group:
            monkeypatch.setattr(dist, "get_rank", lambda: int(env["RANK"]))
            monkeypatch.setattr(dist, "get_world_size", lambda: int(env["WORLD_SIZE"]))
            monkeypatch.setattr(dist, "get_backend", lambda: calls["group"][0][0])
        return calls
    return setup


@pytest.mark.parametrize("device", ["auto", "cuda"])
@pytest.mark.parametrize("local_rank", [0, 1])
def test_more_processes_per_node_than_gpus_is_one_clear_line(fake_gpus, device, local_rank):
    # torchrun --nproc-per-node 2 on one GPU: both ranks stop before CUDA or a process group
    # is touched (rank 0 too, or it would wait for rank 1 until the timeout).
    calls = fake_gpus(1, WORLD_SIZE=2, RANK=local_rank, LOCAL_RANK=local_rank, LOCAL_WORLD_SIZE=2)
    with pytest.raises(ConfigError) as info:
        dp.init_distributed(device=device)
    msg = str(info.value)
    assert "\n" not in msg and f"local rank {local_rank} of 2 processes" in msg and "sees 1 CUDA device;" in msg
    assert "--nproc-per-node 1" in msg and "--device cpu" in msg
    assert calls["set_device"] == []


def test_a_rank_beyond_the_gpus_is_refused_without_torchruns_local_world_size(fake_gpus):
    fake_gpus(2, WORLD_SIZE=3, RANK=2, LOCAL_RANK=2)
    with pytest.raises(ConfigError, match="local rank 2 of 3 processes .* sees 2 CUDA devices; start at most 2 "
                                          "processes per node"):
        dp.init_distributed()


def test_a_single_process_takes_gpu_0(fake_gpus):
    calls = fake_gpus(1)
    info = dp.init_distributed()
    assert info.device == torch.device("cuda", 0) and info.backend is None
    assert calls["set_device"] == [torch.device("cuda", 0)]


def test_each_rank_takes_the_gpu_of_its_local_rank_not_its_global_rank(fake_gpus):
    # Rank 3 of 4 is the second process of the second node: GPU 1 there.
    calls = fake_gpus(2, group=True, WORLD_SIZE=4, RANK=3, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2)
    info = dp.init_distributed()
    assert info.device == torch.device("cuda", 1) and (info.rank, info.local_rank) == (3, 1)
    assert calls["set_device"] == [torch.device("cuda", 1)]
    assert calls["group"] == [("nccl", torch.device("cuda", 1))]


def test_device_cpu_is_the_way_out_on_a_gpu_machine(fake_gpus):
    calls = fake_gpus(1, group=True, WORLD_SIZE=2, RANK=1, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2)
    info = dp.init_distributed(device="cpu")
    assert info.device == torch.device("cpu") and calls["set_device"] == []
    assert calls["group"] == [("gloo", None)]


def test_cuda_without_a_gpu_is_a_config_error(fake_gpus):
    fake_gpus(0)
    with pytest.raises(ConfigError, match="torch sees no CUDA device; use --device cpu"):
        dp.init_distributed(device="cuda")
    assert dp.init_distributed().device == torch.device("cpu")  # auto


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
