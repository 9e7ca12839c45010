"""What DataLoader workers that share the step's cores cost it, from the measured window's CPU totals.

Issue 32 (item 2): workers that never make the step wait still take its cores. The first
estimate (:func:`hasten.profile.attribution.cpu_use` without a window) set the workers' CPU
against the cores the *replayed* step left idle, its CPU over its wall time in the least
disturbed of 8 replayed steps. On two cores beside a step of two threads that number sat
near 2 and moved with where the scheduler put the workers in each run: 1.79 in one run of
makemore (3 ms of "idle" core time a step, more than the workers' 2 ms: no cost) and 1.99 in
the next (all of it a cost), so the same script read `balanced` in one run of three
(chargpt and makemore with 4 workers, docs/results/profile-real-scripts.md). The replayed
steps themselves ran 1-4 ms slower than the measured ones in some runs (27-30 ms against
23-27 ms for chargpt), so their difference to the measured steps cannot cap the cost either.

Here every number comes from the measured window's steps, the steps the verdict is about.
Per step, with C the cores available, the main process's CPU u (its threads, spinning ones
too, and receiving batches), its wall time t (wait included) and the workers' CPU per step c
(their /proc time over the window by the batches drawn, give or take the batches they hold
made ahead), the cores had

    idle = C x t - u - c                      core-seconds left idle, the workers running

and the workers' CPU that found no idle core, ``lost = max(0, c - idle)``, ran on the step's
own cores. (Where the step alone left idle time the workers then filled, the window cannot
tell that part from a displacement: the estimate errs toward the cost there, by at most c.)
The step is delayed by somewhere between ``lost / k`` (work that divides freely over the k
cores the step keeps busy loses a k-th of each second taken) and ``lost / r``,
r = min(1, C / threads) (torch's intra-op threads meet at a barrier after each op: one
thread off its core holds up the others, and where other jobs leave fewer cores than
threads a second taken is more than a second of the step's). The estimate is the middle of
the two, the interval their ends at the ends of idle's interval (Student's t over the
steps) and c's: what the verdict's dead band and the stopping rule
(:func:`hasten.profile.inject.phases.data_share`) weigh, so that a run whose numbers cannot
tell yet goes on measuring. On the benchmark's truths (the steps as run against the same
with the data made free, alternating in one process) the delay was about half the workers'
CPU for chargpt (c 1.7 ms, 0.5-0.9 ms) and all of it for makemore (c 2 ms, about 2.1 ms),
both saturated windows: within the two ends. On one core (tests/profile_scripts/
pinned_workers.py) both ends are c: the step and the workers take turns.

**The loop thread held off its core** (issue 43, item 8). ``idle`` above takes every idle
core-second of the window as room the workers could have run in instead of the step's
cores. The scheduler does not work that way: a worker handed its next indices is runnable
at once and shares the cores with the step's threads, whatever idle time comes later; with
more runnable workers than idle cores (4 decoding workers on 2 cores) they run on the step's
cores while idle time is still to come. And the window's idle time is partly *made* by the
workers: while one of torch's threads is off its core, the others wait at the op's barrier
and their cores go idle. So ``c - idle`` can be 0 where the workers cost the step a quarter
of its time: pytorch/examples' imagenet (ImageFolder, 4 workers, 1000x750 JPEGs, 2 cores)
read 10-12% of the step, x1.11-1.14, where the step as run against the same with the data
made free gave 27-29%, x1.37-1.39. What the window did measure is the loop's own thread
held in the run queue (runnable, another process on its core: Linux schedstat, ``queued``,
each step's work less its ``own_s``); the thread issues every op and joins every barrier,
so each second of it is a second of the step. Of it, the workers' part is their share of
the CPU that competed for the cores (theirs, ``c``, against other processes', ``others``,
per step): ``held = queued x c / (c + others)``. That is a measured lower end of the delay,
and the estimate and both ends of its interval are at least ``held`` (a second of torch's
other threads held off costs the step too, unmeasured: the estimate can still err low).

Standard library only: every instrumented process imports it.

Changes the training math: no (analysis only).
"""

from __future__ import annotations

import math

from hasten.stats import t_quantile


def workers_delay(c: tuple[float, float, float], cpu: list[float], spans: list[float], own_cpu: list[float],
                  work: list[float], cores: float, threads: int, idle_seen: float | None = None, *,
                  queued: list[float] | None = None, others: float = 0.0) -> dict:
    """The delay the workers' CPU adds to a step, per step, with its interval (see the module).

    ``c``: the workers' CPU per step and its interval; per measured step: ``cpu``, the main
    process's CPU, ``spans``, its wall time, ``own_cpu`` and ``work``, the same less receiving
    batches (for the cores the step keeps busy); ``cores``: available; ``threads``: torch's;
    ``idle_seen``: the idle core time per step that /proc/stat counted over the window, where read
    (:mod:`hasten.profile.inject.cpu_window`): the idle time is never more than that (other jobs
    took the rest: tests/profile_scripts/pinned_workers.py on a core half taken by another job read
    76 ms "idle" a step from its own numbers and ``cores``, the probe's, where /proc saw none);
    ``queued``: per measured step, the loop thread's run-queue wait in its work (where read), and
    ``others``: other processes' CPU per step over the window, for ``held`` (see the module)."""
    if not spans or sum(spans) <= 0 or sum(work) <= 0 or cores <= 0:
        return {}
    n = len(spans)
    left = [cores * t - u - c[0] for t, u in zip(spans, cpu)]  # core-seconds idle in each step, workers and all
    idle = sum(left) / n
    half = t_quantile(0.975, n - 1) * math.sqrt(sum((x - idle) ** 2 for x in left) / (n - 1) / n) if n > 1 else 0.0
    if idle_seen is not None:
        idle = min(idle, max(0.0, idle_seen))
    k = min(cores, sum(own_cpu) / sum(work))
    rate = min(1.0, cores / max(1, threads))

    def lost(c_: float, idle_: float) -> float:
        return max(0.0, c_ - max(0.0, idle_))

    # Work that divides freely over the k cores it keeps busy loses a k-th of a second taken; never less than a
    # thread's own share of a core (one thread on 0.4 of a core loses 2.5 s of its wall time per second taken).
    busy = max(rate, k)
    held = held_by_workers(queued, c[0], others)
    point = max(held, (lost(c[0], idle) / busy + lost(c[0], idle) / rate) / 2)
    lo = max(held, lost(c[1], idle + half) / busy)
    hi = max(held, lost(c[2], idle - half) / rate)
    return {"delay_s": point, "delay_interval_s": (min(lo, point), max(hi, point)), "step_cores": k,
            "idle_core_s": max(0.0, idle), "idle_core_interval_s": (max(0.0, idle - half), max(0.0, idle + half)),
            "lost_s": lost(c[0], idle), "held_s": held, "thread_rate": rate}


def held_by_workers(queued: list[float] | None, c: float, others: float) -> float:
    """The loop thread's run-queue wait per step that the workers account for: the mean wait times their
    share of the CPU that competed for the cores (``c`` theirs, ``others`` other processes', per step)."""
    if not queued or c <= 0:
        return 0.0
    return max(0.0, sum(queued) / len(queued)) * c / (c + max(0.0, others))
