"""ordered_map: the one decode worker pool (ordered results, bounded read-ahead, fast failure)."""

import multiprocessing as mp
import os
import signal
import time

import pytest

from hasten.data.workers import DecodeWorkerError, ordered_map


def _slow_square(x):
    time.sleep(0.05 * (x % 3))  # later tasks often finish first
    return x * x, os.getpid()


def _fail_on_three(x):
    if x == 3:
        raise KeyError(f"task {x}")
    return x


def _sleep(x):
    time.sleep(0.2)
    return x


@pytest.mark.parametrize("workers", [0, 2])
def test_results_come_in_task_order(workers):
    out = list(ordered_map(_slow_square, range(12), workers=workers, prefetch=4))
    assert [r for r, _ in out] == [x * x for x in range(12)]
    pids = {pid for _, pid in out}
    assert (pids == {os.getpid()}) if workers == 0 else (os.getpid() not in pids)


@pytest.mark.parametrize("workers", [0, 2])
def test_errors_of_the_function_and_of_the_tasks_reach_the_consumer(workers):
    with pytest.raises(KeyError, match="task 3"):
        list(ordered_map(_fail_on_three, range(6), workers=workers))

    def tasks():
        yield 1
        raise OSError("the archive ended early")

    with pytest.raises(OSError, match="ended early"):
        list(ordered_map(_fail_on_three, tasks(), workers=workers))


def test_read_ahead_is_bounded_by_prefetch():
    drawn = []

    def tasks():
        for i in range(100):
            drawn.append(i)
            yield i

    it = ordered_map(_fail_on_three, tasks(), workers=0, prefetch=3)
    assert next(it) == 0
    time.sleep(0.3)
    assert len(drawn) <= 1 + 3 + 1  # the one consumed, three ahead, one waiting for a slot
    it.close()


def test_a_killed_worker_raises_within_seconds():
    it = ordered_map(_sleep, range(50), workers=2, prefetch=4, poll_s=0.1)
    next(it)
    worker = next(p for p in mp.active_children() if p.name.startswith("hasten-decode-"))
    os.kill(worker.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(DecodeWorkerError, match="SIGKILL"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 5
    assert not [p for p in mp.active_children() if p.name.startswith("hasten-decode-")]


@pytest.mark.parametrize("kwargs,match", [(dict(workers=-1), "workers"), (dict(workers=True), "workers"),
                                          (dict(prefetch=0), "prefetch"), (dict(poll_s=0), "poll_s")])
def test_bad_arguments_are_refused_before_any_process_starts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ordered_map(_sleep, range(3), **kwargs)


_ORPHAN_PARENT = """
import multiprocessing as mp, sys, time
from hasten.data.workers import ordered_map

def tasks():
    yield 1
    time.sleep(600)  # no more tasks: the workers wait on the task queue

def square(x):
    return x * x

it = ordered_map(square, tasks(), workers=2, prefetch=2)
next(it)
print(" ".join(str(p.pid) for p in mp.active_children() if p.name.startswith("hasten-decode-")), flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"  # (a zombie has exited)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
def test_workers_exit_when_their_parent_is_killed_outright():
    """A parent killed with SIGKILL cannot stop its workers; each notices on its own."""
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(_running(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30  # PARENT_CHECK_S is 1 s; the margin is for a loaded machine
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _running(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)  # (not left behind by a failing run)
    assert not left, f"decode workers {left} outlived their killed parent"


_SIGTERM_AT_START = """
import multiprocessing as mp, os, signal, sys
from hasten.data import workers

def raise_stop(signum, frame):  # what hasten's commands install (hasten.distributed.faults)
    raise RuntimeError("the parent's stop exception, raised in a worker")

def hit_while_starting(fn, tasks, results):
    # The group's SIGTERM lands after the fork, before the worker has its own handlers
    # (a CI run saw it in multiprocessing's bootstrap): sent here, at the same point.
    os.kill(os.getpid(), signal.SIGTERM)
    workers._worker_main(fn, tasks, results)

signal.signal(signal.SIGTERM, raise_stop)
ctx = mp.get_context("fork")
p = ctx.Process(target=hit_while_starting, args=(abs, ctx.Queue(), ctx.Queue()), daemon=True)
workers._start_without_stop_signals(p)
p.join(30)
print(p.exitcode)
"""


def test_a_sigterm_while_a_worker_starts_ends_it_quietly():
    """The parent's SIGTERM handler, inherited through fork, must not run in a starting worker:
    it waits blocked until the worker has the default action, then ends it without a word."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _SIGTERM_AT_START], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(-signal.SIGTERM)]
    assert "Traceback" not in run.stderr, run.stderr
