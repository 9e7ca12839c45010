"""Data-parallel training helpers: torchrun setup, DDP with a chosen all-reduce, seeding.

Training code needs four things, in this order::

    info = init_distributed()                 # reads torchrun's env; world size 1 without it
    seed_everything(0, rank=info.rank)        # same init everywhere, different augmentation
    model = wrap_ddp(model.to(info.device), hook="ring", compress=None)
    ...                                       # each rank trains on global_batch // world_size
    shutdown()

Launch with ``torchrun --nproc-per-node N train.py``; gloo on CPU, NCCL on CUDA.

Changes the training math: no. N ranks with local batch B/N and averaged gradients
take the same steps as one process with batch B (up to float rounding); only
``compress="bf16"`` rounds the gradients (see ``hasten.distributed.hooks``).
"""

from __future__ import annotations

import gc
import os
import random
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hasten.distributed.hooks import COMPRESSIONS, HOOKS, register_allreduce_hook
from hasten.errors import ConfigError

DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ranks, the device it should use, the backend (None: single process)."""
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def init_distributed(backend: str | None = None, device: str = "auto",
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> DistInfo:
    """Initialise torch.distributed from torchrun's environment and return this rank's DistInfo.

    ``backend``: None picks NCCL when CUDA is used, gloo otherwise. ``device``:
    "auto" | "cpu" | "cuda"; on CUDA each rank takes GPU ``LOCAL_RANK`` (its place on
    its node, not its global rank), and more processes per node than visible GPUs is
    a ``ConfigError`` (see :func:`rank_device`).
    Without torchrun (no WORLD_SIZE, or WORLD_SIZE=1) no process group is made and
    ``wrap_ddp`` returns the model unchanged. ``timeout_s`` bounds how long a
    collective waits for a dead or stuck peer. Calling it again is harmless.
    """
    if backend not in (None, "gloo", "nccl"):
        raise ConfigError(f"backend must be None, 'gloo' or 'nccl', got {backend!r}")
    if timeout_s <= 0:
        raise ConfigError(f"timeout_s must be positive, got {timeout_s}")
    local_rank = _env_int("LOCAL_RANK", 0)
    dev = rank_device(device, local_rank, _env_int("LOCAL_WORLD_SIZE", local_rank + 1))
    use_cuda = dev.type == "cuda"
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    if use_cuda:
        torch.cuda.set_device(dev)
    if world_size == 1 and not dist.is_initialized():
        return DistInfo(0, 1, 0, dev, None)
    backend = backend or ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not use_cuda:
        raise ConfigError("backend 'nccl' needs CUDA; use 'gloo' on CPU")
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s), store=_restart_store(timeout_s),
                                **({"device_id": dev} if use_cuda else {}))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev, dist.get_backend())


def rank_device(device: str, local_rank: int, local_world_size: int) -> torch.device:
    """The device of the process with ``local_rank`` among ``local_world_size`` on its node.

    "cpu": the CPU. "cuda": GPU ``local_rank``. "auto": CUDA when torch sees a GPU,
    else the CPU. Every process of a node checks the node's count, not only its own
    index, so with 2 processes and 1 GPU both stop with the same line before any
    process group is made: none is left waiting for a peer that died with "invalid
    device ordinal" deep inside CUDA.
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for, but torch sees no CUDA device; use --device cpu")
    gpus = torch.cuda.device_count()
    if max(local_rank + 1, local_world_size) > gpus:
        raise ConfigError(
            f"local rank {local_rank} of {local_world_size} processes on this node needs a GPU of its own, but "
            f"torch sees {gpus} CUDA device{'s' if gpus != 1 else ''}; start at most {gpus} process"
            f"{'es' if gpus != 1 else ''} per node (torchrun --nproc-per-node {gpus}) or train on the CPU "
            f"with --device cpu")
    return torch.device("cuda", local_rank)


def _restart_store(timeout_s: float) -> dist.Store | None:
    """Under torchrun, the store its agent hosts, with keys prefixed by the restart count; else
    None (init_process_group makes its own).

    torchrun's agent keeps one store for the whole job, and after a restart the new
    workers would find the addresses the dead ones published there: gloo then connects
    to ports nobody listens on ("Gloo connectFullMesh failed ... Connection refused",
    torch 2.13, 3 ranks). A prefix per restart keeps each attempt's keys apart."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], _env_int("MASTER_PORT", 0), _env_int("WORLD_SIZE", 1),
                          is_master=False, timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(f"hasten/restart_{_env_int('TORCHELASTIC_RESTART_COUNT', 0)}", store)


def shutdown() -> None:
    """Destroy the process group if one exists (safe to call always). Call it at the end of
    every distributed program.

    Why, and why the garbage collection first: a group still alive when Python exits can
    abort the exit. gloo's worker threads release their finished work there, and a work
    that holds a Python object then takes the GIL from a finalizing interpreter ("terminate
    called without an active exception", SIGABRT, in ProcessGroupGloo::AsyncWork's
    destructor; pytorch/pytorch#190489). On torch 2.13 the DDP loop of docs/train.md,
    2 ranks under torchrun beside two busy processes, aborted 11 exits in 78 with plain
    ``destroy_process_group`` at its end and none in 28 with the collection before it."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def seed_everything(seed: int, rank: int = 0, *, per_rank: bool = False) -> int:
    """Seed python, numpy and torch; returns the seed used.

    ``per_rank=False`` (the default) gives every rank the same seed, so models are
    initialised identically and the data order agrees; ``per_rank=True`` uses
    ``seed + rank``, for streams that must differ between ranks (augmentation).
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    used = seed + rank if per_rank else seed
    random.seed(used)
    torch.manual_seed(used)
    try:
        import numpy as np

        np.random.seed(used % 2**32)
    except ImportError:
        pass
    return used


def local_batch_size(global_batch: int, world_size: int) -> int:
    """The per-rank batch for a global batch; it must divide evenly for exact equivalence."""
    if global_batch < 1 or world_size < 1 or global_batch % world_size:
        raise ValueError(f"global batch {global_batch} must be a positive multiple of the "
                         f"world size {world_size}")
    return global_batch // world_size


def shard(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous slice of a global batch (dimension 0)."""
    n = local_batch_size(batch.shape[0], world_size)
    return batch[rank * n:(rank + 1) * n]


def wrap_ddp(model: torch.nn.Module, hook: str = "ring", compress: str | None = None,
             grid=None, timeout_s: float | None = None, noise_scale=None, noise_scale_batch: int = 0,
             **ddp_kwargs) -> torch.nn.Module:
    """Wrap ``model`` in DistributedDataParallel averaging gradients with ``hook``.

    hook: "ring" | "torus" | "naive" (hasten's algorithms, as comm hooks) or
        "native" (the backend's own all_reduce, i.e. plain DDP).
    compress: None or "bf16" (cast gradient buckets to bfloat16 on the wire).
    grid: (rows, columns) or "RxC" for the torus (None: the most square grid).
    timeout_s: per send/recv for hasten's hooks (None: the process group's).
    noise_scale: a ``hasten.optim.noise_scale.NoiseScale`` to measure the gradient noise scale into, from
        each rank's gradient before the all-reduce and the averaged one after it (the wrapped
        DDP gets a ``noise_scale`` attribute, a ``NoiseScaleHook``: call its ``update()`` on
        every rank after each backward); ``noise_scale_batch``: the global batch.
    ddp_kwargs: passed to DistributedDataParallel (device_ids is set for CUDA).

    In a single process (no process group, or world size 1) the model is returned
    unchanged: there is nothing to average.
    """
    if hook not in HOOKS:
        raise ValueError(f"hook must be one of {HOOKS}, got {hook!r}")
    if compress not in COMPRESSIONS:
        raise ValueError(f"compress must be one of {COMPRESSIONS}, got {compress!r}")
    if grid is not None and hook != "torus":
        raise ValueError(f"grid only applies to hook='torus', not {hook!r}")
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    device = next(model.parameters()).device
    if device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [device.index])
    ddp = torch.nn.parallel.DistributedDataParallel(model, **ddp_kwargs)
    custom = hook != "native" or compress is not None  # native uncompressed is plain DDP
    if noise_scale is not None:
        # One comm hook per DDP: the noise-scale one measures around the chosen all-reduce.
        from hasten.distributed.hooks import AllReduceHookState, allreduce_hook
        from hasten.optim.noise_scale import register_noise_scale_hook
        inner = AllReduceHookState(hook, None, grid, compress, timeout_s) if custom else None
        ddp.noise_scale = register_noise_scale_hook(ddp, noise_scale, local_batch_size(
            noise_scale_batch, dist.get_world_size()), inner_hook=allreduce_hook if custom else None,
            inner_state=inner)
    elif custom:
        register_allreduce_hook(ddp, hook, compress=compress, grid=grid, timeout_s=timeout_s)
    return ddp
