"""Library mode: the same measurements and verdict from a few lines in your own loop.

    prof = Profiler(warmup=5)
    for x, y in prof.wrap(loader):          # times the wait for each batch
        loss = step(x, y)
        prof.step()                          # optional: the step ends here, not at the next batch
    prof.probe_loader(loader)                # optional: the time to produce a batch alone
    prof.probe_step(lambda b: step(*b), (x, y))   # optional: the pure step time on a cached batch
    print(format_report(prof.analyse()))

Without the probes, R is estimated from the loop itself (for a loader without
workers the wait is the production time; the step's work is the step alone),
and the analysis says so in a note. ``hasten profile -- <command>`` needs none of
these lines and adds the communication probe and ``--verify``.

Changes the training math: no (observation only; ``probe_step`` runs extra
steps on one batch, so call it on a copy of the model or at the end of training).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hasten.cores import affinity_cores
from hasten.cpu_time import runqueue_s
from hasten.profile.inject.probes import handoff_time
from hasten.profile.verdict import Analysis, analyse
from hasten.timing import synchronize


class Profiler:
    """Times data wait and step work per batch; ``analyse()`` gives the verdict and fixes."""

    def __init__(self, warmup: int = 5, device: str | None = None) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0; got {warmup}")
        self.warmup = warmup
        self.device = device or "cpu"
        self.records: dict[str, list[dict]] = {"warmup": [], "measure": [], "step_alone": [], "autocast": []}
        self.loader_probe: dict = {}
        self.num_workers = 0
        self.batch_size: int | None = None
        self.dataset_len: int | None = None
        self.batch_bytes = 0
        self._t_request: float | None = None
        self._t_return: float | None = None
        self._cpu_return = 0.0

    def _close(self) -> None:
        if self._t_return is None:
            return
        synchronize(self.device)
        now = time.perf_counter()
        rec = {"wait_s": self._t_return - self._t_request, "work_s": now - self._t_return,
               "cpu_s": time.process_time() - self._cpu_return}
        phase = "warmup" if len(self.records["warmup"]) < self.warmup else "measure"
        self.records[phase].append(rec)
        self._t_return = None

    def wrap(self, loader: Iterable) -> Iterator:
        """Yield ``loader``'s batches, timing the wait for each; the first of each pass is left out."""
        self.num_workers = getattr(loader, "num_workers", 0)
        self.batch_size = getattr(loader, "batch_size", None)
        try:
            self.dataset_len = len(loader.dataset)
        except (AttributeError, TypeError):
            pass
        it = iter(loader)
        first = True
        while True:
            self._close()
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            synchronize(self.device)
            if not first:  # the first batch of a pass waits for worker start-up
                self._t_request, self._t_return = t0, time.perf_counter()
                self._cpu_return = time.process_time()
            elif not self.batch_bytes:
                from hasten.profile.inject.batches import batch_nbytes
                self.batch_bytes = batch_nbytes(batch)
            first = False
            yield batch

    def step(self) -> None:
        """Mark the end of a step (otherwise the next batch request marks it)."""
        self._close()

    def probe_loader(self, loader: Iterable, batches: int = 8) -> float:
        """Seconds to produce one batch with no training in between (a fresh pass over ``loader``)."""
        it = iter(loader)
        first = next(it)  # worker start-up is not steady state
        for _ in range(getattr(it, "_prefetch_factor", 0) * getattr(loader, "num_workers", 0)):
            next(it)  # prefetched batches would come for free
        t0, c0 = time.perf_counter(), time.process_time()
        times = []
        while len(times) < batches:
            t, rq = time.perf_counter(), runqueue_s()
            try:
                next(it)
            except StopIteration:
                break
            times.append(time.perf_counter() - t - (runqueue_s() - rq))
        got = len(times)
        if not got:
            raise ValueError("probe_loader: the loader ran out of batches; pass a loader with more of them")
        # As the zero-code probe (inject.probes.loader_alone): each batch less the time this thread waited
        # for a core, and without workers the median batch, so that another job's burst on a loaded machine
        # is not read as batch making (a mean of wall times read R = 13 and 41 for a true 4 beside load).
        # Workers hand batches out unevenly (prefetched ones come at once): their rate is the whole span's.
        wall = statistics.median(times) if not getattr(loader, "num_workers", 0) else (time.perf_counter() - t0) / got
        self.loader_probe = {"batches": got, "batch_s": wall, "main_cpu_s": (time.process_time() - c0) / got,
                             "worker_cpu_s": None}
        if not getattr(loader, "num_workers", 0):  # what a worker would cost each batch, for a workers fix
            try:
                self.loader_probe["handoff_s"] = handoff_time(first, batches)
            except Exception as exc:  # a batch a worker cannot send (CUDA tensors, ...): no workers fix predicted
                self.loader_probe["handoff_error"] = repr(exc)
        return wall

    def probe_step(self, step_fn: Callable[[Any], Any], batch: Any, steps: int = 8, autocast: bool = False) -> float:
        """Median seconds of ``step_fn(batch)`` replayed on one cached batch: the pure step time."""
        import torch

        phase = "autocast" if autocast else "step_alone"
        self.records[phase] = []
        for _ in range(steps + 1):
            ctx = torch.autocast(device_type=self.device, dtype=torch.bfloat16) if autocast else None
            synchronize(self.device)
            t0, c0 = time.perf_counter(), time.process_time()
            if ctx is not None:
                with ctx:
                    step_fn(batch)
            else:
                step_fn(batch)
            synchronize(self.device)
            self.records[phase].append({"wait_s": 0.0, "work_s": time.perf_counter() - t0,
                                        "cpu_s": time.process_time() - c0})
        return statistics.median(r["work_s"] for r in self.records[phase][1:])

    def analyse(self) -> Analysis:
        """The verdict, fractions, R and ranked fixes (no verification in library mode)."""
        if len(self.records["measure"]) < 3:
            raise ValueError(f"need at least 3 measured steps after {self.warmup} warm-up; "
                             f"got {len(self.records['measure'])}")
        records = dict(self.records)
        notes = []
        if not records["step_alone"]:
            records["step_alone"] = [{**r, "wait_s": 0.0} for r in records["measure"]]
            notes.append("step alone estimated from the loop's own work (no probe_step)")
        probe = self.loader_probe
        if not probe and self.num_workers == 0:
            waits = [r["wait_s"] for r in records["measure"]]
            probe = {"batches": len(waits), "batch_s": sum(waits) / len(waits), "main_cpu_s": None,
                     "worker_cpu_s": None}
            notes.append("batch production time estimated from the loop's waits (no probe_loader)")
        rank = {"rank": 0, "world_size": 1, "device": self.device, "num_workers": self.num_workers,
                "batch_size": self.batch_size, "dataset_len": self.dataset_len, "batch_bytes": self.batch_bytes,
                "cpu_count": affinity_cores(), "warmup": self.warmup, "records": records, "loader_probe": probe,
                "ddp": False, "grad_bytes": 0, "allreduce_times": [], "loadavg": os.getloadavg()}
        a = analyse([rank])
        a.notes += notes
        return a
