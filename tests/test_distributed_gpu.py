"""NCCL: the algorithms and DDP hooks on CUDA (needs at least 2 GPUs; skipped otherwise)."""

import pytest
import torch
import torch.distributed as dist

from hasten.distributed import naive_allreduce, ring_allreduce, torus_allreduce, wrap_ddp
from hasten.harness.launch import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.multiproc]


def _worker(rank, world):
    bad = []
    for size in (1, 1001, 3 << 20):
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            x = (torch.arange(size, device="cuda") % 7 + rank).to(dtype)
            ref = x.clone()
            dist.all_reduce(ref)
            for name, fn in (("ring", ring_allreduce), ("naive", naive_allreduce),
                             ("torus", torus_allreduce)):
                y = x.clone()
                fn(y)
                if not torch.equal(y, ref):
                    bad.append((name, size, str(dtype)))
    torch.manual_seed(0)
    grads = {}
    for hook in ("native", "ring", "torus", "naive"):
        torch.manual_seed(0)
        model = wrap_ddp(torch.nn.Linear(64, 8).cuda(), hook=hook)
        model(torch.randn(16, 64, device="cuda") * (rank + 1)).sum().backward()
        grads[hook] = model.module.weight.grad.cpu()
    for hook in ("ring", "torus", "naive"):
        if not torch.allclose(grads[hook], grads["native"], rtol=1e-5, atol=1e-6):
            bad.append(("ddp", hook))
    return bad


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs 2 GPUs for 2 ranks")
def test_nccl_algorithms_and_hooks_match_native():
    world = min(torch.cuda.device_count(), 4)
    for rank, bad in enumerate(spawn(_worker, world, backend="nccl", start_method="spawn")):
        assert bad == [], f"rank {rank}: {bad}"
