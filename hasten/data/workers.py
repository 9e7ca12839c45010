"""One pool of decode worker processes: results in order, bounded read-ahead, fast failure.

Every parallel decode in hasten goes through ``ordered_map``: the image-folder
reader (``hasten.data.image_folder``: chunks of file bytes as they come out of
the archive, so decompression overlaps decoding) and the streaming pipeline
(``hasten.stream.shard_loader``: chunks of shard records, their bytes in shared
memory or left in their files for the worker to read).

A feeder thread draws tasks from the caller's iterable, which may itself be slow
(reading an archive, waiting on storage), and hands them to the worker
processes at most ``prefetch`` ahead of the consumer, which receives the results
in task order. An exception raised by the function or by the task iterable is
re-raised in the consumer. A worker process that dies (killed, out of memory, a
crash in a native decoder) makes the iterator raise ``DecodeWorkerError`` within
about ``poll_s`` seconds instead of waiting forever for its result; a worker whose
parent dies without stopping it (killed outright) exits within ``PARENT_CHECK_S``.
``workers=0`` runs the function in the feeder thread: no processes (inside a
DataLoader worker, for small jobs, and to see where a crash happens).

Processes start by ``fork`` on Linux (milliseconds; the parent's memory, such as
a memory-mapped record store, is shared rather than copied) and by ``spawn``
elsewhere, where forking a process that runs threads is not safe.

Changes the training math: no.
"""

from __future__ import annotations

import multiprocessing as mp
import gc
import pickle
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from hasten.errors import HastenError

T = TypeVar("T")
R = TypeVar("R")

WORKER_NAME = "hasten-decode"  # process names: hasten-decode-0, hasten-decode-1, ...
PARENT_CHECK_S = 1.0  # an idle worker checks this often that its parent is alive (it exits if not)
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # blocked while a worker starts, until it has its own handlers


class DecodeWorkerError(HastenError, RuntimeError):
    """A decode worker process died; the results it was computing are lost."""


def default_start_method() -> str:
    return "fork" if sys.platform == "linux" else "spawn"


def ordered_map(
    fn: Callable[[T], R],
    tasks: Iterable[T],
    *,
    workers: int = 0,
    prefetch: int = 4,
    poll_s: float = 0.2,
    mp_context: str | None = None,
) -> Iterator[R]:
    """``fn(task)`` for each of ``tasks``, in order, computed in ``workers`` processes
    (0: in a thread of this process) at most ``prefetch`` tasks ahead of the consumer.

    With ``spawn`` (``mp_context``, or the default off Linux), ``fn`` and the tasks
    must pickle. Arguments are checked here, before any process starts.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an integer >= 0 (0 = decode in a thread); got {workers!r}")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise ValueError(f"prefetch must be an integer >= 1 (tasks read ahead); got {prefetch!r}")
    if not poll_s > 0:
        raise ValueError(f"poll_s must be > 0 (seconds between checks on the workers); got {poll_s!r}")
    ctx = mp.get_context(mp_context or default_start_method())
    return _OrderedMap(fn, tasks, workers, prefetch, poll_s, ctx).run()


class _Failure:
    """An exception on its way to the consumer (a result could be an exception object)."""

    def __init__(self, exc: BaseException):
        try:
            pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - an unpicklable one would be lost in the queue, and the consumer hang
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        self.exc = exc


def _start_without_stop_signals(p) -> None:
    """Start worker ``p`` with SIGINT and SIGTERM blocked, so that a stop signal sent to the
    process group while it starts waits instead of reaching the new worker before it has set its
    own handlers: a CI run saw a Ctrl-C make such a worker exit 1 (the run then ended as "a decode
    worker process died"), and another a SIGTERM raise the parent's inherited exception in the
    worker's bootstrap (a traceback above the one line of the stop). The parent's own pending
    signal runs its handler once the mask is restored."""
    if not hasattr(signal, "pthread_sigmask"):
        p.start()
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        p.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _worker_main(fn, tasks, results) -> None:
    # Ctrl-C is the parent's to handle; a worker just stops when told to. A forked worker
    # inherits the parent's SIGTERM handler, which raises an exception for the parent to
    # report; here it would print a traceback per worker when the whole process group is
    # stopped (timeout, Slurm): the default action exits quietly. Both signals start blocked
    # (_start_without_stop_signals) and are unblocked once handled: a pending SIGINT is
    # dropped, a pending SIGTERM ends the worker quietly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    # The stop signal only comes once the consumer has everything it wants, so a
    # worker may exit without flushing results nobody will read.
    results.cancel_join_thread()
    # Everything inherited from the parent (torch's modules: hundreds of thousands of
    # objects) stays out of the garbage collector's view (frozen before the fork, and here
    # for spawn): otherwise the collections that a decode loop's allocations trigger walk
    # all of it (13% of a decode worker's CPU).
    gc.freeze()
    parent = mp.parent_process()
    while True:
        try:
            task = tasks.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            # A parent killed outright (SIGKILL, the OOM killer, a test runner's worker dying)
            # never tells its workers to stop, and its daemon flag only acts at its own exit: a
            # worker waiting here without a timeout sat on the task queue's lock for half an
            # hour, ignoring Ctrl-C, after its parent was gone.
            if parent is not None and not parent.is_alive():
                return
            continue
        if task is None:
            return
        number, item = task
        try:
            results.put((number, fn(item)))
        except Exception as e:  # noqa: BLE001 - sent to the consumer, which raises it
            results.put((number, _Failure(e)))


class _OrderedMap:
    def __init__(self, fn, tasks, workers, prefetch, poll_s, ctx):
        self.fn, self.tasks, self.workers = fn, tasks, workers
        self.poll_s, self.ctx = poll_s, ctx
        self.stop = threading.Event()
        self.slots = threading.Semaphore(prefetch)
        self.n_tasks: int | None = None  # set by the feeder once it has drawn every task

    def _feed(self, put: Callable[[int, object], None], failures: queue.Queue) -> None:
        number = 0
        try:
            for item in self.tasks:
                while not self.slots.acquire(timeout=self.poll_s):
                    if self.stop.is_set():
                        return
                if self.stop.is_set():
                    return
                put(number, item)
                number += 1
            self.n_tasks = number
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer thread
            failures.put(_Failure(e))

    def run(self) -> Iterator:
        failures: queue.Queue = queue.Queue()
        procs = []
        if self.workers == 0:
            results: queue.Queue = queue.Queue()

            def put(number, item):
                try:
                    results.put((number, self.fn(item)))
                except Exception as e:  # noqa: BLE001 - sent to the consumer, which raises it
                    results.put((number, _Failure(e)))
        else:
            tasks = self.ctx.Queue()
            results = self.ctx.Queue()
            if self.ctx.get_start_method() == "fork":
                # Python's advice for fork without exec (gc.freeze's documentation): what exists
                # now leaves the collector's view before the workers inherit it. In this process
                # too, where the loader's own allocations (records, tuples) otherwise trigger full
                # collections over every object of torch: 41% of a ShardLoader's own CPU.
                gc.freeze()
            for k in range(self.workers):
                p = self.ctx.Process(target=_worker_main, args=(self.fn, tasks, results), daemon=True,
                                     name=f"{WORKER_NAME}-{k}")
                _start_without_stop_signals(p)
                procs.append(p)

            def put(number, item):
                tasks.put((number, item))

        feeder = threading.Thread(target=self._feed, args=(put, failures), daemon=True, name=f"{WORKER_NAME}-feeder")
        feeder.start()
        pending: dict[int, object] = {}
        number = 0
        try:
            while self.n_tasks is None or number < self.n_tasks:
                while number not in pending:
                    if not failures.empty():
                        raise failures.get().exc
                    if self.n_tasks is not None and number >= self.n_tasks:
                        return
                    try:
                        got, result = results.get(timeout=self.poll_s)
                    except queue.Empty:
                        _check_alive(procs)
                        continue
                    if isinstance(result, _Failure):
                        raise result.exc
                    pending[got] = result
                result = pending.pop(number)
                # A dead worker may have taken a task with it: stop now rather than at the gap.
                _check_alive(procs)
                number += 1
                self.slots.release()
                yield result
        finally:
            self.stop.set()
            if procs:
                tasks.cancel_join_thread()
                for _ in procs:
                    tasks.put(None)
                for p in procs:
                    p.join(timeout=0.5)
                    if p.is_alive():
                        p.terminate()
                        p.join(timeout=1.0)
            feeder.join(timeout=2 * self.poll_s + 1)


def _check_alive(procs) -> None:
    for k, p in enumerate(procs):
        if p.exitcode is not None:
            stopped = p.exitcode in (-signal.SIGTERM, -signal.SIGINT)
            if stopped and threading.current_thread() is threading.main_thread():
                # Sent to the whole process group (timeout, Slurm, a terminal), the signal
                # reaches this process too: give its handler the moment it needs to stop
                # the run with its own message rather than this one.
                time.sleep(0.5)
            how = (f"killed by signal {signal.Signals(-p.exitcode).name}" if p.exitcode < 0
                   else f"exit code {p.exitcode}")
            raise DecodeWorkerError(f"a decode worker process died (worker {k}, pid {p.pid}, {how}): out of memory, "
                                    "or a crash inside an image decoder? Fewer workers need less memory; decoding "
                                    "without worker processes shows where a decoder crashes")
