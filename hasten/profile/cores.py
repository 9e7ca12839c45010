"""The CPU cores a profiled job can use: affinity, cgroup quota, and what other jobs leave it.

Before the command starts, :func:`cpu_available` reads the affinity and the cgroup's quota
and runs a 0.3 s busy probe, one process per allowed core, counting the CPU time they got:
on a machine shared with other jobs that is the share left to a competing process, which
the load average does not say. Over the measured window, each instrumented process also
reads what the other processes took of its cores (:mod:`hasten.profile.inject.cpu_window`);
:func:`cores_for_run` puts the two together.

Changes the training math: no.
"""

from __future__ import annotations

import math
import os
import time


def _cgroup_quota() -> float | None:
    """CPU cores the cgroup allows (v2 cpu.max or v1 cfs quota), None when unlimited or unknown."""
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read())
        period = int(open("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def cpu_available(probe_s: float = 0.3) -> dict:
    """CPU cores this job can actually use: affinity, cgroup quota, and a short busy probe.

    The probe runs one busy process per allowed core for ``probe_s`` and counts the CPU
    time they got: on a machine shared with other jobs that is the share left to us,
    which the load average does not say. ``probe_s=0`` skips the probe."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota()
    limit = min(affinity, quota) if quota else float(affinity)
    measured = None
    if probe_s > 0 and hasattr(os, "fork"):
        n = max(1, math.ceil(limit))
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
        elapsed = time.perf_counter() - t0
        measured = total / max(elapsed, 1e-9)
    available = min(limit, measured) if measured is not None else limit
    return {"affinity": affinity, "quota": quota, "probe": measured, "available": max(available, 0.05)}


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
