"""CPU time, read in one place: of this process, of any process, of the machine's cores.

Every figure that divides work by CPU seconds (the benchmarks' images per CPU-second,
the profiler's worker CPU per batch, the cores other jobs leave) reads its clocks here:

- ``own_cpu_s()``: user + system seconds of this process (all its threads) and of its
  children that have exited and been waited for (``os.times``; a live worker is not in it);
- ``tree_cpu_s()``: this process and its live descendants (``descendants(pid)``: worker
  processes), over a window in steady state, where the workers have not exited;
- ``pid_stat(pid)``, ``pid_cpu_s(pid)``: the fields of ``/proc/<pid>/stat``
  (its parent, session, CPU ticks), and one process's user + system seconds;
- ``core_times(cpus)``: the seconds the machine's cores (or a set of them) spent busy,
  niced and idle since boot, from ``/proc/stat``;
- ``runqueue_s()``: the seconds this thread waited on a run queue (runnable, but another
  job held the core), from ``/proc/thread-self/schedstat``.

The /proc readers are Linux's; elsewhere (macOS) they give None (``runqueue_s`` 0.0), and
their callers go on with wall and process times. ``/proc/<pid>/stat`` is read as bytes and
split after the last ``)``: the command name between the parentheses may hold spaces,
parentheses and bytes that are not UTF-8.

Standard library only: the profiler's instrumented processes import it.

Changes the training math: no (measurement only).
"""

from __future__ import annotations

import os

__all__ = ["core_times", "descendants", "own_cpu_s", "pid_cpu_s", "pid_stat", "runqueue_s", "tree_cpu_s"]

# Indices into pid_stat's fields (proc(5) numbers them from 1 with pid and comm first).
PPID, SESSION, UTIME, STIME = 1, 3, 11, 12


def own_cpu_s() -> float:
    """User + system seconds of this process and of its exited, waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def pid_stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after ``pid (comm)``: state, ppid, pgrp, session, ...,
    utime, stime (indices ``PPID``, ``SESSION``, ``UTIME``, ``STIME``); None where the process is
    gone, not ours to read, or there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 1:].split()
    except (OSError, ValueError):
        return None


def _ticks_s(fields: list[bytes]) -> float | None:
    try:
        return (int(fields[UTIME]) + int(fields[STIME])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError):
        return None


def pid_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process, all its threads (Linux /proc), else None."""
    fields = pid_stat(pid)
    return None if fields is None else _ticks_s(fields)


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, their children, ...); [] off Linux.

    Read from each thread's ``/proc/<pid>/task/<tid>/children`` where the kernel has them
    (CONFIG_PROC_CHILDREN; a few files, cheap enough to sample many times a second), else
    from every process's parent in /proc."""
    if os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        out, todo = [], [pid]
        while todo:
            p = todo.pop()
            try:
                for task in os.listdir(f"/proc/{p}/task"):
                    with open(f"/proc/{p}/task/{task}/children") as f:
                        kids = [int(c) for c in f.read().split()]
                    out += kids
                    todo += kids
            except (OSError, ValueError):
                pass  # ended meanwhile
        return out
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    parent = {p: int(fields[PPID]) for p in pids if (fields := pid_stat(p)) is not None and len(fields) > PPID}
    ours, grew = {pid}, True
    while grew:
        grew = False
        for p, ppid in parent.items():
            if ppid in ours and p not in ours:
                ours.add(p)
                grew = True
    return sorted(ours - {pid})


def tree_cpu_s() -> float:
    """User + system seconds of this process (all its threads) and of its live descendants.

    ``own_cpu_s`` counts a worker process only once it has exited; here workers count while
    they run, so a window in steady state gets their CPU. Off Linux, this process alone."""
    t = os.times()
    return t.user + t.system + sum(pid_cpu_s(p) or 0.0 for p in descendants(os.getpid()))


def core_times(cpus: set[int] | None = None) -> dict | None:
    """Seconds since boot of the machine's cores (of the cores numbered in ``cpus``; all for
    None), summed: ``busy_s`` (all but idle and iowait; niced time included), of it ``niced_s``
    (processes at a positive nice value), and ``idle_s`` (idle and iowait). None without
    ``/proc/stat``. Guest time is inside user time already, so it is not added again."""
    try:
        with open("/proc/stat") as f:
            if cpus is None:
                rows = [f.readline().split()]
                if rows[0][:1] != ["cpu"]:
                    return None
            else:
                rows = [line.split() for line in f if line.startswith("cpu") and not line.startswith("cpu ")]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    busy = niced = idle = 0
    for row in rows:
        try:
            if cpus is not None and int(row[0][3:]) not in cpus:
                continue
            user, nice, system, idle_, iowait, irq, softirq = (int(x) for x in row[1:8])
            steal = int(row[8]) if len(row) > 8 else 0
        except (ValueError, IndexError):
            return None
        busy += user + nice + system + irq + softirq + steal
        niced += nice
        idle += idle_ + iowait
    return {"busy_s": busy / tick, "niced_s": niced / tick, "idle_s": idle / tick}


def runqueue_s() -> float:
    """Seconds this thread has waited on a run queue: runnable, but another job held the core.

    Wall time less this is the time a span would take on an otherwise idle machine
    (Linux /proc schedstat; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
