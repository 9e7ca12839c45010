"""Time accounting from Linux's /proc: run-queue waits of this thread, CPU seconds of a process.

Both give ``0.0`` / ``None`` where /proc is missing (macOS), and the profile goes on with
wall and process times only.

Changes the training math: no.
"""

from __future__ import annotations

import os


def runqueue_s() -> float:
    """Seconds this thread has waited on a run queue: runnable, but another job held the core.

    Wall time less this is the time a span would take on an otherwise idle machine
    (Linux /proc schedstat; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def pid_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process (Linux /proc), else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
