"""The CPU cores a command shares: how many other processes leave free, how many
threads to use, and how OpenMP threads wait.

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

__all__ = ["CoreShare", "core_share", "free_cores", "prefer_passive_wait", "threads_sleep_while_waiting", "usable_cores"]


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one: a
    container's limit, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat; None off Linux.
    Time of processes at a lowered priority (nice > 0) counts as free: the
    scheduler gives way to us there (at nice 19 they keep about 1.5%)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    idle = values[1] + values[3] + (values[4] if len(values) > 4 else 0)  # nice + idle + iowait
    total = sum(values[:8])  # guest time is already inside user time
    return total - idle, total


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
    before = _cpu_ticks()
    time.sleep(sample_s)
    after = _cpu_ticks()
    if before is None or after is None or after[1] <= before[1]:
        return CoreShare(cores, 0.0, cores, passive)
    busy = (after[0] - before[0]) / (after[1] - before[1]) * cores
    threads = cores if passive else max(1, min(cores, math.floor(cores - busy + 0.5)))
    return CoreShare(cores, round(busy, 2), threads, passive)
