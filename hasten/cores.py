"""The CPU cores a command may use and shares: its affinity and cgroup quota, how many
other processes leave free, how many threads to use, and how OpenMP threads wait.

One answer for the library and the profiler: ``usable_cores`` (a worker pool's size, the
torch thread count) and ``cpu_available`` (the profiler's cores before the command starts)
both read the affinity mask and the cgroup's CPU quota (a container limited to 1.5 CPUs
on a 64-core host has 2 cores to use, not 64).

Why it matters on a shared machine: torch's CPU kernels split each operation over
OpenMP threads that meet at a barrier. With the default wait policy a thread that
reaches the barrier first spins; if the scheduler has lent its partner's core to
another process, it spins for the partner's whole time slice. Measured once on 2
cores beside 2 busy processes (the speedrun's network, batch 256, 20 s each):
1441 ms a step with 2 spinning threads, 1051 ms with 1, and 681 and 706 ms with
``OMP_WAIT_POLICY=PASSIVE``; benchmarks/speedrun_command.py has the whole-command
figures (docs/results/speedrun-cpu.md). Neither changes the training math: only
how threads wait and how many there are (float sums split over another number of
threads may round in another order).

Imports no torch: :func:`prefer_passive_wait` must run before torch loads
OpenMP, which reads the policy once.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hasten.cpu_time import core_times

__all__ = ["CoreShare", "affinity_cores", "cgroup_quota", "core_share", "cores_for_run", "cpu_available",
           "free_cores", "prefer_passive_wait", "quota_capped", "threads_sleep_while_waiting", "usable_cores"]

CGROUP = Path("/sys/fs/cgroup")


def affinity_cores() -> int:
    """Cores this process may run on: its affinity mask where the OS has one (``taskset``,
    a container's cpuset), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cgroup_quota(cgroup: str | os.PathLike = CGROUP) -> float | None:
    """CPUs' worth of time the cgroup allows (v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``, in the folder ``cgroup``); None when unlimited, unreadable or absent.

    A quota limits time, not cores: ``docker run --cpus 1.5`` lets every core run, 150 ms of
    each 100 ms period in all, and a process that keeps more threads busy is throttled."""
    root = Path(cgroup)
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        quota, period = int(quota), int(period)
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cores(cgroup: str | os.PathLike = CGROUP) -> int:
    """Cores this process may keep busy: its affinity, capped by the cgroup's quota
    (:func:`quota_capped`)."""
    return quota_capped(affinity_cores(), cgroup_quota(cgroup))


def quota_capped(cores: int, quota: float | None) -> int:
    """Whole cores to keep busy: ``cores`` capped by a CPU quota rounded up, at least 1. As
    joblib's loky counts them: a quota of 1.5 CPUs gives 2, for two workers that each get three
    quarters of a core do more than one that gets a whole one."""
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def prefer_passive_wait(sample_s: float = 0.5) -> bool:
    """Ask OpenMP threads to sleep rather than spin at barriers when other processes
    keep at least half a core busy now (sampled over ``sample_s`` seconds), unless the
    user set a policy. On an idle machine spinning is faster (no wake-up per barrier):
    a whole ``cpu`` speedrun took 354 s spinning against 412 s sleeping, one run each
    (benchmarks/results/speedrun_command.json). Returns whether it asked: never once
    torch is imported (OpenMP has read its settings by then)."""
    global _first_look
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        return False
    share = free_cores(sample_s, passive=True)
    passive = share.busy >= 0.5
    # The thread count is taken from this same sample (``core_share``): a second look moments later
    # once saw a passing spike (1.2 cores busy) where this one saw none, and a run that spun kept
    # one thread for its 9 minutes.
    _first_look = CoreShare(share.cores, share.busy, share.cores, passive)
    if passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return passive


_first_look: CoreShare | None = None  # what prefer_passive_wait saw, its decision included


def core_share(sample_s: float = 0.5) -> CoreShare:
    """The cores and threads for this process: what :func:`prefer_passive_wait` saw when it chose
    the wait policy (one sample decides both, so they agree), else a sample taken now."""
    if _first_look is not None and _first_look.passive == threads_sleep_while_waiting():
        return _first_look
    return free_cores(sample_s)


def threads_sleep_while_waiting() -> bool:
    """Whether OpenMP threads sleep at barriers in this process: the policy asked for
    (``prefer_passive_wait``) or set by the user."""
    return os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"


@dataclass(frozen=True)
class CoreShare:
    """What other processes left of this process's cores over a short sample."""

    cores: int          # cores this process may use
    busy: float         # cores' worth of time others spent running over the sample
    threads: int        # the torch thread count to use
    passive: bool = True  # whether the threads sleep while they wait (the reason for the count)

    @property
    def free(self) -> float:
        return max(0.0, self.cores - self.busy)

    def line(self) -> str:
        """One line for the start of a command's output."""
        if self.busy < 0.5:
            return (f"threads: {self.threads} ({self.cores} cores, {self.free:.1f} free; waiting threads "
                    f"{'sleep' if self.passive else 'spin'})")
        if self.threads >= self.cores:
            return (f"threads: {self.threads} of {self.cores} cores, although other processes keep {self.busy:.1f} "
                    "busy: the threads sleep while they wait, so the scheduler's share of every core is used "
                    "(--threads N to choose)")
        return (f"threads: {self.threads} of {self.cores} cores: other processes keep {self.busy:.1f} of them busy, "
                "and these threads spin while they wait (OMP_WAIT_POLICY) (--threads N to choose)")


def free_cores(sample_s: float = 0.5, *, cores: int | None = None, passive: bool | None = None) -> CoreShare:
    """Measure how busy the machine is now (the share of all CPUs others used over
    ``sample_s`` seconds, scaled to this process's cores), and pick threads.

    With threads that sleep while they wait (``passive``; default: as this process's
    OpenMP is set), all cores: each thread gets the scheduler's share of its core, and
    one that waits gives its core away instead of holding it. With spinning threads,
    one per core others leave free (a core counts as free while others use less than
    half of it), at least 1: a spinning thread holds a core its partner needs.
    All cores when none are measured busy, or off Linux. The process itself should be
    idle while it samples."""
    cores = usable_cores() if cores is None else cores
    passive = threads_sleep_while_waiting() if passive is None else passive
    before = core_times()
    time.sleep(sample_s)
    after = core_times()
    if before is None or after is None:
        return CoreShare(cores, 0.0, cores, passive)
    # Time of processes at a lowered priority (nice > 0) counts as free: the scheduler gives
    # way to us there (at nice 19 they keep about 1.5%).
    others = (after["busy_s"] - after["niced_s"]) - (before["busy_s"] - before["niced_s"])
    elapsed = (after["busy_s"] + after["idle_s"]) - (before["busy_s"] + before["idle_s"])
    if elapsed <= 0:
        return CoreShare(cores, 0.0, cores, passive)
    busy = others / elapsed * cores
    threads = cores if passive else max(1, min(cores, math.floor(cores - busy + 0.5)))
    return CoreShare(cores, round(busy, 2), threads, passive)


# ----------------------------------------------------------------------------- The profiler's cores
def cpu_available(probe_s: float = 0.3, cgroup: str | os.PathLike = CGROUP) -> dict:
    """The cores a profiled job can use before its command starts: ``affinity``, the cgroup's
    ``quota`` (fractional), the ``probe``'s, and the ``available`` cores (the least of them).

    The probe runs one busy process per allowed core for ``probe_s`` and counts the CPU time
    they got: on a machine shared with other jobs that is the share left to a competing
    process, which the load average does not say. ``probe_s=0`` skips it. Over the measured
    window, each instrumented process also reads what the other processes took of its cores
    (:mod:`hasten.profile.inject.cpu_window`); :func:`cores_for_run` puts the two together."""
    affinity = affinity_cores()
    quota = cgroup_quota(cgroup)
    limit = min(affinity, quota) if quota else float(affinity)
    measured = _busy_probe(max(1, math.ceil(limit)), probe_s) if probe_s > 0 and hasattr(os, "fork") else None
    available = min(limit, measured) if measured is not None else limit
    return {"affinity": affinity, "quota": quota, "probe": measured, "available": max(available, 0.05)}


def _busy_probe(n: int, probe_s: float) -> float:
    """Cores' worth of CPU time that ``n`` forked processes, each spinning for ``probe_s``, got."""
    pipes, pids = [], []
    t0 = time.perf_counter()
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: spin, report its CPU time, leave without cleanup
            try:
                os.close(r)
                end = time.perf_counter() + probe_s
                x = 0
                while time.perf_counter() < end:
                    x += 1
                os.write(w, repr(time.process_time()).encode())
            finally:
                os._exit(0)
        os.close(w)
        pipes.append(r)
        pids.append(pid)
    total = 0.0
    for r, pid in zip(pipes, pids):
        try:
            total += float(os.read(r, 64).decode() or 0)
        except ValueError:
            pass
        os.close(r)
        os.waitpid(pid, 0)
    return total / max(time.perf_counter() - t0, 1e-9)


def cores_for_run(before: dict, window: dict | None) -> dict:
    """The cores the job had over its measured window: the probe's, or the window's free cores if more.

    The window's free cores (allowed cores less other processes' CPU over the window) say that
    other jobs were quieter during the run than in the probe's 0.3 s; they cannot say the
    opposite, because a job that needs little CPU leaves the rest to others, who then seem to
    take it. So the available cores are the larger of the two, capped by the affinity the
    script set for itself (``os.sched_setaffinity`` after start-up) and the quota."""
    out = dict(before)
    if not window:
        return out
    limit = min(x for x in (before.get("affinity"), before.get("quota"), window.get("cores")) if x)
    out.update({f"window_{k}": v for k, v in window.items()})
    seen = [x for x in (window.get("free"), before.get("probe")) if x is not None]
    out["available"] = max(0.05, min(limit, max(seen) if seen else limit))
    return out
