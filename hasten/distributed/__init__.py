"""Gradient all-reduce for data-parallel training, on torch.distributed.

Algorithms (each usable alone, in place, on any process group):
``ring_allreduce`` (Baidu 2017), ``torus_allreduce`` / ``hierarchical_allreduce``
(Google's 2-D torus, 2018) and ``naive_allreduce`` (the single-reducer baseline),
or any of them by name with ``allreduce(tensor, algo)``; DDP comm hooks
(``hooks``); data-parallel setup (``data_parallel``); an alpha-beta cost model
(``cost_model``). The benchmark harness (local launcher, emulated cluster,
per-rank timing) is ``hasten.harness``.
"""

from hasten.distributed.data_parallel import (DistInfo, init_distributed, local_batch_size, seed_everything,
                                       shard, shutdown, wrap_ddp)
from hasten.distributed.hooks import HOOKS, AllReduceHookState, allreduce, allreduce_hook, register_allreduce_hook
from hasten.distributed.naive import naive_allreduce
from hasten.distributed.p2p import CollectiveError, TensorMismatchError, check_same_tensor
from hasten.distributed.ring import ring_allreduce
from hasten.distributed.torus import default_grid, hierarchical_allreduce, torus_allreduce

__all__ = [
    "HOOKS", "AllReduceHookState", "CollectiveError", "DistInfo", "TensorMismatchError",
    "allreduce", "allreduce_hook", "check_same_tensor", "default_grid", "hierarchical_allreduce",
    "init_distributed", "local_batch_size", "naive_allreduce", "register_allreduce_hook",
    "ring_allreduce", "seed_everything", "shard", "shutdown", "torus_allreduce", "wrap_ddp",
]
