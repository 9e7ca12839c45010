"""The cores this job had over the measured window: what the machine's other processes left it.

The busy probe before the command starts (:func:`hasten.cores.cpu_available`) sees
0.3 s; the window is what the verdict is about. At its start and end, the CPU time of each
core the process may run on (``os.sched_getaffinity``) is read from Linux's ``/proc/stat``,
and the job's own CPU (the main process, all its threads, and the training loader's
workers) is taken out of the busy time: the rest is other processes'. Other processes'
time at a lower priority than the job's (a positive nice value, ``/proc/stat``'s ``nice``
column, when the job runs at nice 0) is not counted against it: they yield the cores.

    free cores = allowed cores - other processes' CPU seconds / window seconds

Elsewhere than Linux, or without ``/proc/stat``, nothing is measured (``{}``).

Changes the training math: no.
"""

from __future__ import annotations

import os
import time

from hasten.cpu_time import core_times
from hasten.profile.inject.state import State


def start(st: State) -> dict:
    if not hasattr(os, "sched_getaffinity"):
        return {}
    cpus = os.sched_getaffinity(0)
    times = core_times(cpus)
    if times is None:
        return {}
    return {"cpus": len(cpus), "t0": time.perf_counter(), "own0": time.process_time(), "times0": times,
            "cpu_set": sorted(cpus)}


def finish(st: State, w: dict, worker_cpu_s: float | None) -> dict:
    """The window's cores: allowed, the job's own CPU, other processes', and the free cores they left."""
    if not w:
        return {}
    times = core_times(set(w["cpu_set"]))
    wall = time.perf_counter() - w["t0"]
    if times is None or wall <= 0:
        return {}
    ours = time.process_time() - w["own0"] + (worker_cpu_s or 0.0)
    busy = times["busy_s"] - w["times0"]["busy_s"]
    niced = times["niced_s"] - w["times0"]["niced_s"]
    yielding = niced if os.getpriority(os.PRIO_PROCESS, 0) <= 0 else 0.0  # lower-priority jobs yield to ours
    others = max(0.0, busy - ours - yielding)
    return {"cores": w["cpus"], "wall_s": wall, "ours_s": ours, "busy_s": busy, "others_s": others,
            "free": max(0.0, w["cpus"] - others / wall)}
