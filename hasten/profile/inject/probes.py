"""The probes that run outside the training loop's steps: the loader alone, and a batch's hand-off.

- :func:`loader_alone`: batches pulled from the training loader's live iterator with no
  step between (prefetched batches drained first): the time to produce one, and the
  workers' CPU per batch from /proc;
- :func:`handoff`: for a loop without workers, the time to receive a batch from one
  worker process (a DataLoader of :class:`Repeat`): the cost that moving the batches
  into workers would add.

They run once the replayed steps are done, right before the process writes its report
and exits.

Changes the training math: no (the process trains no further).
"""

from __future__ import annotations

import statistics
import time

from hasten.profile.inject.proc_times import pid_cpu_s, runqueue_s
from hasten.profile.inject.state import State


def loader_alone(st: State) -> None:
    """Pull batches from the training loader's iterator with no step between: the time to produce one."""
    if st.train_iter is None:
        return
    it, orig = st.train_iter
    workers = getattr(it, "_num_workers", 0)
    for _ in range(getattr(it, "_prefetch_factor", 0) * workers):  # prefetched batches would come for free
        try:
            orig(it)
        except StopIteration:
            return
    n = max(st.probe_steps, 2)
    times = []
    pids = [w.pid for w in getattr(it, "_workers", [])]
    w0 = [pid_cpu_s(p) for p in pids]
    t0, c0 = time.perf_counter(), time.process_time()
    while len(times) < n:
        t, rq = time.perf_counter(), runqueue_s()
        try:
            orig(it)
        except StopIteration:
            break
        times.append(time.perf_counter() - t - (runqueue_s() - rq))
    wall, cpu, got = time.perf_counter() - t0, time.process_time() - c0, len(times)
    w1 = [pid_cpu_s(p) for p in pids]
    if got:
        batch_s = statistics.median(times) if workers == 0 else wall / got
        wcpu = None
        if pids and None not in w0 and None not in w1:
            wcpu = (sum(w1) - sum(w0)) / got
        st.loader_probe = {"batches": got, "batch_s": batch_s, "main_cpu_s": cpu / got, "worker_cpu_s": wcpu,
                           "workers": workers}


class Repeat:
    """A map-style dataset of one cached batch (module level: spawned workers must import it)."""

    def __init__(self, batch, n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return self.batch


def handoff(st: State) -> None:
    """Seconds the loop would pay per batch to receive it from a worker process (loops without workers)."""
    batch = st.cached if st.cached is not None else st.model_args
    if batch is None or (st.train_iter is not None and getattr(st.train_iter[0], "_num_workers", 0)):
        return
    try:
        from torch.utils.data import DataLoader
        n = max(st.probe_steps, 4)
        it = iter(DataLoader(Repeat(batch, n + 4), batch_size=None, num_workers=1))
        for _ in range(3):
            next(it)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            next(it)
            times.append(time.perf_counter() - t)
        st.loader_probe["handoff_s"] = statistics.median(times)
        del it
    except Exception as exc:  # a batch a worker cannot send (CUDA tensors, ...): no estimate
        st.loader_probe["handoff_error"] = repr(exc)
